//! Native file dialogs (rfd), the plugin approval dialog and the About box. File dialogs
//! block the UI thread while open, as native modal dialogs do; the job thread keeps working.

use crate::document::{Document, Level};
use crate::ui::ViewState;
use egui::{Context, RichText};
use std::path::Path;

const CHECKPOINTS: &[&str] = &["safetensors"];
const PROJECTS: &[&str] = &["msproj", "json"];

/// Whether `path` is a shared library (by extension: a dropped plugin may have any name).
pub fn is_library(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["so", "dylib", "dll"].contains(&e.to_ascii_lowercase().as_str()))
}

/// Adds a checkpoint or sharded folder as an expert; a shared library is offered as a plugin
/// and a mergekit configuration (.yml) is opened as a recipe.
pub fn add_path(doc: &mut Document, view: &mut ViewState, path: &Path) {
    if is_library(path) {
        request_plugin(doc, view, path);
    } else if mergescope_interop::mergekit::is_mergekit_config(path) {
        doc.open_recipe(path);
    } else if !doc.inputs.add_expert(path, None) {
        view.toast(format!("'{}' is already an input", path.display()));
    } else {
        doc.dirty = true;
    }
}

/// Asks for the base checkpoint.
pub fn pick_base(doc: &mut Document) {
    if let Some(p) = rfd::FileDialog::new()
        .set_title("Base checkpoint")
        .add_filter("safetensors", CHECKPOINTS)
        .pick_file()
    {
        doc.inputs.set_base(&p, None);
        doc.dirty = true;
    }
}

/// Asks for expert checkpoints (several at once).
pub fn pick_experts(doc: &mut Document) {
    if let Some(files) = rfd::FileDialog::new()
        .set_title("Expert checkpoints")
        .add_filter("safetensors", CHECKPOINTS)
        .pick_files()
    {
        for f in files {
            doc.inputs.add_expert(&f, None);
        }
        doc.dirty = true;
    }
}

/// Asks for a folder of shards (with `model.safetensors.index.json`) to add as an expert.
pub fn pick_expert_folder(doc: &mut Document) {
    if let Some(dir) = rfd::FileDialog::new()
        .set_title("Sharded expert checkpoint (folder)")
        .pick_folder()
    {
        doc.inputs.add_expert(&dir, None);
        doc.dirty = true;
    }
}

/// Asks for a suite file (`.toml`) to evaluate merges with.
pub fn pick_suite(doc: &mut Document) {
    if let Some(file) = rfd::FileDialog::new()
        .set_title("Suite file")
        .add_filter("suite", &["toml"])
        .pick_file()
    {
        doc.use_suite(&file);
    }
}

/// Asks for a recipe (mergescope TOML or mergekit YAML) and opens it.
pub fn pick_recipe(doc: &mut Document) {
    if let Some(file) = rfd::FileDialog::new()
        .set_title("Recipe (mergescope .toml or mergekit .yml)")
        .add_filter("recipe", &["toml", "yml", "yaml"])
        .pick_file()
    {
        doc.open_recipe(&file);
    }
}

/// Loads a plugin now, or asks for approval first when it comes from outside the app.
pub fn request_plugin(doc: &mut Document, view: &mut ViewState, path: &Path) {
    if doc.needs_approval(path) {
        view.approval = Some(path.to_path_buf());
    } else if let Err(e) = doc.load_plugin_file(path, false) {
        doc.note(Level::Error, &e);
        view.toast(&e);
    }
}

/// Asks for a plugin library.
pub fn pick_plugin(doc: &mut Document, view: &mut ViewState) {
    let ext: &[&str] = &["so", "dylib", "dll"];
    if let Some(p) = rfd::FileDialog::new()
        .set_title("Load a method plugin")
        .add_filter("plugin library", ext)
        .pick_file()
    {
        request_plugin(doc, view, &p);
    }
}

/// Asks where to save run `id` and saves it there with its recipe.
pub fn save_merge(doc: &mut Document, id: u64) {
    let name = doc
        .run_record(id)
        .map(|r| format!("merged-{}-{}.safetensors", r.method, r.id))
        .unwrap_or_default();
    if let Some(dest) = rfd::FileDialog::new()
        .set_title("Save the merged checkpoint")
        .set_file_name(name)
        .add_filter("safetensors", CHECKPOINTS)
        .save_file()
        && let Err(e) = doc.save_output(id, &dest)
    {
        doc.note(Level::Error, e);
    }
}

/// Asks where to write the results table as CSV.
pub fn export_csv(doc: &mut Document) {
    if let Some(dest) = rfd::FileDialog::new()
        .set_title("Export the results table")
        .set_file_name("mergescope-results.csv")
        .add_filter("CSV", &["csv"])
        .save_file()
    {
        let csv = crate::runs::to_csv(&doc.runs);
        match mergescope_engine::writer::write_atomic(&dest, csv.as_bytes()) {
            Ok(()) => doc.note(Level::Info, format!("results exported to '{}'", dest.display())),
            Err(e) => doc.note(Level::Error, e.to_string()),
        }
    }
}

/// Asks for a project file to open.
pub fn pick_project_to_open() -> Option<std::path::PathBuf> {
    rfd::FileDialog::new()
        .set_title("Open a mergescope project")
        .add_filter("mergescope project", PROJECTS)
        .pick_file()
}

/// Asks where to save the project.
pub fn pick_project_to_save() -> Option<std::path::PathBuf> {
    rfd::FileDialog::new()
        .set_title("Save the mergescope project")
        .set_file_name("session.msproj")
        .add_filter("mergescope project", PROJECTS)
        .save_file()
}

/// The approval dialog for a plugin from outside the app's folder.
pub fn approval_ui(ctx: &Context, doc: &mut Document, view: &mut ViewState) {
    let Some(path) = view.approval.clone() else {
        return;
    };
    let mut close = false;
    let modal = egui::Modal::new(egui::Id::unique("approve-plugin")).show(ctx, |ui| {
        ui.set_max_width(480.0);
        ui.heading("Load a plugin from outside mergescope?");
        ui.label("This library is not one of mergescope's own plugins:");
        ui.label(RichText::new(path.display().to_string()).monospace());
        ui.label(
            "A plugin is native code that runs with your permissions. Approve it only if you trust \
             where it comes from. mergescope remembers the approval for this exact file; if the \
             file changes, it asks again.",
        );
        ui.horizontal(|ui| {
            if ui.button("Approve and load").clicked() {
                if let Err(e) = doc.load_plugin_file(&path, true) {
                    doc.note(Level::Error, format!("plugin not loaded: {e}"));
                    view.toast(format!("plugin not loaded: {e}"));
                }
                close = true;
            }
            if ui.button("Cancel").clicked() {
                close = true;
            }
        });
    });
    if close || modal.should_close() {
        view.approval = None;
    }
}

/// The About box.
pub fn about_ui(ctx: &Context, view: &mut ViewState) {
    let mut open = view.about;
    egui::Window::new("About mergescope")
        .open(&mut open)
        .collapsible(false)
        .resizable(false)
        .anchor(egui::Align2::CENTER_CENTER, [0.0, 0.0])
        .show(ctx, |ui| {
            ui.heading(format!("mergescope {}", env!("CARGO_PKG_VERSION")));
            ui.label("A workbench for model merging: methods as plugins, merges you can see.");
            ui.separator();
            egui::Grid::new("versions").show(ui, |ui| {
                ui.label("Plugin ABI");
                ui.label(format!(
                    "{}.{}",
                    mergescope_plugin_api::abi::ABI_MAJOR,
                    mergescope_plugin_api::abi::ABI_MINOR
                ));
                ui.end_row();
                ui.label("GUI");
                ui.label("egui 0.37 on wgpu");
                ui.end_row();
                ui.label("Tensors");
                ui.label(format!(
                    "candle (CPU{}{})",
                    if cfg!(feature = "cuda") { ", CUDA" } else { "" },
                    if cfg!(feature = "metal") { ", Metal" } else { "" }
                ));
                ui.end_row();
            });
        });
    view.about = open;
}

/// Saves the analysis figure shown as PNG (`png`) or CSV, where the user picks.
pub fn export_figure(doc: &mut Document, png: bool) {
    let Some(figure) = doc.analysis.figure.clone() else {
        return;
    };
    let name = format!("mergescope-{}", doc.analysis.kind.label());
    save_figure(doc, &figure, &name, png);
}

/// `label` as a file name anyone can type: lowercase ASCII words joined by '-' ("CART rank × λ"
/// is "cart-rank-x-lambda").
pub fn file_slug(label: &str) -> String {
    let spelled = label.replace('×', " x ").replace('λ', " lambda ").replace('/', " ");
    spelled
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join("-")
}

/// Saves `figure` as PNG (`png`) or CSV where the user picks (`name` is the suggested file
/// name, without extension, made typeable by [`file_slug`]); the outcome goes to the log.
pub fn save_figure(doc: &mut Document, figure: &mergescope_figures::Figure, name: &str, png: bool) {
    let (ext, what) = if png {
        ("png", "PNG picture")
    } else {
        ("csv", "CSV numbers")
    };
    let Some(dest) = rfd::FileDialog::new()
        .set_title(format!("Save the figure as {what}"))
        .set_file_name(format!("{}.{ext}", file_slug(name)))
        .add_filter(what, &[ext])
        .save_file()
    else {
        return;
    };
    let bytes = if png {
        match mergescope_figures::render_png(figure, 1200, 860) {
            Ok(b) => b,
            Err(e) => return doc.note(Level::Error, e.to_string()),
        }
    } else {
        mergescope_figures::to_csv(figure).into_bytes()
    };
    match mergescope_engine::writer::write_atomic(&dest, &bytes) {
        Ok(()) => doc.note(Level::Info, format!("figure saved to '{}'", dest.display())),
        Err(e) => doc.note(Level::Error, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::file_slug;

    #[test]
    fn figure_file_names_are_plain_ascii_words() {
        assert_eq!(file_slug("mergescope-CART rank × λ"), "mergescope-cart-rank-x-lambda");
        assert_eq!(file_slug("mergescope-R(k) / I(k)"), "mergescope-r-k-i-k");
        assert_eq!(file_slug("sweep-paper-002-loss_vs_K"), "sweep-paper-002-loss-vs-k");
    }
}

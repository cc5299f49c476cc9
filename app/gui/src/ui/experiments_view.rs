//! The Experiments window: a fine-tuning sweep (seed 002) specified in a compact form, run
//! off the UI thread with progress, Cancel and Resume, and its scaling plots filling in as
//! cells finish: accuracy and loss per swept variable with standard-error bars, the fitted
//! laws, and the paper's prediction with each method's verdict. The cells run here or on a
//! Slurm cluster (the Executor choice), whose job the window follows.

use crate::document::{Document, Level};
use crate::experiments::{BUILD_TEXT_HINT, ExecutorKind, SlurmStatus, benchmark_id, known_text_builds, short_label};
use crate::text::time_text;
use crate::ui::{dialogs, figure_view};
use egui::{Context, RichText, Ui};
use mergescope_lab::nn::Arch;
use mergescope_studies::scaling::fit::Direction;
use mergescope_studies::scaling::sweep::spec::{Aggregate, Mode};
use mergescope_studies::scaling::sweep::{SweepSpec, Variable, is_text_build};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Width of the specification column.
const FORM_WIDTH: f32 = 390.0;

/// The Experiments window, when open.
pub fn experiments_window(ctx: &Context, doc: &mut Document) {
    let mut open = doc.experiments.open;
    egui::Window::new("Experiments: fine-tuning sweeps")
        .open(&mut open)
        .default_pos([16.0, 32.0])
        .default_size([1320.0, 740.0])
        .resizable(true)
        .show(ctx, |ui| {
            ui.horizontal_top(|ui| {
                ui.vertical(|ui| {
                    ui.set_width(FORM_WIDTH);
                    egui::ScrollArea::vertical()
                        .id_salt("sweep-form")
                        .auto_shrink([false, true])
                        .show(ui, |ui| form_ui(ui, doc));
                });
                ui.separator();
                ui.vertical(|ui| {
                    run_ui(ui, doc);
                    ui.separator();
                    results_ui(ui, doc);
                });
            });
        });
    doc.experiments.open = open;
    if doc.experiments.running() {
        // Elapsed times tick even when no progress comes.
        ctx.request_repaint_after(Duration::from_millis(250));
    }
}

fn installed(doc: &Document) -> Vec<String> {
    doc.registry.plugins.iter().map(|p| p.id().to_owned()).collect()
}

/// The specification: preset, benchmark, folder, TOML, executor, hyperparameters, evaluation,
/// methods.
fn form_ui(ui: &mut Ui, doc: &mut Document) {
    let running = doc.experiments.running();
    ui.add_enabled_ui(!running, |ui| {
        let before = doc.experiments.spec.clone();
        source_ui(ui, doc);
        ui.separator();
        executor_ui(ui, doc);
        ui.separator();
        hyper_ui(ui, doc);
        ui.separator();
        evaluation_ui(ui, &mut doc.experiments.spec);
        ui.separator();
        methods_ui(ui, doc);
        if doc.experiments.spec != before {
            doc.experiments.reanalyse();
        }
    });
    ui.add_space(4.0);
    let ids = installed(doc);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let e = &doc.experiments;
    match e.check(doc.benchmark.as_ref(), &ids) {
        Ok(()) => {
            let swept: Vec<&str> = e.spec.swept().into_iter().map(short_label).collect();
            ui.label(
                RichText::new(format!(
                    "{} sweep points; swept: {}",
                    e.spec.points().len(),
                    if swept.is_empty() {
                        "nothing".to_owned()
                    } else {
                        swept.join(", ")
                    }
                ))
                .weak(),
            );
        }
        // A grid that does not parse is already named under the grids.
        Err(_) if e.grids.iter().any(|g| g.error.is_some()) => {}
        Err(why) => {
            ui.label(RichText::new(why.to_string()).color(ui.visuals().error_fg_color));
        }
    }
}

/// Preset, benchmark, folder, and the TOML file.
fn source_ui(ui: &mut Ui, doc: &mut Document) {
    ui.horizontal(|ui| {
        let label = ui.label("Preset");
        let mut chosen = None;
        egui::ComboBox::from_id_salt("sweep-preset")
            .selected_text(doc.experiments.name.clone())
            .show_ui(ui, |ui| {
                for p in SweepSpec::PRESETS {
                    if ui.selectable_label(doc.experiments.name == p, p).clicked() {
                        chosen = Some(p);
                    }
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text("Seed 002's protocol scaled to the demo benchmark; choosing it resets the form");
        if ui
            .small_button("Reset")
            .on_hover_text("Back to the preset's values")
            .clicked()
        {
            chosen = Some(SweepSpec::PRESETS[0]);
        }
        if let Some(p) = chosen {
            let ids = installed(doc);
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            doc.experiments.reset_to_preset(p, doc.benchmark.as_ref(), &ids);
        }
    });
    benchmark_row(ui, doc);
    ui.horizontal(|ui| {
        ui.label("Folder");
        ui.label(RichText::new(doc.experiments.folder_label()).monospace())
            .on_hover_text(doc.experiments.folder.display().to_string());
        if ui
            .small_button("Folder…")
            .on_hover_text("Where the results, checkpoints and plots go; a folder with results resumes")
            .clicked()
            && let Some(dir) = rfd::FileDialog::new()
                .set_title("Sweep folder")
                .set_directory(doc.experiments.sweeps_root())
                .pick_folder()
        {
            doc.experiments.set_folder(dir);
        }
    });
    ui.horizontal(|ui| {
        if ui.button("Load TOML…").clicked() {
            load_toml(doc);
        }
        if ui.button("Save TOML…").clicked() {
            save_toml(doc);
        }
    });
}

/// The benchmark list's entry for the text benchmark when none is built: how to make one.
const NO_TEXT_BUILD: &str = "text · none built: Benchmark > Build text benchmark makes one";

/// What the benchmark control picked.
enum BenchPick {
    /// The open demo benchmark.
    Open,
    /// The cache's demo build of an architecture.
    Demo(Arch),
    /// A text benchmark build.
    Text(PathBuf),
}

fn folder_name(dir: &Path) -> String {
    dir.file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn text_entry(dir: &Path) -> String {
    format!("text · all-MiniLM-L6-v2 ({})", folder_name(dir))
}

/// The sweep's benchmark: the open demo benchmark, the cache's build of an image architecture,
/// or a text benchmark build (the open suite's, or the cache's); without a text build its list
/// says how to make one (and a text sweep without its build says so under the form).
fn benchmark_row(ui: &mut Ui, doc: &mut Document) {
    let texts = known_text_builds(doc.suite.as_deref());
    let e = &doc.experiments;
    let open = doc.benchmark.as_ref();
    let open_chosen = open.filter(|b| benchmark_id(b) == e.spec.benchmark && !e.is_text());
    let text_dir = e.text_dir();
    let selected = match (open_chosen, &text_dir) {
        (Some(b), _) => format!(
            "{} seed {} · {} tasks ({})",
            b.manifest.arch,
            b.manifest.seed,
            b.manifest.tasks.len(),
            folder_name(&b.dir)
        ),
        (None, Some(dir)) if is_text_build(dir) => text_entry(dir),
        (None, _) => format!("{} ({})", e.spec.benchmark, e.spec.arch),
    };
    let mut pick = None;
    ui.horizontal_wrapped(|ui| {
        let label = ui.label("Benchmark");
        egui::ComboBox::from_id_salt("sweep-benchmark")
            .selected_text(selected)
            .width(300.0)
            .show_ui(ui, |ui| {
                if let Some(b) = open {
                    let text = format!("{} seed {} (the open benchmark)", b.manifest.arch, b.manifest.seed);
                    if ui
                        .selectable_label(open_chosen.is_some(), text)
                        .on_hover_text(b.dir.display().to_string())
                        .clicked()
                    {
                        pick = Some(BenchPick::Open);
                    }
                }
                for arch in Arch::ALL {
                    let on = !e.is_text() && open_chosen.is_none() && e.spec.arch == arch.name();
                    if ui
                        .selectable_label(on, format!("{arch} (the cache's demo build)"))
                        .clicked()
                    {
                        pick = Some(BenchPick::Demo(arch));
                    }
                }
                for dir in &texts {
                    let on = text_dir.as_deref().is_some_and(|d| d == dir.as_path());
                    if ui
                        .selectable_label(on, text_entry(dir))
                        .on_hover_text(dir.display().to_string())
                        .clicked()
                    {
                        pick = Some(BenchPick::Text(dir.clone()));
                    }
                }
                if texts.is_empty() {
                    ui.add_enabled(false, egui::Button::new(NO_TEXT_BUILD).frame(false))
                        .on_disabled_hover_text(BUILD_TEXT_HINT);
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text("What the sweep fine-tunes and scores: a demo benchmark of an image architecture, or the text benchmark");
    });
    if let Some(p) = pick {
        let ids = installed(doc);
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        match p {
            BenchPick::Open => {
                if let Some(b) = doc.benchmark.clone() {
                    doc.experiments.use_demo_benchmark(b.manifest.arch, Some(&b), &ids);
                }
            }
            BenchPick::Demo(arch) => doc.experiments.use_demo_benchmark(arch, None, &ids),
            BenchPick::Text(dir) => doc.experiments.use_text_benchmark(&dir.display().to_string(), &ids),
        }
    }
}

fn load_toml(doc: &mut Document) {
    let Some(path) = rfd::FileDialog::new()
        .set_title("Load a sweep specification")
        .add_filter("TOML", &["toml"])
        .pick_file()
    else {
        return;
    };
    match doc.experiments.load_toml(&path) {
        Ok(()) => doc.note(
            Level::Info,
            format!("sweep specification read from '{}'", path.display()),
        ),
        Err(e) => doc.experiments.error = Some(e.to_string()),
    }
}

fn save_toml(doc: &mut Document) {
    let Some(path) = rfd::FileDialog::new()
        .set_title("Save the sweep specification")
        .set_file_name(format!("{}.toml", doc.experiments.name))
        .add_filter("TOML", &["toml"])
        .save_file()
    else {
        return;
    };
    match doc.experiments.save_toml(&path) {
        Ok(()) => doc.note(
            Level::Info,
            format!("sweep specification saved to '{}'", path.display()),
        ),
        Err(e) => doc.experiments.error = Some(e.to_string()),
    }
}

/// The default of `var` as a widget labelled `label`.
fn default_widget(ui: &mut Ui, spec: &mut SweepSpec, var: Variable, label: egui::Id, pool: usize) {
    let d = &mut spec.defaults;
    let r = match var {
        Variable::LearningRate => ui.add(
            egui::DragValue::new(&mut d.lr)
                .speed(1e-5)
                .range(1e-7..=1.0)
                .max_decimals(6),
        ),
        Variable::Batch => ui.add(egui::DragValue::new(&mut d.batch).range(1..=4096)),
        Variable::Steps => ui.add(egui::DragValue::new(&mut d.steps).range(1..=1_000_000)),
        Variable::DataRatio => ui.add(egui::DragValue::new(&mut d.data_ratio).speed(0.01).range(0.01..=1.0)),
        Variable::Tasks => ui.add(egui::DragValue::new(&mut d.tasks).range(1..=pool.max(1))),
        Variable::Optimizer => {
            egui::ComboBox::from_id_salt("sweep-optimizer")
                .selected_text(d.optimizer.clone())
                .width(80.0)
                .show_ui(ui, |ui| {
                    for o in ["sgd", "momentum", "adamw"] {
                        ui.selectable_value(&mut d.optimizer, o.to_owned(), o);
                    }
                })
                .response
        }
    };
    r.labelled_by(label);
}

/// The hyperparameters: each one's default and the values its grid tries.
fn hyper_ui(ui: &mut Ui, doc: &mut Document) {
    let pool = doc
        .benchmark
        .as_ref()
        .filter(|_| !doc.experiments.is_text())
        .map_or(64, |b| b.manifest.tasks.len());
    let e = &mut doc.experiments;
    egui::Grid::new("sweep-hyper")
        .num_columns(3)
        .spacing([8.0, 4.0])
        .show(ui, |ui| {
            ui.label(RichText::new("Hyperparameter").strong());
            ui.label(RichText::new("Default").strong());
            ui.label(RichText::new("Grid (values tried, commas)").strong());
            ui.end_row();
            for i in 0..e.grids.len() {
                let var = e.grids[i].variable;
                let label = ui.label(short_label(var)).on_hover_text(var.label());
                default_widget(ui, &mut e.spec, var, label.id, pool);
                let bad = e.grids[i].error.is_some();
                let mut edit = egui::TextEdit::singleline(&mut e.grids[i].text).desired_width(150.0);
                if bad {
                    edit = edit.text_color(ui.visuals().error_fg_color);
                }
                let r = ui
                    .add(edit)
                    .labelled_by(label.id)
                    .on_hover_text("Empty: only the default");
                if r.changed() {
                    e.apply_grid_text(i);
                }
                ui.end_row();
            }
        });
    for g in &e.grids {
        if let Some(msg) = &g.error {
            ui.label(RichText::new(msg).color(ui.visuals().error_fg_color).small());
        }
    }
}

/// Task groups, seed, mode, aggregation and evaluation size.
fn evaluation_ui(ui: &mut Ui, spec: &mut SweepSpec) {
    ui.horizontal(|ui| {
        let label = ui.label("groups G");
        ui.add(egui::DragValue::new(&mut spec.groups).range(1..=100))
            .labelled_by(label.id)
            .on_hover_text("Random task groups per N; error bars are standard errors over them");
        let label = ui.label("seed");
        ui.add(egui::DragValue::new(&mut spec.seed).range(0..=u64::MAX))
            .labelled_by(label.id);
    });
    ui.horizontal(|ui| {
        ui.label("Mode");
        ui.radio_value(&mut spec.mode, Mode::OneAtATime, "one at a time");
        ui.radio_value(&mut spec.mode, Mode::Grid, "full grid");
    });
    ui.horizontal(|ui| {
        ui.label("Aggregate");
        ui.radio_value(&mut spec.aggregate, Aggregate::Mean, "mean over tasks");
        ui.radio_value(&mut spec.aggregate, Aggregate::Union, "union of test sets");
    });
    ui.horizontal(|ui| {
        let label = ui.label("eval examples / task");
        let mut all = spec.eval_examples.is_none();
        if ui.checkbox(&mut all, "all").changed() {
            spec.eval_examples = if all { None } else { Some(200) };
        }
        if let Some(n) = &mut spec.eval_examples {
            ui.add(egui::DragValue::new(n).range(1..=100_000)).labelled_by(label.id);
        }
    });
}

fn params_text(params: &std::collections::BTreeMap<String, Value>) -> String {
    params
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k} = {s}"),
            v => format!("{k} = {v}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The methods: a checkbox per installed plugin (the preset's label and parameters when it has
/// them); methods of plugins not installed stay listed until unticked.
fn methods_ui(ui: &mut Ui, doc: &mut Document) {
    ui.label(RichText::new("Methods").strong());
    let plugins: Vec<(String, String)> = doc
        .registry
        .by_name()
        .into_iter()
        .map(|p| (p.id().to_owned(), p.info.name.clone()))
        .collect();
    let e = &mut doc.experiments;
    // The chosen methods first, with how the sweep names and sets them; the others in two
    // columns below, so that twenty-odd methods fit the form.
    let (chosen, others): (Vec<_>, Vec<_>) = plugins
        .iter()
        .partition(|(id, _)| e.spec.methods.iter().any(|m| &m.plugin == id));
    for (id, name) in chosen {
        let Some(m) = e.spec.methods.iter().find(|m| &m.plugin == id).cloned() else {
            continue;
        };
        ui.horizontal(|ui| {
            let mut on = true;
            if ui.checkbox(&mut on, name).changed() {
                e.set_method(id, on);
            }
            let mut detail = format!("as '{}'", m.name());
            if !m.params.is_empty() {
                detail.push_str(&format!(": {}", params_text(&m.params)));
            }
            ui.label(RichText::new(detail).weak().small());
        });
    }
    egui::Grid::new("sweep-other-methods").num_columns(2).show(ui, |ui| {
        for (i, (id, name)) in others.into_iter().enumerate() {
            let mut on = false;
            if ui.checkbox(&mut on, name).changed() {
                e.set_method(id, on);
            }
            if i % 2 == 1 {
                ui.end_row();
            }
        }
    });
    let missing: Vec<String> = e
        .spec
        .methods
        .iter()
        .filter(|m| !plugins.iter().any(|(id, _)| *id == m.plugin))
        .map(|m| m.plugin.clone())
        .collect();
    for plugin in missing {
        ui.horizontal(|ui| {
            let mut on = true;
            if ui.checkbox(&mut on, &plugin).changed() {
                e.set_method(&plugin, false);
            }
            ui.label(
                RichText::new("not installed: untick it, or load its plugin")
                    .color(ui.visuals().error_fg_color)
                    .small(),
            );
        });
    }
}

/// A labelled single-line text field of the Slurm form.
fn text_field(ui: &mut Ui, label: &str, value: &mut String, hint: &str, hover: &str) {
    let l = ui.label(label);
    ui.add(egui::TextEdit::singleline(value).hint_text(hint).desired_width(200.0))
        .labelled_by(l.id)
        .on_hover_text(hover);
    ui.end_row();
}

/// Where the cells run: here, or as one Slurm array job with its options.
fn executor_ui(ui: &mut Ui, doc: &mut Document) {
    let e = &mut doc.experiments;
    ui.horizontal(|ui| {
        ui.label(RichText::new("Executor").strong());
        let mut kind = e.executor;
        ui.radio_value(&mut kind, ExecutorKind::Local, "Local")
            .on_hover_text("The cells run in this process, one after another");
        ui.radio_value(&mut kind, ExecutorKind::Slurm, "Slurm")
            .on_hover_text("The missing cells run as one Slurm array job, a task per cell (docs/slurm.md)");
        if kind != e.executor {
            e.set_executor(kind);
        }
    });
    if e.executor != ExecutorKind::Slurm {
        return;
    }
    let f = &mut e.slurm;
    egui::Grid::new("sweep-slurm")
        .num_columns(2)
        .spacing([8.0, 4.0])
        .show(ui, |ui| {
            text_field(
                ui,
                "partition",
                &mut f.partition,
                "cluster default",
                "sbatch --partition",
            );
            text_field(
                ui,
                "time limit",
                &mut f.time,
                "partition's limit",
                "Per cell, as sbatch takes it: 00:30:00 or 1-00:00:00",
            );
            let l = ui.label("CPUs per cell");
            ui.add(egui::DragValue::new(&mut f.cpus_per_cell).range(1..=256))
                .labelled_by(l.id)
                .on_hover_text("sbatch --cpus-per-task; also the cell's thread count");
            ui.end_row();
            let l = ui.label("GPUs per cell");
            ui.add(egui::DragValue::new(&mut f.gpus_per_cell).range(0..=16))
                .labelled_by(l.id)
                .on_hover_text("--gres=gpu:G; 0: none (pick the CUDA device for the cells to use them)");
            ui.end_row();
            let l = ui.label("max parallel cells");
            ui.add(egui::DragValue::new(&mut f.max_parallel).range(0..=10_000))
                .labelled_by(l.id)
                .on_hover_text("--array=…%K; 0: as many as the cluster gives");
            ui.end_row();
            text_field(
                ui,
                "work folder",
                &mut f.workdir,
                "<sweep folder>/slurm",
                "Job file, batch script, logs and cell results; every node must see it at the same path",
            );
            text_field(
                ui,
                "setup line",
                &mut f.setup,
                "e.g. module load cuda",
                "A shell line each cell runs first",
            );
        });
    if let Some(w) = &e.slurm_warning {
        ui.label(RichText::new(w).color(ui.visuals().warn_fg_color).small());
    }
    if let Err(why) = e.slurm.options() {
        ui.label(
            RichText::new(why.to_string())
                .color(ui.visuals().error_fg_color)
                .small(),
        );
    }
}

/// The Slurm job's state: its ids, cells done, running, pending and retried, the executor's
/// events, and at the end the cells that failed with their state, error and log.
fn slurm_status_ui(ui: &mut Ui, s: &SlurmStatus) {
    let jobs = if s.jobs.is_empty() {
        "not submitted yet".to_owned()
    } else {
        format!("job{} {}", if s.jobs.len() == 1 { "" } else { "s" }, s.jobs.join(", "))
    };
    ui.label(RichText::new(format!(
        "Slurm {jobs}: {} / {} cells done ({} reused), {} running, {} pending, {} retried",
        s.done, s.cells, s.reused, s.running, s.pending, s.retried
    )));
    if let Some(t) = s.first_result {
        ui.label(RichText::new(format!("first cell result {t:.1} s after submission")).weak());
    }
    for e in s.events.iter().rev().take(4).rev() {
        ui.label(RichText::new(e).weak().small());
    }
    for f in &s.failures {
        ui.label(RichText::new(f).color(ui.visuals().error_fg_color).small());
    }
}

/// Run, Resume, Cancel, the progress, and how the last sweep ended.
fn run_ui(ui: &mut Ui, doc: &mut Document) {
    let ids = installed(doc);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let running = doc.experiments.running();
    let ready = doc.experiments.check(doc.benchmark.as_ref(), &ids).is_ok();
    let has_results = doc.experiments.has_results();
    ui.horizontal(|ui| {
        let run = ui
            .add_enabled(
                ready && !running,
                egui::Button::new(RichText::new("▶ Run sweep").strong()).min_size(egui::vec2(120.0, 26.0)),
            )
            .on_hover_text("Fine-tune, merge and evaluate every cell into the folder; cells already there are reused");
        let resume = ui
            .add_enabled(ready && !running && has_results, egui::Button::new("⟳ Resume"))
            .on_hover_text("Start again on the same folder: the finished cells are skipped");
        if run.clicked() || resume.clicked() {
            doc.start_sweep();
        }
        if ui
            .add_enabled(running, egui::Button::new("■ Cancel"))
            .on_hover_text(
                "Stop after the current step (on Slurm: cancel the array job); the finished cells stay in the folder",
            )
            .clicked()
        {
            doc.experiments.cancel();
        }
        if running {
            ui.spinner();
        }
    });
    let e = &doc.experiments;
    if let Some(p) = &e.progress {
        ui.horizontal(|ui| {
            ui.add(
                egui::ProgressBar::new(p.fraction() as f32)
                    .desired_width(360.0)
                    .text(p.stage.clone())
                    .animate(running),
            );
            ui.label(RichText::new(format!("{} / {} cells", p.cells_done, p.cells)).strong());
            ui.label(RichText::new(time_text(p.elapsed, p.eta.filter(|_| running))).weak());
        });
    }
    if let Some(s) = &e.slurm_status {
        slurm_status_ui(ui, s);
    }
    if let Some(o) = &e.outcome {
        ui.label(RichText::new(o.text()).weak());
    }
    if let Some(err) = &e.error {
        ui.label(RichText::new(err).color(ui.visuals().error_fg_color));
    }
}

fn direction_text(d: Direction) -> &'static str {
    match d {
        Direction::Decreasing => "falls",
        Direction::Increasing => "rises",
        Direction::UShaped => "U-shaped",
    }
}

/// The variable picker, the accuracy and loss plots side by side, and the fits.
fn results_ui(ui: &mut Ui, doc: &mut Document) {
    let e = &mut doc.experiments;
    if e.rows.is_empty() || e.results.is_empty() {
        ui.label(RichText::new("No results yet: Run fills the plots in as the cells finish.").weak());
        return;
    }
    ui.horizontal_wrapped(|ui| {
        ui.label("Plots against");
        let vars: Vec<Variable> = e.results.iter().map(|r| r.variable).collect();
        for v in vars {
            if ui.selectable_label(e.variable == Some(v), v.label()).clicked() {
                e.variable = Some(v);
            }
        }
    });
    let Some(i) = e.shown() else { return };
    // Room below the plots: their buttons, the fits' heading and a row per fit.
    let below = 90.0 + 24.0 * (e.results[i].fits.len() + 1) as f32;
    let height = (ui.available_height() - below).clamp(220.0, 560.0);
    let figures = e.figures[i].clone();
    let mut save = None;
    ui.columns(2, |cols| {
        for (col, (name, figure)) in cols.iter_mut().zip(&figures) {
            col.label(RichText::new(figure.title()).strong());
            figure_view::figure_ui_compact(col, &format!("sweep-{name}"), figure, height);
            col.horizontal(|ui| {
                if ui.button("Save PNG…").clicked() {
                    save = Some((figure.clone(), name.clone(), true));
                }
                if ui.button("Save CSV…").clicked() {
                    save = Some((figure.clone(), name.clone(), false));
                }
            });
        }
    });
    fits_ui(ui, doc, i);
    if let Some((figure, name, png)) = save {
        let file = format!("sweep-{}-{name}", doc.experiments.name);
        dialogs::save_figure(doc, &figure, &file, png);
    }
}

/// The laws fitted to each method's loss along the shown variable.
fn fits_ui(ui: &mut Ui, doc: &Document, i: usize) {
    let r = &doc.experiments.results[i];
    let Some(law) = r.variable.law() else {
        ui.label(RichText::new("The optimiser is categorical: no law is fitted.").weak());
        return;
    };
    ui.label(
        RichText::new(format!(
            "Fits of the loss: {}; seed 002 predicts it {} as {} grows",
            law.formula(),
            direction_text(law.predicted()),
            short_label(r.variable)
        ))
        .strong(),
    );
    if r.fits.is_empty() {
        ui.label(
            RichText::new(format!(
                "No fit yet: the law needs at least {} values of {} with results.",
                law.basis(1.0).len(),
                short_label(r.variable)
            ))
            .weak(),
        );
        return;
    }
    let steps = r.variable == Variable::Steps;
    egui::Grid::new("sweep-fits")
        .striped(true)
        .spacing([14.0, 3.0])
        .show(ui, |ui| {
            let mut headers = vec!["Method", "Law", "R²", "Loss over the grid", "Verdict"];
            if steps {
                headers.push("K*");
            }
            for h in headers {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for f in &r.fits {
                ui.label(&f.method);
                ui.label(law.formula());
                ui.label(format!("{:.3}", f.loss.r_squared));
                ui.label(direction_text(f.measured));
                ui.label(f.verdict.text());
                if steps {
                    ui.label(f.loss.optimum().map_or("–".to_owned(), |k| format!("{k:.0}")));
                }
                ui.end_row();
            }
        });
}

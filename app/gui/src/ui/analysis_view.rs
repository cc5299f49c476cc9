//! The analysis panel (below the results): pick a view (PCA, radar, cosine, spectra, landscapes), watch it
//! compute (landscapes fill in coarse to fine; Cancel keeps what was computed in the cache),
//! hover for values, save PNG or CSV. Opened from the results with the selected merges.

use crate::analysis::ViewKind;
use crate::document::Document;
use crate::ui::{ViewState, dialogs, figure_view, oracle_form};
use egui::RichText;
use mergescope_studies::analysis::landscape::MetricKind;

/// What a view shows, for its button's tooltip.
fn hint(kind: ViewKind) -> &'static str {
    match kind {
        ViewKind::Pca => "Base, experts, the selected merges and their trajectories on two principal components",
        ViewKind::Radar => "Per-task normalised accuracy of the selected merges",
        ViewKind::Cosine => "Cosine similarity of the task vectors",
        ViewKind::Spectrum => "Singular values of the largest weight's task matrices",
        ViewKind::RankCurves => "CART's reconstruction error R(k) and interference I(k)",
        ViewKind::TaLine => "Accuracy of task arithmetic over λ",
        ViewKind::CartGrid => "Accuracy of CART over rank × λ",
        ViewKind::CartRank => "CART's accuracy at the best λ of each rank",
        ViewKind::Plane => "Accuracy over the plane through the base and two experts, with the selected trajectories",
        ViewKind::TrajectoryPlane => {
            "Accuracy around the selected run's trajectory, on its first two principal directions"
        }
        ViewKind::Heterogeneity => {
            "Seed 002: |τ_i − mean τ|² per expert before and after a TIES mask, and its signed reduction δ_i"
        }
        ViewKind::Oracle => {
            "Seed 004 on the text benchmark: ||θ_TA − θ_MT|| against the learning rate η, one curve per epoch count (it fine-tunes MiniLM, as `mergescope analyze oracle` does)"
        }
        ViewKind::Weights => "Seed 002: the weights K_i / Σ K_j plain averaging gives experts trained for K_i steps",
        ViewKind::Bound => {
            "Seed 002: the excess-risk bound's stability and optimisation parts, σ² and ζ² from calibration gradients"
        }
    }
}

/// Buttons that open each view on the selected runs (the second click from a result). Shown
/// while the panel is closed: the open panel has the same views as its tabs.
pub fn open_buttons(ui: &mut egui::Ui, doc: &mut Document, view: &ViewState) {
    ui.label(RichText::new("Analyze:").weak());
    for kind in ViewKind::ALL {
        if ui.small_button(kind.label()).on_hover_text(hint(kind)).clicked() {
            doc.analyze(kind, &view.selected);
        }
    }
}

/// The analysis panel, docked below the results table (so the rows that feed it stay in view):
/// it fills the space the results leave (their share is resizable and remembered by the window).
/// Shown while `doc.analysis.open`.
pub fn analysis_panel(ui: &mut egui::Ui, doc: &mut Document, view: &mut ViewState) {
    let ctx = ui.ctx().clone();
    let mut open = doc.analysis.open;
    ui.horizontal(|ui| {
        ui.heading("Analysis");
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if ui
                .small_button("Close")
                .on_hover_text("Close the analysis panel")
                .clicked()
            {
                open = false;
            }
        });
    });
    ui.horizontal_wrapped(|ui| {
        for kind in ViewKind::ALL {
            if ui
                .selectable_label(doc.analysis.kind == kind, kind.label())
                .on_hover_text(hint(kind))
                .clicked()
            {
                doc.analyze(kind, &view.selected);
            }
        }
    });
    let kind = doc.analysis.kind;
    // The view follows the results table: a change of selection, or a merge finishing,
    // redraws it without another click.
    if kind.uses_merges() && !doc.analysis.running() && doc.analysis_runs(&view.selected) != doc.analysis.runs {
        doc.analyze(kind, &view.selected);
    }
    if kind.uses_merges() && doc.analysis.runs.1 {
        ui.label(
            RichText::new("No merges selected: every finished merge is shown (tick rows in the results to choose).")
                .weak()
                .small(),
        );
    }
    if kind.is_landscape() {
        landscape_controls(ui, doc, view);
    } else if matches!(kind, ViewKind::Pca | ViewKind::Cosine | ViewKind::Heterogeneity) {
        view_controls(ui, doc, view);
    } else if kind == ViewKind::Bound {
        bound_controls(ui, doc, view);
    } else if kind == ViewKind::Oracle {
        oracle_form::oracle_controls(ui, doc, view);
    }
    ui.horizontal(|ui| {
        let a = &doc.analysis;
        if let Some(since) = a.running_since() {
            ui.spinner();
            let text = match a.progress {
                Some((done, total)) => {
                    let what = if kind == ViewKind::Oracle { "steps" } else { "points" };
                    format!("{done} of {total} {what}, {:.0} s", since.elapsed().as_secs_f64())
                }
                None => format!("computing, {:.0} s", since.elapsed().as_secs_f64()),
            };
            ui.label(text);
            if ui
                .button("Cancel")
                .on_hover_text(if kind == ViewKind::Oracle {
                    "Stops the oracle after the step it is on (nothing is kept)"
                } else {
                    "Points computed so far stay cached"
                })
                .clicked()
            {
                doc.analysis.cancel();
            }
        } else if let Some(s) = a.seconds {
            let points = a
                .progress
                .map(|(d, t)| format!(" ({d} of {t} points)"))
                .unwrap_or_default();
            ui.label(RichText::new(format!("computed in {s:.1} s{points}")).weak());
        }
        let has = doc.analysis.figure.is_some();
        if ui.add_enabled(has, egui::Button::new("Save PNG…")).clicked() {
            dialogs::export_figure(doc, true);
        }
        if ui.add_enabled(has, egui::Button::new("Save CSV…")).clicked() {
            dialogs::export_figure(doc, false);
        }
    });
    if let Some(e) = &doc.analysis.error {
        ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
    }
    if let Some(fig) = &doc.analysis.figure {
        ui.label(RichText::new(fig.title()).strong());
        // The figure takes the panel's height: drag the panel's edge to enlarge it.
        let height = (ui.available_height() - 10.0).max(140.0);
        figure_view::figure_ui(ui, "analysis-figure", fig, height);
    }
    doc.analysis.open = open;
    if !open {
        doc.analysis.cancel();
    }
    if doc.analysis.running() {
        ctx.request_repaint_after(std::time::Duration::from_millis(200));
    }
}

/// A labelled choice among `names` (or "all"/"whole model" as `None`).
fn optional_choice(
    ui: &mut egui::Ui,
    id: &str,
    label: &str,
    none: &str,
    names: &[String],
    slot: &mut Option<String>,
) -> bool {
    let mut changed = false;
    let label = ui.label(label);
    egui::ComboBox::from_id_salt(id)
        .selected_text(slot.clone().unwrap_or_else(|| none.to_owned()))
        .show_ui(ui, |ui| {
            changed |= ui.selectable_value(slot, None, none).changed();
            for n in names {
                changed |= ui.selectable_value(slot, Some(n.clone()), n).changed();
            }
        })
        .response
        .labelled_by(label.id);
    changed
}

/// PCA: the components on the axes; cosine: the whole model or one layer; heterogeneity: the
/// TIES density.
fn view_controls(ui: &mut egui::Ui, doc: &mut Document, view: &ViewState) {
    let mut changed = false;
    ui.horizontal(|ui| {
        let a = &mut doc.analysis;
        if a.kind == ViewKind::Pca {
            let n = (a.inputs.experts.len() + a.inputs.merges.len() + 1).max(2);
            for (which, slot) in [
                ("x axis: PC", &mut a.options.pcs.0),
                ("y axis: PC", &mut a.options.pcs.1),
            ] {
                let label = ui.label(which);
                changed |= ui
                    .add(egui::DragValue::new(slot).range(1..=n))
                    .labelled_by(label.id)
                    .changed();
            }
        } else if a.kind == ViewKind::Heterogeneity {
            let label = ui.label("TIES density");
            changed |= ui
                .add(egui::Slider::new(&mut a.options.density, 0.01..=1.0))
                .labelled_by(label.id)
                .drag_stopped();
        } else {
            changed |= optional_choice(
                ui,
                "cosine-tensor",
                "Layer",
                "whole model",
                &a.inputs.tensors,
                &mut a.options.tensor,
            );
        }
    });
    if changed {
        let kind = doc.analysis.kind;
        doc.analyze(kind, &view.selected);
    }
}

/// The bound's constants: L, C, η and Δ0 (measured or from the checkpoints unless set), and
/// the calibration examples per task. The bound is recomputed when an edit is committed.
fn bound_controls(ui: &mut egui::Ui, doc: &mut Document, view: &ViewState) {
    let mut changed = false;
    let b = &mut doc.analysis.options.bound;
    ui.horizontal_wrapped(|ui| {
        for (name, hover, slot) in [
            ("L", "smoothness constant L", &mut b.smoothness),
            ("C", "PL-type constant C", &mut b.pl),
        ] {
            let label = ui.label(name).on_hover_text(hover);
            changed |= committed(
                &ui.add(egui::DragValue::new(slot).range(1e-6..=1e6).speed(0.05))
                    .labelled_by(label.id),
            );
        }
        for (name, auto, default, slot) in [
            ("η", "from the checkpoints", 1e-3, &mut b.lr),
            ("Δ0", "measured at the base", 1.0, &mut b.delta0),
        ] {
            let label = ui.label(name);
            let mut set = slot.is_some();
            let toggled = ui
                .checkbox(&mut set, "set")
                .on_hover_text(format!("unset: {auto}"))
                .changed();
            if toggled {
                *slot = set.then_some(default);
                changed = true;
            }
            match slot {
                Some(v) => {
                    changed |= committed(
                        &ui.add(egui::DragValue::new(v).range(1e-9..=1e6).speed(1e-4))
                            .labelled_by(label.id),
                    );
                }
                None => {
                    ui.weak(auto);
                }
            }
        }
        let label = ui.label("calibration examples / task");
        changed |= committed(
            &ui.add(egui::DragValue::new(&mut b.examples).range(2..=100))
                .labelled_by(label.id),
        );
    });
    if changed {
        doc.analyze(ViewKind::Bound, &view.selected);
    }
}

/// Whether an edit of a drag value is finished (typed, or a drag released), so that an
/// expensive view is recomputed once rather than at every pixel of a drag.
fn committed(r: &egui::Response) -> bool {
    r.drag_stopped() || (r.changed() && !r.dragged())
}

fn landscape_controls(ui: &mut egui::Ui, doc: &mut Document, view: &ViewState) {
    let mut changed = false;
    ui.horizontal(|ui| {
        ui.label("Metric");
        let a = &mut doc.analysis;
        for (m, name) in [
            (MetricKind::Accuracy, "accuracy"),
            (MetricKind::Normalized, "normalised"),
            (MetricKind::Loss, "loss"),
        ] {
            changed |= ui.selectable_value(&mut a.options.metric, m, name).changed();
        }
        changed |= optional_choice(
            ui,
            "landscape-task",
            "of",
            "mean over tasks",
            &a.inputs.tasks,
            &mut a.options.task,
        );
        if a.kind == ViewKind::Plane {
            let names: Vec<String> = a.inputs.experts.iter().map(|(l, _)| l.clone()).collect();
            for (which, slot) in [("through", &mut a.options.plane.0), ("and", &mut a.options.plane.1)] {
                let label = ui.label(which);
                egui::ComboBox::from_id_salt(which)
                    .selected_text(names.get(*slot).cloned().unwrap_or_default())
                    .show_ui(ui, |ui| {
                        for (i, n) in names.iter().enumerate() {
                            changed |= ui.selectable_value(slot, i, n).changed();
                        }
                    })
                    .response
                    .labelled_by(label.id);
            }
        }
    });
    if changed {
        let kind = doc.analysis.kind;
        doc.analyze(kind, &view.selected);
    }
}

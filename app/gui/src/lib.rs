//! mergescope's desktop window: egui views over the engine, the plugins and the demo
//! benchmark. Layers, as in rerun: [`document`] (the user's working document and its jobs, no
//! UI; "session" is the plugin ABI's word for a model-level run) → [`ui`] (views that draw the
//! document and turn clicks into document calls) → [`app`] (the
//! eframe application that ties them to the window and the persisted [`settings`]).

pub mod analysis;
pub mod app;
pub mod crash_marker;
pub mod document;
pub mod experiments;
pub mod form;
pub mod inputs;
pub mod jobs;
pub mod runs;
pub mod settings;
pub mod text;
pub mod ui;

pub use app::MergescopeApp;
pub use document::{Document, DocumentConfig};

/// Opens the window and runs until it is closed.
pub fn run(config: DocumentConfig) -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("mergescope")
            .with_app_id("mergescope")
            .with_inner_size([1360.0, 820.0])
            .with_min_inner_size([960.0, 600.0])
            .with_drag_and_drop(true),
        persist_window: true,
        ..Default::default()
    };
    eframe::run_native(
        "mergescope",
        options,
        Box::new(move |cc| Ok(Box::new(MergescopeApp::from_creation_context(cc, &config)))),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the window: {e}"))
}

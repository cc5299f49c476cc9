//! The one door through which every caller (CLI, GUI, compare, sweeps) merges checkpoint
//! files: [`merge`] picks the streaming per-tensor path or a model-level session from the
//! plugin's kind, and both write their output the same way (sharding included).

pub use crate::model_merge::TaskSource;
use crate::model_merge::{ModelRun, merge_model_files};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::executor::{ExecOptions, Observer};
use mergescope_engine::merge::MergeReport;
use mergescope_engine::plugin::Plugin;
use mergescope_interop::request::{MergeRequest, merge_files};
use std::sync::atomic::AtomicBool;

/// What a finished merge left.
#[derive(Clone, Debug)]
pub struct MergeOutcome {
    /// Files written, tensors merged, copied and skipped, parameters, timing.
    pub report: MergeReport,
    /// A model-level method's run: its trajectory, and the partial result of a cancelled run.
    pub model: Option<ModelRun>,
}

/// Merges the files of `req` with `plugin`. A model-level method needs `tasks` (its calibration
/// data); a per-tensor method ignores them. `observer` sees progress and the plugin's log;
/// `cancel` stops the run (a cancelled model-level run that reported iterates keeps its last
/// one, marked partial).
pub fn merge(
    plugin: &Plugin,
    req: &MergeRequest,
    tasks: Option<TaskSource<'_>>,
    opts: &ExecOptions,
    observer: Observer<'_>,
    cancel: &AtomicBool,
) -> Result<MergeOutcome> {
    if !plugin.is_model_level() {
        let report = merge_files(plugin, req, opts, observer, cancel)?;
        return Ok(MergeOutcome { report, model: None });
    }
    if mergescope_engine::layered::is_layered(&req.params, plugin.schema())? {
        return Err(EngineError::Param(format!(
            "method '{}' runs over the whole model at once, so its parameters take one value each: \
             layer-wise values (lists of anchors across the layers, or filters by tensor name) work with \
             per-tensor methods only",
            plugin.id()
        )));
    }
    let Some(source) = tasks else {
        return Err(EngineError::Invalid(format!(
            "method '{}' evaluates its candidates on the tasks its experts were fine-tuned on: \
             open (or name) their benchmark, or a suite with calibration data",
            plugin.id()
        )));
    };
    let (report, run) = merge_model_files(plugin, req, source, opts, observer, cancel)?;
    Ok(MergeOutcome {
        report,
        model: Some(run),
    })
}

//! Model-level merges of checkpoint files (AdaMerging, Frank-Wolfe, MIMA, Fisher): whole models
//! are loaded, the method runs once in a session over the benchmark's tasks (expert t ↔ task
//! t), and the result is written like any merge, with the method's trajectory beside it. A
//! cancelled run that reported iterates still writes its last one, marked partial.

use crate::data::TaskData;
use crate::demo::Benchmark;
use crate::evaluator::calibration::{CalibrationTask, CalibrationTasks, DemoCalibration};
use crate::evaluator::suite::Suite;
use crate::nn::Params;
use crate::session::{ModelRunOutput, SessionModel, Trajectory, run_model};
use candle_core::{Device, Tensor};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat;
use mergescope_engine::dtype::DType;
use mergescope_engine::dtype::encode_f32;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::executor::{ExecOptions, Observer, Phase, Progress};
use mergescope_engine::finite::{first_non_finite, non_finite_input, non_finite_output};
use mergescope_engine::merge::{
    MergeReport, check_output_path, create_instance, file_desc, file_label, output_metadata, plan_outputs, write_copies,
};
use mergescope_engine::plugin::Plugin;
use mergescope_engine::plugin::instance::CallEnv;
use mergescope_engine::writer::{OutputTensor, OutputWriter};
use mergescope_interop::request::{MergeRequest, open_output};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Metadata key of an expert checkpoint naming its task (written by `demo build`).
pub const TASK_METADATA_KEY: &str = "mergescope.demo.task";

/// One reported iterate, as listed in reports and in the trajectory file.
#[derive(Clone, Debug, Serialize)]
pub struct IterateSummary {
    /// Position among all reported iterates.
    pub index: usize,
    /// The method's label.
    pub label: String,
    /// The method's metrics.
    pub metrics: Value,
}

/// What a model-level merge left besides the common report.
#[derive(Clone, Debug)]
pub struct ModelRun {
    /// Set when the run was cancelled and the last reported iterate was written instead.
    pub partial: Option<String>,
    /// The trajectory file, when the method reported iterates.
    pub trajectory_file: Option<PathBuf>,
    /// The kept iterates (at most `session::MAX_KEPT_ITERATES`, and at most
    /// `session::MAX_TRAJECTORY_BYTES` of them but never fewer than `session::MIN_KEPT_ITERATES`).
    pub iterates: Vec<IterateSummary>,
    /// Iterates reported in all.
    pub reported: usize,
}

/// The tasks a model-level (data-driven) method evaluates its candidates on.
#[derive(Clone, Copy)]
pub enum TaskSource<'a> {
    /// A demo benchmark whose experts the request merges (its heads, its arch, its tasks in
    /// order), and the data of (at least) its tasks.
    Benchmark {
        /// The benchmark.
        bench: &'a Benchmark,
        /// The data of its tasks.
        tasks: &'a [TaskData],
    },
    /// A family suite (BERT, CLIP): expert t is fine-tuned on its task t, whose calibration
    /// (and train) data the method learns on.
    Suite(&'a Suite),
}

/// Path of the trajectory file written beside `out` (`merged.safetensors` →
/// `merged.trajectory.safetensors`).
pub fn trajectory_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "merged".into());
    let name = if out.extension().is_some_and(|e| e == "safetensors") {
        format!("{stem}.trajectory.safetensors")
    } else {
        format!(
            "{}.trajectory.safetensors",
            out.file_name().map_or(stem, |n| n.to_string_lossy().into_owned())
        )
    };
    out.with_file_name(name)
}

/// The task of each expert: its `mergescope.demo.task` metadata, or else its position in the
/// benchmark's task order (when there are as many experts as tasks).
fn expert_tasks(experts: &[Checkpoint], bench: &Benchmark) -> Result<Vec<String>> {
    let names: Vec<&str> = bench.task_names();
    experts
        .iter()
        .enumerate()
        .map(|(i, c)| match c.metadata().get(TASK_METADATA_KEY) {
            Some(t) if names.contains(&t.as_str()) => Ok(t.clone()),
            Some(t) => Err(EngineError::Invalid(format!(
                "expert '{}' was fine-tuned on task '{t}', which the benchmark in '{}' does not have ({})",
                c.path.display(),
                bench.dir.display(),
                names.join(", ")
            ))),
            None if experts.len() == names.len() => Ok(names[i].to_owned()),
            None => Err(EngineError::Invalid(format!(
                "expert '{}' does not say which task it was fine-tuned on (no '{TASK_METADATA_KEY}' metadata) and \
                 there are {} experts for {} tasks; give one expert per task in the benchmark's order: {}",
                c.path.display(),
                experts.len(),
                names.len(),
                names.join(", ")
            ))),
        })
        .collect()
}

/// Loads the tensors `names` of `c`, refusing non-finite weights (a model-level method would
/// carry them into every iterate and the output).
fn load_tensors(c: &Checkpoint, names: &[String], device: &Device) -> Result<Vec<Tensor>> {
    names
        .iter()
        .map(|n| {
            let t = &c.tensors[n];
            let values = c.read_f32(t)?;
            if let Some((i, v)) = first_non_finite(&values) {
                return Err(non_finite_input(&c.path.display().to_string(), n, i, v));
            }
            Ok(Tensor::from_vec(values, t.shape.clone(), device)?)
        })
        .collect()
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Runs a model-level `plugin` on models held in memory (tests, experiments, the GUI's sweeps):
/// `params` are the user's values (JSON object), `on_iterate` sees each reported iterate's
/// label. The run's result and trajectory come back even when it failed or was cancelled.
pub fn run_model_in_memory(
    plugin: &Plugin,
    params: &Value,
    seed: u64,
    model: &SessionModel<'_>,
    device: &Device,
    cancel: &AtomicBool,
    on_iterate: &mut dyn FnMut(&str, f64),
) -> Result<ModelRunOutput> {
    let log = |_: mergescope_plugin_api::abi::LogLevel, _: &str| {};
    let env = CallEnv {
        device,
        cancel,
        log: &log,
        threads: 0,
    };
    let (instance, _) = create_instance(plugin, params, seed, true, model.experts.len(), env)?;
    Ok(run_model(&instance, env, model, on_iterate))
}

/// The session's tasks on a demo benchmark: expert t's task (by metadata or order) with its
/// data and frozen head; the base must be a backbone of the benchmark's architecture.
fn benchmark_tasks<'a>(
    bench: &Benchmark,
    task_data: &'a [TaskData],
    experts: &[Checkpoint],
    base: &Checkpoint,
    backbone: &Params,
    device: &Device,
) -> Result<(Vec<String>, Box<dyn CalibrationTasks + 'a>)> {
    let tasks = expert_tasks(experts, bench)?;
    let mut heads = bench.heads(device)?;
    let session_tasks = tasks
        .iter()
        .map(|name| {
            let data = task_data.iter().find(|d| &d.name == name).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "task '{name}' has no data installed; add its file to the task folder"
                ))
            })?;
            let head = heads
                .remove(name)
                .ok_or_else(|| EngineError::Invalid(format!("two experts are fine-tuned on task '{name}'")))?;
            Ok(CalibrationTask { data, head })
        })
        .collect::<Result<Vec<_>>>()?;
    bench.manifest.arch.check(backbone).map_err(|e| {
        EngineError::Invalid(format!(
            "the base '{}' is not a {} backbone of this benchmark: {e}",
            base.path.display(),
            bench.manifest.arch
        ))
    })?;
    let calibration = DemoCalibration::new(bench.manifest.arch, session_tasks, device)?;
    Ok((tasks, Box::new(calibration)))
}

/// Merges checkpoint files with a model-level `plugin` on the tasks of `source` (a demo
/// benchmark, or a family suite). The base is required; expert t is matched to its task by
/// metadata or order.
pub(crate) fn merge_model_files(
    plugin: &Plugin,
    req: &MergeRequest,
    source: TaskSource<'_>,
    opts: &ExecOptions,
    observer: Observer<'_>,
    cancel: &AtomicBool,
) -> Result<(MergeReport, ModelRun)> {
    let started = Instant::now();
    let Some(base_path) = req.base.as_deref() else {
        return Err(EngineError::Invalid(format!(
            "method '{}' starts from the base model: pass --base PATH",
            plugin.id()
        )));
    };
    let base = Checkpoint::open(base_path)?;
    let experts: Vec<Checkpoint> = req.experts.iter().map(|p| Checkpoint::open(p)).collect::<Result<_>>()?;
    let mut models: Vec<&Checkpoint> = vec![&base];
    models.extend(experts.iter());
    check_output_path(&req.out, &models)?;
    let traj_path = trajectory_path(&req.out);
    check_output_path(&traj_path, &models)?;
    let env = CallEnv {
        device: &opts.device,
        cancel,
        log: observer.log,
        threads: opts.threads,
    };
    let (instance, resolved) = create_instance(plugin, &req.params, req.seed, true, experts.len(), env)?;

    let descs: Vec<_> = models.iter().map(|c| file_desc(c)).collect();
    let labels: Vec<String> = models.iter().map(|c| file_label(&c.path)).collect();
    let others: Vec<_> = descs[1..].iter().collect();
    let report = compat::check(&labels, &descs[0], &others, req.on_missing).map_err(EngineError::Incompatible)?;
    let plan = plan_outputs(&report.fates, &base, req.out_dtype);
    let names: Vec<String> = plan.items.iter().map(|i| i.name.clone()).collect();

    // The session: whole models on the device, one task per expert.
    let device = &opts.device;
    let base_tensors = load_tensors(&base, &names, device)?;
    let (tasks, calibration) = match source {
        TaskSource::Benchmark {
            bench,
            tasks: task_data,
        } => {
            let backbone: Params = names.iter().cloned().zip(base_tensors.iter().cloned()).collect();
            benchmark_tasks(bench, task_data, &experts, &base, &backbone, device)?
        }
        TaskSource::Suite(suite) => (
            suite.task_names(),
            suite.calibration_tasks(base_path, &req.experts, device)?,
        ),
    };
    let model = SessionModel {
        shapes: plan.items.iter().map(|i| i.shape.clone()).collect(),
        experts: experts
            .iter()
            .map(|c| load_tensors(c, &names, device))
            .collect::<Result<_>>()?,
        names,
        base: base_tensors,
        tasks: calibration,
    };

    // Progress in permille of the plugin's own fraction, labelled with its latest iterate.
    let mut on_iterate = |label: &str, fraction: f64| {
        (observer.progress)(&Progress {
            phase: Phase::Merge,
            done: (fraction.clamp(0.0, 1.0) * 1000.0).round() as u64,
            total: 1000,
            tensor: label.to_owned(),
        });
    };
    let run = run_model(&instance, env, &model, &mut on_iterate);
    drop(instance);
    let Trajectory { iterates, reported, .. } = run.trajectory;
    let (merged, partial) = match run.result {
        Ok(m) => (m, None),
        Err(EngineError::Cancelled) => match iterates.last() {
            Some(last) => (last.tensors.clone(), Some(last.label.clone())),
            None => return Err(EngineError::Cancelled),
        },
        Err(e) => return Err(e),
    };

    let params_json = resolved.to_json();
    let mut metadata = output_metadata(plugin, &params_json, req.seed, &models, true, &report.notes);
    metadata.insert(
        "mergescope.benchmark.tasks".to_owned(),
        Value::from(tasks.clone()).to_string(),
    );
    if let Some(label) = &partial {
        metadata.insert(
            "mergescope.partial".to_owned(),
            format!("cancelled; this is the method's last reported iterate ('{label}')"),
        );
    }
    let summaries: Vec<IterateSummary> = iterates
        .iter()
        .map(|it| IterateSummary {
            index: it.index,
            label: it.label.clone(),
            metrics: it.metrics.clone(),
        })
        .collect();
    let trajectory_file = if iterates.is_empty() {
        None
    } else {
        metadata.insert(
            "mergescope.trajectory".to_owned(),
            traj_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        write_trajectory(&traj_path, &model, &iterates, &summaries, reported, req.overwrite)?;
        Some(traj_path)
    };

    let (writer, folder_notes) = open_output(req, &plan.outputs, &metadata, &base, &models, true)?;
    write_copies(&writer, &base, &plan.copies)?;
    for (name, t) in model.names.iter().zip(&merged) {
        let values = host_f32(t)?;
        if let Some((i, v)) = first_non_finite(&values) {
            return Err(non_finite_output(plugin.id(), name, i, v));
        }
        writer.write_values(name, 0, &values)?;
    }
    let files = writer.commit()?;
    let report = MergeReport {
        files,
        merged: model.names.len(),
        copied: plan.copies.len(),
        skipped: plan.skipped,
        notes: report.notes.into_iter().chain(folder_notes).collect(),
        input_bytes: models.iter().map(|c| c.total_bytes()).sum(),
        seconds: started.elapsed().as_secs_f64(),
        params: params_json,
    };
    Ok((
        report,
        ModelRun {
            partial,
            trajectory_file,
            iterates: summaries,
            reported,
        },
    ))
}

/// Writes the kept iterates as one flat f32 vector each (`iterate.000042`: every session tensor,
/// flattened and concatenated in order), with the labels, metrics and tensor layout in the
/// header, for the trajectory views.
fn write_trajectory(
    path: &Path,
    model: &SessionModel<'_>,
    iterates: &[crate::session::Iterate],
    summaries: &[IterateSummary],
    reported: usize,
    overwrite: bool,
) -> Result<()> {
    let numel: usize = model.shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let key = |i: usize| format!("iterate.{i:06}");
    let outputs: Vec<OutputTensor> = iterates
        .iter()
        .map(|it| OutputTensor {
            name: key(it.index),
            dtype: DType::F32,
            shape: vec![numel],
        })
        .collect();
    let layout: Vec<Value> = model
        .names
        .iter()
        .zip(&model.shapes)
        .map(|(n, s)| serde_json::json!({"name": n, "shape": s}))
        .collect();
    let mut metadata = BTreeMap::new();
    metadata.insert("format".to_owned(), "pt".to_owned());
    metadata.insert(
        "mergescope.trajectory.tensors".to_owned(),
        Value::from(layout).to_string(),
    );
    metadata.insert(
        "mergescope.trajectory.iterates".to_owned(),
        serde_json::to_string(summaries).unwrap_or_default(),
    );
    metadata.insert("mergescope.trajectory.reported".to_owned(), reported.to_string());
    let writer = OutputWriter::create(path, &outputs, &metadata, None, overwrite)?;
    for it in iterates {
        let mut flat = Vec::with_capacity(numel);
        for t in &it.tensors {
            flat.extend(host_f32(t)?);
        }
        let mut bytes = Vec::new();
        encode_f32(DType::F32, &flat, &mut bytes);
        writer.write(&key(it.index), 0, &bytes)?;
    }
    writer.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trajectory_file_sits_beside_the_output() {
        assert_eq!(
            trajectory_path(Path::new("/runs/ada.safetensors")),
            Path::new("/runs/ada.trajectory.safetensors")
        );
        assert_eq!(
            trajectory_path(Path::new("out/merged")),
            Path::new("out/merged.trajectory.safetensors")
        );
    }
}

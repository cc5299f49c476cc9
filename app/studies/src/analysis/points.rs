//! Points of an analysis read from files: whole checkpoints and the iterates of trajectory
//! files (`<merge>.trajectory.safetensors`), optionally minus a reference (the base, for task
//! vectors). Files are read tensor by tensor through mmap, so memory holds one tensor of every
//! point at a time.

use super::Gram;
use mergescope_engine::checkpoint::{Checkpoint, TensorEntry};
use mergescope_engine::error::{EngineError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Labelled points and their Gram matrix.
#[derive(Clone, Debug)]
pub struct PointSet {
    /// One label per point: the checkpoint's file name, or `<trajectory>: <iterate label>`.
    pub labels: Vec<String>,
    /// The iterate's metrics (JSON object; `null` for checkpoints).
    pub metrics: Vec<Value>,
    /// Which trajectory each point belongs to (index into the trajectories given), if any.
    pub trajectory: Vec<Option<usize>>,
    /// Inner products of the points (minus the reference, if one was given).
    pub gram: Gram,
}

/// A tensor of the layout: name, shape and element count.
struct Slot {
    name: String,
    shape: Vec<usize>,
    numel: usize,
}

/// Where a point's values come from.
enum Source<'a> {
    /// A checkpoint: tensor by name.
    Checkpoint(&'a Checkpoint),
    /// One flat iterate of a trajectory; tensors at their layout offsets.
    Iterate(&'a Checkpoint, &'a TensorEntry),
}

/// A checkpoint's display name: its file name without `.safetensors` (and `.trajectory`).
pub fn checkpoint_label(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.trim_end_matches(".safetensors")
        .trim_end_matches(".trajectory")
        .to_owned()
}

/// The tensor layout stored in a trajectory file's header.
fn trajectory_layout(c: &Checkpoint) -> Result<Vec<Slot>> {
    let meta = c.metadata();
    let raw = meta.get("mergescope.trajectory.tensors").ok_or_else(|| {
        EngineError::Invalid(format!(
            "'{}' is not a trajectory file (no mergescope.trajectory.tensors in its header); pass it as a checkpoint instead",
            c.path.display()
        ))
    })?;
    let v: Vec<Value> = serde_json::from_str(raw)
        .map_err(|e| EngineError::Invalid(format!("'{}': bad tensor layout: {e}", c.path.display())))?;
    v.iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap_or_default().to_owned();
            let shape: Vec<usize> = t["shape"]
                .as_array()
                .map(|s| s.iter().map(|d| d.as_u64().unwrap_or(0) as usize).collect())
                .unwrap_or_default();
            let numel = if shape.is_empty() { 0 } else { shape.iter().product() };
            Ok(Slot { name, shape, numel })
        })
        .collect()
}

/// The iterate tensors of a trajectory file in order, each with its label and metrics from
/// the header's summaries.
fn iterates(c: &Checkpoint) -> Vec<(&String, String, Value)> {
    let summaries: Vec<Value> = c
        .metadata()
        .get("mergescope.trajectory.iterates")
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let mut keys: Vec<&String> = c.tensors.keys().filter(|k| k.starts_with("iterate.")).collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let index: u64 = k.trim_start_matches("iterate.").parse().unwrap_or(u64::MAX);
            let s = summaries.iter().find(|s| s["index"].as_u64() == Some(index));
            let label = s.and_then(|s| s["label"].as_str()).unwrap_or(k).to_owned();
            (k, label, s.map(|s| s["metrics"].clone()).unwrap_or(Value::Null))
        })
        .collect()
}

/// Reads `checkpoints` and the iterates of `trajectories` into a Gram matrix over the tensors
/// of the first trajectory's layout (or, without trajectories, every float tensor of the first
/// checkpoint), minus `reference` when given. With `only`, just that tensor counts (per-layer
/// similarity); iterates are still read at their layout offsets.
pub fn gram_of_files(
    checkpoints: &[PathBuf],
    trajectories: &[PathBuf],
    reference: Option<&Path>,
    only: Option<&str>,
) -> Result<PointSet> {
    let ckpts: Vec<Checkpoint> = checkpoints.iter().map(|p| Checkpoint::open(p)).collect::<Result<_>>()?;
    let trajs: Vec<Checkpoint> = trajectories
        .iter()
        .map(|p| Checkpoint::open(p))
        .collect::<Result<_>>()?;
    let reference = reference.map(Checkpoint::open).transpose()?;
    let layout: Vec<Slot> = match (trajs.first(), ckpts.first()) {
        (Some(t), _) => trajectory_layout(t)?,
        (None, Some(c)) => c
            .tensors
            .iter()
            .filter(|(_, t)| t.dtype.is_float())
            .map(|(k, t)| Slot {
                name: k.clone(),
                shape: t.shape.clone(),
                numel: t.numel(),
            })
            .collect(),
        (None, None) => return Err(EngineError::Invalid("no checkpoints or trajectories to analyse".into())),
    };
    let mut labels = Vec::new();
    let mut metrics = Vec::new();
    let mut membership = Vec::new();
    let mut sources = Vec::new();
    for (c, p) in ckpts.iter().zip(checkpoints) {
        labels.push(checkpoint_label(p));
        metrics.push(Value::Null);
        membership.push(None);
        sources.push(Source::Checkpoint(c));
    }
    for (i, (t, p)) in trajs.iter().zip(trajectories).enumerate() {
        for (k, label, m) in iterates(t) {
            labels.push(format!("{}: {label}", checkpoint_label(p)));
            metrics.push(m);
            membership.push(Some(i));
            sources.push(Source::Iterate(t, &t.tensors[k]));
        }
    }
    let total: usize = layout.iter().map(|s| s.numel).sum();
    for src in &sources {
        if let Source::Iterate(c, e) = src
            && e.numel() != total
        {
            return Err(EngineError::Invalid(format!(
                "'{}': iterates of {} values, but the layout adds up to {total}; pass trajectories of the same model",
                c.path.display(),
                e.numel()
            )));
        }
    }
    if let Some(name) = only
        && !layout.iter().any(|s| s.name == name)
    {
        let known: Vec<&str> = layout.iter().map(|s| s.name.as_str()).collect();
        return Err(EngineError::Param(format!(
            "no tensor '{name}' in these checkpoints; they have: {}",
            known.join(", ")
        )));
    }
    let mut gram = Gram::new(sources.len());
    let mut offset = 0;
    for slot in &layout {
        if only.is_some_and(|name| name != slot.name) {
            offset += slot.numel;
            continue;
        }
        let read = |c: &Checkpoint| -> Result<Vec<f32>> {
            let e = c.tensors.get(&slot.name).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "'{}' has no tensor '{}'; the points must be checkpoints of the same model",
                    c.path.display(),
                    slot.name
                ))
            })?;
            if e.numel() != slot.numel {
                return Err(EngineError::Invalid(format!(
                    "'{}': tensor '{}' has {} values, expected {}",
                    c.path.display(),
                    slot.name,
                    e.numel(),
                    slot.numel
                )));
            }
            c.read_f32(e)
        };
        let shift = reference.as_ref().map(&read).transpose()?;
        let chunks: Vec<Vec<f32>> = sources
            .iter()
            .map(|s| {
                let mut v = match s {
                    Source::Checkpoint(c) => read(c)?,
                    Source::Iterate(c, e) => c.read_f32_range(e, offset, slot.numel)?,
                };
                if let Some(r) = &shift {
                    v.iter_mut().zip(r).for_each(|(x, r)| *x -= r);
                }
                Ok(v)
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&[f32]> = chunks.iter().map(Vec::as_slice).collect();
        gram.add(&refs)?;
        offset += slot.numel;
    }
    Ok(PointSet {
        labels,
        metrics,
        trajectory: membership,
        gram,
    })
}

/// Every iterate of a trajectory file as parameters (label, tensors by the stored layout), in
/// order: for projecting a trajectory onto a landscape's plane.
pub fn read_iterates(path: &Path, device: &candle_core::Device) -> Result<Vec<(String, mergescope_lab::nn::Params)>> {
    let c = Checkpoint::open(path)?;
    let layout = trajectory_layout(&c)?;
    iterates(&c)
        .into_iter()
        .map(|(k, label, _)| {
            let e = &c.tensors[k];
            let total: usize = layout.iter().map(|s| s.numel).sum();
            if e.numel() != total {
                return Err(EngineError::Invalid(format!(
                    "'{}': {k} has {} values, but the layout adds up to {total}",
                    path.display(),
                    e.numel()
                )));
            }
            let mut offset = 0;
            let mut params = mergescope_lab::nn::Params::new();
            for slot in &layout {
                let v = c.read_f32_range(e, offset, slot.numel)?;
                params.insert(
                    slot.name.clone(),
                    candle_core::Tensor::from_vec(v, slot.shape.clone(), device)?,
                );
                offset += slot.numel;
            }
            Ok((label, params))
        })
        .collect()
}

//! Merges: validate the request, check the inputs fit together, create the plugin instance,
//! stream the tensors through it, and write the output atomically with everything needed to
//! replay it in the header metadata.

use crate::checkpoint::{Checkpoint, TensorEntry};
use crate::compat::{self, MissingPolicy, ModelDesc, TensorFate};
use crate::dtype::{DType, OutDType, decode_f32_vec};
use crate::error::{EngineError, Result};
pub use crate::executor::{ExecOptions, Observer, Phase, Progress};
use crate::executor::{PlanItem, Run, Sink, Source};
use crate::layered;
use crate::plugin::Plugin;
use crate::plugin::instance::{CallEnv, Instance};
use crate::plugin::schema::{ResolvedParams, resolve_params};
use crate::writer::{OutputTensor, OutputWriter};
use mergescope_plugin_api::abi;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// A tensor held in memory (f32, row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct MemTensor {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

impl MemTensor {
    /// A tensor from a shape and values.
    pub fn new(shape: impl Into<Vec<usize>>, data: impl Into<Vec<f32>>) -> MemTensor {
        MemTensor {
            shape: shape.into(),
            data: data.into(),
        }
    }
}

/// A model held in memory: tensors by name.
pub type MemModel = BTreeMap<String, MemTensor>;

/// `plugin`, if it merges tensor by tensor (what the merges of this module run); a model-level
/// method is refused.
pub fn per_tensor(plugin: &Plugin) -> Result<&Plugin> {
    if plugin.is_model_level() {
        return Err(EngineError::Invalid(format!(
            "method '{}' is a model-level method: it evaluates candidates on the tasks' calibration data, so it \
             needs a benchmark (heads and tasks): pass --benchmark demo (or a benchmark folder)",
            plugin.id()
        )));
    }
    Ok(plugin)
}

/// Validates the inputs and parameters of a merge and creates the plugin's instance (either
/// kind of method).
pub fn create_instance<'p>(
    plugin: &'p Plugin,
    params: &Value,
    seed: u64,
    has_base: bool,
    n_experts: usize,
    env: CallEnv<'_>,
) -> Result<(Instance<'p>, ResolvedParams)> {
    if n_experts == 0 {
        return Err(EngineError::Invalid(
            "a merge needs at least one expert checkpoint (--expert PATH)".into(),
        ));
    }
    if plugin.has_capability(abi::CAP_ONE_EXPERT) && n_experts != 1 {
        return Err(EngineError::Invalid(format!(
            "method '{}' takes exactly one expert, but this merge has {n_experts} experts; refused before merging: \
             give one --expert (to combine more models use task-arithmetic, ties or model-stock)",
            plugin.id()
        )));
    }
    if plugin.has_capability(abi::CAP_NEEDS_BASE) && !has_base {
        return Err(EngineError::Invalid(format!(
            "method '{}' works on task vectors (expert − base) and needs the base model: pass --base PATH",
            plugin.id()
        )));
    }
    let empty = serde_json::Map::new();
    let user = match params {
        Value::Object(m) => m,
        Value::Null => &empty,
        other => {
            return Err(EngineError::Param(format!(
                "parameters must be a table of name = value, got {other}"
            )));
        }
    };
    let resolved = resolve_params(plugin.id(), plugin.schema(), user, n_experts).map_err(EngineError::Param)?;
    let instance = Instance::create(plugin, &resolved, n_experts, seed, env)?;
    Ok((instance, resolved))
}

/// Whether some parameter of a per-tensor merge is layer-wise, and when none is, the merge's one
/// instance: plain parameters are checked before the inputs are, layer-wise ones once the
/// tensors are known, each group of tensors sharing values getting its own instance
/// ([`instance_groups`]).
#[allow(clippy::type_complexity)]
pub fn plain_instance<'p>(
    plugin: &'p Plugin,
    params: &Value,
    seed: u64,
    has_base: bool,
    n_experts: usize,
    env: CallEnv<'_>,
) -> Result<(bool, Option<(Instance<'p>, ResolvedParams)>)> {
    if layered::is_layered(params, plugin.schema())? {
        return Ok((true, None));
    }
    let single = create_instance(per_tensor(plugin)?, params, seed, has_base, n_experts, env)?;
    Ok((false, Some(single)))
}

struct MemSource<'a> {
    models: Vec<&'a MemModel>,
}

impl Source for MemSource<'_> {
    fn read(&self, model: usize, name: &str, from: usize, len: usize) -> Result<Vec<f32>> {
        let t = self
            .models
            .get(model)
            .and_then(|m| m.get(name))
            .ok_or_else(|| EngineError::Bug(format!("tensor '{name}' of input {model} is not in memory")))?;
        Ok(t.data[from..from + len].to_vec())
    }
}

struct MemSink {
    out: Mutex<BTreeMap<String, Vec<f32>>>,
}

impl Sink for MemSink {
    fn write(&self, name: &str, from: usize, values: &[f32]) -> Result<bool> {
        let mut out = self.out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let v = out
            .get_mut(name)
            .ok_or_else(|| EngineError::Bug(format!("tensor '{name}' has no output buffer")))?;
        v[from..from + values.len()].copy_from_slice(values);
        Ok(false)
    }
}

fn mem_desc(m: &MemModel) -> Result<ModelDesc> {
    m.iter()
        .map(|(k, t)| {
            if t.shape.iter().product::<usize>() != t.data.len() {
                return Err(EngineError::Invalid(format!(
                    "tensor '{k}': shape {:?} does not hold {} values",
                    t.shape,
                    t.data.len()
                )));
            }
            Ok((k.clone(), (DType::F32, t.shape.clone())))
        })
        .collect()
}

/// Merges models held in memory with default options. `params` is a JSON object of user
/// values (validated against the plugin's schema; missing ones take their defaults).
pub fn merge_in_memory(
    plugin: &Plugin,
    params: &Value,
    seed: u64,
    base: Option<&MemModel>,
    experts: &[MemModel],
) -> Result<MemModel> {
    merge_in_memory_with(plugin, params, seed, base, experts, &ExecOptions::default())
}

/// [`merge_in_memory`] with explicit execution options.
pub fn merge_in_memory_with(
    plugin: &Plugin,
    params: &Value,
    seed: u64,
    base: Option<&MemModel>,
    experts: &[MemModel],
    opts: &ExecOptions,
) -> Result<MemModel> {
    let cancel = AtomicBool::new(false);
    let observer = Observer::silent();
    let env = CallEnv {
        device: &opts.device,
        cancel: &cancel,
        log: observer.log,
        threads: opts.threads,
    };
    let (_, single) = plain_instance(plugin, params, seed, base.is_some(), experts.len(), env)?;
    let mut models: Vec<&MemModel> = Vec::new();
    models.extend(base);
    models.extend(experts.iter());
    let descs: Vec<ModelDesc> = models.iter().map(|m| mem_desc(m)).collect::<Result<_>>()?;
    let labels: Vec<String> = (0..models.len())
        .map(|i| match (base.is_some(), i) {
            (true, 0) => "the base".to_owned(),
            (true, i) => format!("expert {i}"),
            (false, i) => format!("expert {}", i + 1),
        })
        .collect();
    let others: Vec<&ModelDesc> = descs[1..].iter().collect();
    compat::check(&labels, &descs[0], &others, MissingPolicy::Error).map_err(EngineError::Incompatible)?;
    let items: Vec<PlanItem> = models[0]
        .iter()
        .map(|(name, t)| PlanItem {
            name: name.clone(),
            shape: t.shape.clone(),
        })
        .collect();
    let sink = MemSink {
        out: Mutex::new(
            models[0]
                .iter()
                .map(|(k, t)| (k.clone(), vec![0f32; t.data.len()]))
                .collect(),
        ),
    };
    let groups = instance_groups(
        plugin,
        params,
        single,
        seed,
        base.is_some(),
        experts.len(),
        env,
        &items,
        None,
    )?;
    let run = GroupRun::new(plugin, base.is_some(), experts.len(), opts, observer, &cancel);
    run.execute(&groups, &MemSource { models: models.clone() }, &sink)?;
    let out = sink.out.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(out
        .into_iter()
        .map(|(k, data)| {
            let shape = models[0].get(&k).map(|t| t.shape.clone()).unwrap_or_default();
            (k, MemTensor { shape, data })
        })
        .collect())
}

/// What a finished merge did.
#[derive(Clone, Debug)]
pub struct MergeReport {
    /// Files written.
    pub files: Vec<PathBuf>,
    /// Tensors merged by the method.
    pub merged: usize,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// Tensors left out.
    pub skipped: usize,
    /// Notes (conversions, copies).
    pub notes: Vec<String>,
    /// Bytes of input files.
    pub input_bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Parameters as resolved (defaults filled in).
    pub params: Value,
}

/// Inputs read from checkpoint files (base first when the merge has one).
pub struct FileSource<'a> {
    /// The opened inputs.
    pub models: Vec<&'a Checkpoint>,
}

impl FileSource<'_> {
    fn entry(&self, model: usize, name: &str) -> Result<(&Checkpoint, &TensorEntry)> {
        let c = self
            .models
            .get(model)
            .ok_or_else(|| EngineError::Bug(format!("no input {model}")))?;
        let t = c
            .tensors
            .get(name)
            .ok_or_else(|| EngineError::Bug(format!("'{name}' missing from '{}'", c.path.display())))?;
        Ok((c, t))
    }
}

impl Source for FileSource<'_> {
    fn describe(&self, model: usize) -> String {
        self.models
            .get(model)
            .map_or_else(|| format!("input {model}"), |c| c.path.display().to_string())
    }

    fn read(&self, model: usize, name: &str, from: usize, len: usize) -> Result<Vec<f32>> {
        let (c, t) = self.entry(model, name)?;
        c.read_f32_range(t, from, len)
    }

    fn read_checked(&self, model: usize, name: &str, from: usize, len: usize) -> Result<(Vec<f32>, bool)> {
        let (c, t) = self.entry(model, name)?;
        c.read_f32_range_checked(t, from, len)
    }

    /// Keeps elements `[from, from + len)` of the tensor mapped in every input that reads it
    /// through a map while `work` runs (the executor keeps a held range within
    /// [`ExecOptions::hold_bytes`](crate::executor::ExecOptions::hold_bytes)).
    fn hold(&self, name: &str, from: usize, len: usize, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _held: Vec<_> = self.models.iter().filter_map(|c| c.hold(name, from, len)).collect();
        work()
    }

    /// The bytes per element of the tensor over all inputs, where some input reads it through
    /// a map.
    fn held_bytes_per_elem(&self, name: &str) -> Option<u64> {
        self.models.iter().any(|c| c.holdable(name)).then(|| {
            self.models
                .iter()
                .filter_map(|c| c.tensors.get(name))
                .map(|t| t.dtype.size() as u64)
                .sum()
        })
    }
}

/// Merged values written by an output writer.
pub struct FileSink<'a> {
    /// The output's writer.
    pub writer: &'a OutputWriter,
}

impl Sink for FileSink<'_> {
    fn write(&self, name: &str, from: usize, values: &[f32]) -> Result<bool> {
        self.writer.write_values(name, from, values)
    }
}

/// `p` with every existing part resolved (links, `..`): the canonical path when it exists,
/// else its resolved parent joined with its name.
fn resolved(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = std::fs::canonicalize(p) {
        return Some(c);
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
}

/// Refuses an output that would write over, into or around an input: the same file, a file
/// inside an input folder (its shards, its index, anything else there), or a folder that
/// holds an input.
pub fn check_output_path(out: &Path, inputs: &[&Checkpoint]) -> Result<()> {
    let Some(target) = resolved(out) else {
        return Ok(());
    };
    for c in inputs {
        let mut paths: Vec<&Path> = vec![&c.path];
        paths.extend(c.files.iter().map(|f| f.path.as_path()));
        for p in paths {
            let Some(input) = resolved(p) else { continue };
            let problem = if input == target {
                "is one of the inputs"
            } else if input.is_dir() && target.starts_with(&input) {
                "lies inside the input folder"
            } else if input.starts_with(&target) {
                "is a folder holding the input"
            } else {
                continue;
            };
            return Err(EngineError::Invalid(format!(
                "the output '{}' {problem} '{}'; mergescope never writes over or into its inputs: choose an --out \
                 outside every input",
                out.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// The names, dtypes and shapes of a checkpoint's tensors, for the compatibility check.
pub fn file_desc(c: &Checkpoint) -> ModelDesc {
    c.tensors
        .iter()
        .map(|(k, t)| (k.clone(), (t.dtype, t.shape.clone())))
        .collect()
}

/// How an input is named in messages: its path in quotes.
pub fn file_label(p: &Path) -> String {
    format!("'{}'", p.display())
}

/// What a merge writes: the tensors the method merges, every output tensor with its dtype, the
/// tensors copied unchanged, and how many are left out.
pub struct Plan {
    /// The tensors the method merges.
    pub items: Vec<PlanItem>,
    /// Every output tensor with its dtype.
    pub outputs: Vec<OutputTensor>,
    /// The tensors copied unchanged from the reference.
    pub copies: Vec<TensorEntry>,
    /// How many tensors are left out.
    pub skipped: usize,
}

/// Plans the output from the compatibility check's fate of each tensor of `reference`.
pub fn plan_outputs(fates: &BTreeMap<String, TensorFate>, reference: &Checkpoint, out_dtype: Option<OutDType>) -> Plan {
    let mut items = Vec::new();
    let mut outputs = Vec::new();
    let mut copies = Vec::new();
    let mut skipped = 0;
    for (name, fate) in fates {
        let t = &reference.tensors[name];
        match fate {
            TensorFate::Merge => {
                items.push(PlanItem {
                    name: name.clone(),
                    shape: t.shape.clone(),
                });
                let dtype = out_dtype.map_or(t.dtype, OutDType::dtype);
                outputs.push(OutputTensor {
                    name: name.clone(),
                    dtype,
                    shape: t.shape.clone(),
                });
            }
            TensorFate::Copy(_) => {
                let dtype = match out_dtype {
                    Some(d) if t.dtype.is_float() => d.dtype(),
                    _ => t.dtype,
                };
                outputs.push(OutputTensor {
                    name: name.clone(),
                    dtype,
                    shape: t.shape.clone(),
                });
                copies.push(t.clone());
            }
            TensorFate::Skip(_) => skipped += 1,
        }
    }

    Plan {
        items,
        outputs,
        copies,
        skipped,
    }
}

/// The header metadata of a merge's output: method, plugin version, parameters, seed, inputs
/// (role, file name, size), app version and notes, so any merge can be replayed.
pub fn output_metadata(
    plugin: &Plugin,
    params_json: &Value,
    seed: u64,
    models: &[&Checkpoint],
    has_base: bool,
    notes: &[String],
) -> BTreeMap<String, String> {
    let inputs: Vec<Value> = models
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let role = if has_base && i == 0 { "base" } else { "expert" };
            let name = c
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            serde_json::json!({"role": role, "name": name, "bytes": c.total_bytes()})
        })
        .collect();
    let mut metadata = BTreeMap::new();
    metadata.insert("format".to_owned(), "pt".to_owned());
    metadata.insert("mergescope.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned());
    metadata.insert("mergescope.method".to_owned(), plugin.id().to_owned());
    metadata.insert("mergescope.plugin_version".to_owned(), plugin.version().to_owned());
    metadata.insert("mergescope.params".to_owned(), params_json.to_string());
    metadata.insert("mergescope.seed".to_owned(), seed.to_string());
    metadata.insert("mergescope.inputs".to_owned(), Value::from(inputs).to_string());
    if !notes.is_empty() {
        metadata.insert("mergescope.notes".to_owned(), Value::from(notes.to_vec()).to_string());
    }
    metadata
}

/// Writes tensors copied unchanged from `reference` (converted when the output dtype differs).
pub fn write_copies(writer: &OutputWriter, reference: &Checkpoint, copies: &[TensorEntry]) -> Result<()> {
    for t in copies {
        let out_dtype = writer.dtype(&t.name).unwrap_or(t.dtype);
        if out_dtype == t.dtype {
            writer.write(&t.name, 0, &reference.raw_bytes(t)?)?;
        } else {
            writer.write_values(&t.name, 0, &decode_f32_vec(t.dtype, &reference.raw_bytes(t)?))?;
        }
    }
    Ok(())
}

/// A plugin instance and the tensors it merges: the whole model, or with layer-wise parameters
/// ([`layered`]) one group of tensors that share parameter values.
pub struct InstanceGroup<'p> {
    instance: Instance<'p>,
    resolved: ResolvedParams,
    items: Vec<PlanItem>,
}

/// The instances of a merge of `items`: `single` (the instance made before the inputs were
/// checked, when no parameter is layer-wise), or one per group of tensors sharing values, the
/// layer-wise values resolved on `param_names` (the items' names unless given; a slice merged on
/// its own gives them with its layers numbered from 0).
#[allow(clippy::too_many_arguments)]
pub fn instance_groups<'p>(
    plugin: &'p Plugin,
    params: &Value,
    single: Option<(Instance<'p>, ResolvedParams)>,
    seed: u64,
    has_base: bool,
    n_experts: usize,
    env: CallEnv<'_>,
    items: &[PlanItem],
    param_names: Option<&[String]>,
) -> Result<Vec<InstanceGroup<'p>>> {
    if let Some((instance, resolved)) = single {
        return Ok(vec![InstanceGroup {
            instance,
            resolved,
            items: items.to_vec(),
        }]);
    }
    let names: Vec<String> = match param_names {
        Some(n) => n.to_vec(),
        None => items.iter().map(|i| i.name.clone()).collect(),
    };
    layered::split(params, plugin.schema(), &names)?
        .unwrap_or_default()
        .into_iter()
        .map(|g| {
            let (instance, resolved) = create_instance(per_tensor(plugin)?, &g.params, seed, has_base, n_experts, env)?;
            let items = g.tensors.iter().map(|i| items[*i].clone()).collect();
            Ok(InstanceGroup {
                instance,
                resolved,
                items,
            })
        })
        .collect()
}

/// What runs every group of a merge share.
pub struct GroupRun<'a> {
    plugin_id: &'a str,
    has_base: bool,
    n_experts: usize,
    opts: &'a ExecOptions,
    observer: Observer<'a>,
    cancel: &'a AtomicBool,
    /// Where its counts sit in a larger whole: the elements done before it and the whole's
    /// total ([`GroupRun::within`]).
    span: Option<(u64, u64)>,
}

/// The elements of `items`, what progress counts.
pub fn elements(items: &[PlanItem]) -> u64 {
    items.iter().map(|i| i.numel() as u64).sum()
}

impl<'a> GroupRun<'a> {
    /// A run of `plugin` over a merge of `n_experts` experts, with a base or not.
    pub fn new(
        plugin: &'a Plugin,
        has_base: bool,
        n_experts: usize,
        opts: &'a ExecOptions,
        observer: Observer<'a>,
        cancel: &'a AtomicBool,
    ) -> Self {
        GroupRun {
            plugin_id: plugin.id(),
            has_base,
            n_experts,
            opts,
            observer,
            cancel,
            span: None,
        }
    }

    /// This run as part of a larger whole of `total` elements, `done_before` of them done
    /// before it: its progress is reported shifted by `done_before`, out of `total`.
    pub fn within(self, done_before: u64, total: u64) -> Self {
        GroupRun {
            span: Some((done_before, total)),
            ..self
        }
    }

    /// Runs every group's instance over its tensors, reporting progress over the whole merge
    /// (each group's counts shifted by the elements of the groups before it, and by those
    /// before the run when it is [`GroupRun::within`] a larger whole).
    pub fn execute(&self, groups: &[InstanceGroup<'_>], source: &dyn Source, sink: &dyn Sink) -> Result<()> {
        let (start, total) = self
            .span
            .unwrap_or_else(|| (0, groups.iter().map(|g| elements(&g.items)).sum()));
        let mut done_before = start;
        for group in groups {
            let offset = done_before;
            let progress = |p: &Progress| {
                if groups.len() == 1 && self.span.is_none() {
                    (self.observer.progress)(p);
                } else {
                    (self.observer.progress)(&Progress {
                        done: offset + p.done,
                        total,
                        ..p.clone()
                    });
                }
            };
            Run {
                instance: &group.instance,
                plugin_id: self.plugin_id,
                items: &group.items,
                source,
                sink,
                has_base: self.has_base,
                n_experts: self.n_experts,
                opts: self.opts,
                observer: Observer {
                    progress: &progress,
                    log: self.observer.log,
                },
                cancel: self.cancel,
            }
            .execute()?;
            done_before += elements(&group.items);
        }
        Ok(())
    }
}

/// The parameters an output records: the resolved values with defaults; for a layer-wise merge,
/// the user's layer-wise values (gradients, filters) in place of one group's numbers, so that
/// the record replays the whole merge.
pub fn recorded_params(groups: &[InstanceGroup<'_>], user: &Value, layer_wise: bool) -> Value {
    let mut json = groups.first().map_or_else(|| user.clone(), |g| g.resolved.to_json());
    if layer_wise && let (Some(out), Some(given)) = (json.as_object_mut(), user.as_object()) {
        for (key, value) in given {
            out.insert(key.clone(), value.clone());
        }
    }
    json
}

/// What a merge of opened checkpoints writes and records, beyond its inputs.
#[derive(Clone, Copy, Debug)]
pub struct MergeJob<'a> {
    /// Parameters as given by the user (JSON object).
    pub params: &'a Value,
    /// Seed recorded in the output and given to the plugin.
    pub seed: u64,
    /// Output file (or folder); checked against every input before anything is merged.
    pub out: &'a Path,
    /// Output dtype of merged tensors (default: the input's).
    pub out_dtype: Option<OutDType>,
    /// What to do with tensors not every input has.
    pub on_missing: MissingPolicy,
}

/// Opens the writer of a merge's output once its tensors and header metadata are known: given
/// the output tensors, the metadata, the reference input and every input (base first when the
/// merge has one). Returns the writer and notes on what the output could not include.
pub type OpenOutput<'a> = &'a dyn Fn(
    &[OutputTensor],
    &BTreeMap<String, String>,
    &Checkpoint,
    &[&Checkpoint],
) -> Result<(OutputWriter, Vec<String>)>;

/// Merges opened checkpoints with `plugin`, streaming tensor by tensor: checks the output path
/// and the parameters, checks the inputs fit together, plans the output, writes the copies and
/// the merged tensors through the writer `open_output` gives, and commits it atomically.
#[allow(clippy::too_many_arguments)]
pub fn merge_checkpoints(
    plugin: &Plugin,
    job: &MergeJob<'_>,
    base: Option<&Checkpoint>,
    experts: &[Checkpoint],
    open_output: OpenOutput<'_>,
    opts: &ExecOptions,
    observer: Observer<'_>,
    cancel: &AtomicBool,
) -> Result<MergeReport> {
    let started = Instant::now();
    let mut models: Vec<&Checkpoint> = Vec::new();
    models.extend(base);
    models.extend(experts.iter());
    check_output_path(job.out, &models)?;
    let env = CallEnv {
        device: &opts.device,
        cancel,
        log: observer.log,
        threads: opts.threads,
    };
    let (layer_wise, single) = plain_instance(plugin, job.params, job.seed, base.is_some(), experts.len(), env)?;

    let descs: Vec<ModelDesc> = models.iter().map(|c| file_desc(c)).collect();
    let labels: Vec<String> = models.iter().map(|c| file_label(&c.path)).collect();
    let others: Vec<&ModelDesc> = descs[1..].iter().collect();
    let report = compat::check(&labels, &descs[0], &others, job.on_missing).map_err(EngineError::Incompatible)?;
    let reference = models[0];

    let Plan {
        items,
        outputs,
        copies,
        skipped,
    } = plan_outputs(&report.fates, reference, job.out_dtype);

    let groups = instance_groups(
        plugin,
        job.params,
        single,
        job.seed,
        base.is_some(),
        experts.len(),
        env,
        &items,
        None,
    )?;
    let params_json = recorded_params(&groups, job.params, layer_wise);
    let metadata = output_metadata(plugin, &params_json, job.seed, &models, base.is_some(), &report.notes);

    let (writer, output_notes) = open_output(&outputs, &metadata, reference, &models)?;
    write_copies(&writer, reference, &copies)?;
    let run = GroupRun::new(plugin, base.is_some(), experts.len(), opts, observer, cancel);
    run.execute(
        &groups,
        &FileSource { models: models.clone() },
        &FileSink { writer: &writer },
    )?;
    drop(groups);
    let files = writer.commit()?;
    Ok(MergeReport {
        files,
        merged: items.len(),
        copied: copies.len(),
        skipped,
        notes: report.notes.into_iter().chain(output_notes).collect(),
        input_bytes: models.iter().map(|c| c.total_bytes()).sum(),
        seconds: started.elapsed().as_secs_f64(),
        params: params_json,
    })
}

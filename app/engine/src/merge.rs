//! Merges: validate the request, check the inputs fit together, create the plugin instance,
//! stream the tensors through it, and write the output atomically with everything needed to
//! replay it in the header metadata.

use crate::checkpoint::{Checkpoint, TensorEntry};
use crate::compat::{self, MissingPolicy, ModelDesc, TensorFate};
use crate::dtype::{DType, OutDType, decode_f32_vec};
use crate::error::{EngineError, Result};
pub use crate::executor::{ExecOptions, Observer, Phase, Progress};
use crate::executor::{PlanItem, Run, Sink, Source};
use crate::hf_folder::{CardInfo, FolderOutput, folder_files};
use crate::layered;
use crate::plugin::Plugin;
use crate::plugin::instance::{CallEnv, Instance};
use crate::plugin::schema::{ResolvedParams, resolve_params};
use crate::slices::{self, Slice};
use crate::writer::{OutputLayout, OutputTensor, OutputWriter};
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
pub(crate) fn per_tensor(plugin: &Plugin) -> Result<&Plugin> {
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
    let layer_wise = layered::is_layered(params, plugin.schema())?;
    let single = if layer_wise {
        None
    } else {
        Some(create_instance(
            per_tensor(plugin)?,
            params,
            seed,
            base.is_some(),
            experts.len(),
            env,
        )?)
    };
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

/// Builder methods `name(field: Type)` that set `self.field` and return the request.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($field:ident: $ty:ty);)+) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )+
    };
}

/// A merge of checkpoint files, as the CLI, the GUI and recipes describe it.
#[derive(Clone, Debug)]
pub struct MergeRequest {
    /// Parameters as given by the user (JSON object).
    pub params: Value,
    /// Seed recorded in the output and given to the plugin.
    pub seed: u64,
    /// Base checkpoint.
    pub base: Option<PathBuf>,
    /// Expert checkpoints.
    pub experts: Vec<PathBuf>,
    /// Output file (or folder for shards).
    pub out: PathBuf,
    /// Output dtype of merged tensors (default: the input's).
    pub out_dtype: Option<OutDType>,
    /// Largest shard in bytes (None: as the reference input; Some(0): one file).
    pub shard_bytes: Option<u64>,
    /// What to do with tensors not every input has.
    pub on_missing: MissingPolicy,
    /// Replace an existing output.
    pub overwrite: bool,
    /// Write a Hugging Face model folder (config, tokenizer, card beside the weights) instead of
    /// a bare file; `None`: a `.safetensors` file (or a folder of shards when split).
    pub folder: Option<FolderOutput>,
    /// Layer slices of several models that stand for the inputs (mergekit's `slices`); empty:
    /// the inputs are the whole base and expert checkpoints.
    pub slices: Vec<Slice>,
}

impl MergeRequest {
    /// A merge of `experts` into `out` with the defaults every caller starts from: no base, no
    /// parameters (the method's defaults), seed 0, the inputs' dtype and sharding, an error
    /// for tensors not every input has, and no overwriting.
    pub fn new(experts: Vec<PathBuf>, out: impl Into<PathBuf>) -> MergeRequest {
        MergeRequest {
            params: Value::Object(serde_json::Map::new()),
            seed: 0,
            base: None,
            experts,
            out: out.into(),
            out_dtype: None,
            shard_bytes: None,
            on_missing: MissingPolicy::Error,
            overwrite: false,
            folder: None,
            slices: Vec::new(),
        }
    }

    setters! {
        /// Sets the base checkpoint.
        with_base(base: Option<PathBuf>);
        /// Sets the method's parameters (a JSON object of the user's values).
        with_params(params: Value);
        /// Sets the seed recorded in the output and given to the plugin.
        with_seed(seed: u64);
        /// Lets the merge replace an existing output (mergescope's own outputs only).
        overwriting(overwrite: bool);
    }

    /// The largest shard in bytes for an output of `reference`: as asked, else as the reference
    /// input's largest shard when it is sharded, else one file (`Some(0)` asks for one file).
    pub fn shard_limit(&self, reference: &Checkpoint) -> Option<u64> {
        match self.shard_bytes {
            Some(0) => None,
            Some(b) => Some(b),
            None if reference.is_sharded() => reference.files.iter().map(|f| f.size).max(),
            None => None,
        }
    }
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

pub(crate) struct FileSource<'a> {
    pub(crate) models: Vec<&'a Checkpoint>,
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

pub(crate) struct FileSink<'a> {
    pub(crate) writer: &'a OutputWriter,
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

pub fn file_desc(c: &Checkpoint) -> ModelDesc {
    c.tensors
        .iter()
        .map(|(k, t)| (k.clone(), (t.dtype, t.shape.clone())))
        .collect()
}

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

/// Opens an expert: a checkpoint, or a LoRA adapter applied to the base.
pub fn open_expert(path: &Path, base: Option<&Path>) -> Result<Checkpoint> {
    if !crate::lora::is_adapter(path) {
        return Checkpoint::open(path);
    }
    let base = base.ok_or_else(|| {
        EngineError::Invalid(format!(
            "the expert '{}' is a LoRA adapter; pass the model it was trained on as --base",
            path.display()
        ))
    })?;
    crate::lora::apply(Checkpoint::open(base)?, path)
}

/// Opens the inputs of `req`: the base (when given) and the experts, whole or assembled from
/// their layer slices.
pub fn open_inputs(req: &MergeRequest) -> Result<(Option<Checkpoint>, Vec<Checkpoint>)> {
    let tokenizer = req.folder.as_ref().and_then(|f| f.tokenizer.as_ref());
    if req.slices.is_empty() {
        let mut base = req.base.as_deref().map(Checkpoint::open).transpose()?;
        let mut experts: Vec<Checkpoint> = req
            .experts
            .iter()
            .map(|p| open_expert(p, req.base.as_deref()))
            .collect::<Result<_>>()?;
        // Inputs with different tokenizers: their vocabulary tensors read aligned to the output's.
        if let Some(spec) = tokenizer {
            let paths: Vec<PathBuf> = req.base.iter().chain(req.experts.iter()).cloned().collect();
            if let Some(plan) = crate::tokenizer_union::VocabPlan::build(spec, &paths)? {
                let mut all: Vec<&mut Checkpoint> = base.iter_mut().chain(experts.iter_mut()).collect();
                plan.align(&mut all)?;
            }
        }
        return Ok((base, experts));
    }
    let has_base = usize::from(req.base.is_some());
    let inputs = has_base + req.experts.len();
    slices::check(&req.slices, req.base.is_some(), req.experts.len())?;
    if slices::is_slice_by_slice(&req.slices, inputs) {
        return Err(EngineError::Bug(
            "the inputs of a merge slice by slice are each slice's own (slices::merge_slice_by_slice)".to_owned(),
        ));
    }
    let mut opened: Vec<Checkpoint> = (0..inputs)
        .map(|k| slices::open_input(&req.slices, k))
        .collect::<Result<_>>()?;
    if let Some(spec) = tokenizer {
        slices::align(&req.slices, spec, &mut opened)?;
    }
    let experts = opened.split_off(has_base);
    Ok((opened.pop(), experts))
}

/// Opens the writer of `req`'s output: a file (or shard folder), or a Hugging Face model folder
/// whose config, tokenizer and card come from the inputs (`models`, base first when `has_base`).
/// Returns notes on what a folder output could not find.
pub fn open_output(
    req: &MergeRequest,
    outputs: &[OutputTensor],
    metadata: &BTreeMap<String, String>,
    reference: &Checkpoint,
    models: &[&Checkpoint],
    has_base: bool,
) -> Result<(OutputWriter, Vec<String>)> {
    let Some(folder) = &req.folder else {
        let writer = OutputWriter::create(&req.out, outputs, metadata, req.shard_limit(reference), req.overwrite)?;
        return Ok((writer, Vec::new()));
    };
    let params: Value = metadata
        .get("mergescope.params")
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or(Value::Null);
    let method = metadata.get("mergescope.method").map_or("", String::as_str);
    let version = metadata.get("mergescope.plugin_version").map_or("", String::as_str);
    let card = CardInfo {
        method: (method, version),
        inputs: models
            .iter()
            .enumerate()
            .map(|(i, c)| (if has_base && i == 0 { "base" } else { "expert" }, c.path.as_path()))
            .collect(),
        params: &params,
        seed: req.seed,
    };
    let paths: Vec<&Path> = models.iter().map(|c| c.path.as_path()).collect();
    let layers = (!req.slices.is_empty()).then(|| slices::layer_count(&req.slices));
    let (files, notes) = folder_files(folder, &paths, req.out_dtype.map(OutDType::dtype), layers, &card)?;
    let writer = OutputWriter::create_with_layout(
        &req.out,
        outputs,
        metadata,
        req.shard_limit(reference),
        req.overwrite,
        &OutputLayout::Folder(files),
    )?;
    Ok((writer, notes))
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
pub(crate) struct InstanceGroup<'p> {
    instance: Instance<'p>,
    resolved: ResolvedParams,
    items: Vec<PlanItem>,
}

/// The instances of a merge of `items`: `single` (the instance made before the inputs were
/// checked, when no parameter is layer-wise), or one per group of tensors sharing values, the
/// layer-wise values resolved on `param_names` (the items' names unless given; a slice merged on
/// its own gives them with its layers numbered from 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn instance_groups<'p>(
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
pub(crate) struct GroupRun<'a> {
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
pub(crate) fn elements(items: &[PlanItem]) -> u64 {
    items.iter().map(|i| i.numel() as u64).sum()
}

impl<'a> GroupRun<'a> {
    /// A run of `plugin` over a merge of `n_experts` experts, with a base or not.
    pub(crate) fn new(
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
    pub(crate) fn within(self, done_before: u64, total: u64) -> Self {
        GroupRun {
            span: Some((done_before, total)),
            ..self
        }
    }

    /// Runs every group's instance over its tensors, reporting progress over the whole merge
    /// (each group's counts shifted by the elements of the groups before it, and by those
    /// before the run when it is [`GroupRun::within`] a larger whole).
    pub(crate) fn execute(&self, groups: &[InstanceGroup<'_>], source: &dyn Source, sink: &dyn Sink) -> Result<()> {
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
pub(crate) fn recorded_params(groups: &[InstanceGroup<'_>], user: &Value, layer_wise: bool) -> Value {
    let mut json = groups.first().map_or_else(|| user.clone(), |g| g.resolved.to_json());
    if layer_wise && let (Some(out), Some(given)) = (json.as_object_mut(), user.as_object()) {
        for (key, value) in given {
            out.insert(key.clone(), value.clone());
        }
    }
    json
}

/// Merges checkpoint files with `plugin`, streaming tensor by tensor.
pub fn merge_files(
    plugin: &Plugin,
    req: &MergeRequest,
    opts: &ExecOptions,
    observer: Observer<'_>,
    cancel: &AtomicBool,
) -> Result<MergeReport> {
    let started = Instant::now();
    if !req.slices.is_empty()
        && slices::is_slice_by_slice(&req.slices, usize::from(req.base.is_some()) + req.experts.len())
    {
        return slices::merge_slice_by_slice(plugin, req, opts, observer, cancel);
    }
    let (base, experts) = open_inputs(req)?;
    let mut models: Vec<&Checkpoint> = Vec::new();
    models.extend(base.as_ref());
    models.extend(experts.iter());
    check_output_path(&req.out, &models)?;
    let env = CallEnv {
        device: &opts.device,
        cancel,
        log: observer.log,
        threads: opts.threads,
    };
    // Plain parameters are checked before the inputs are; layer-wise ones once the tensors are
    // known (each group of tensors sharing values gets its own instance).
    let layer_wise = layered::is_layered(&req.params, plugin.schema())?;
    let single = if layer_wise {
        None
    } else {
        Some(create_instance(
            per_tensor(plugin)?,
            &req.params,
            req.seed,
            base.is_some(),
            experts.len(),
            env,
        )?)
    };

    let descs: Vec<ModelDesc> = models.iter().map(|c| file_desc(c)).collect();
    let labels: Vec<String> = models.iter().map(|c| file_label(&c.path)).collect();
    let others: Vec<&ModelDesc> = descs[1..].iter().collect();
    let report = compat::check(&labels, &descs[0], &others, req.on_missing).map_err(EngineError::Incompatible)?;
    let reference = models[0];

    let Plan {
        items,
        outputs,
        copies,
        skipped,
    } = plan_outputs(&report.fates, reference, req.out_dtype);

    let groups = instance_groups(
        plugin,
        &req.params,
        single,
        req.seed,
        base.is_some(),
        experts.len(),
        env,
        &items,
        None,
    )?;
    let params_json = recorded_params(&groups, &req.params, layer_wise);
    let metadata = output_metadata(plugin, &params_json, req.seed, &models, base.is_some(), &report.notes);

    let (writer, folder_notes) = open_output(req, &outputs, &metadata, reference, &models, base.is_some())?;
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
        notes: report.notes.into_iter().chain(folder_notes).collect(),
        input_bytes: models.iter().map(|c| c.total_bytes()).sum(),
        seconds: started.elapsed().as_secs_f64(),
        params: params_json,
    })
}

//! Merge requests as the CLI, the window and recipes describe them: the base and experts by
//! path (checkpoints, PEFT LoRA adapters, or checkpoints assembled from layer slices), the
//! output as a file, a shard folder or a Hugging Face model folder, and the tokenizer the
//! output speaks. [`merge_files`] opens what a request names and streams it through the
//! engine's one merge ([`mergescope_engine::merge::merge_checkpoints`]).

use crate::hf_folder::{CardInfo, FolderOutput, folder_files};
use crate::slices::{self, Slice};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::dtype::OutDType;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::{ExecOptions, MergeJob, MergeReport, Observer, merge_checkpoints};
use mergescope_engine::plugin::Plugin;
use mergescope_engine::writer::{OutputLayout, OutputTensor, OutputWriter};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

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

/// Merges the checkpoint files `req` names with `plugin`, streaming tensor by tensor: slice by
/// slice when its slices merge different models or carry their own parameters, else its
/// inputs opened ([`open_inputs`]) and merged by the engine into the output [`open_output`]
/// writes.
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
    let job = MergeJob {
        params: &req.params,
        seed: req.seed,
        out: &req.out,
        out_dtype: req.out_dtype,
        on_missing: req.on_missing,
    };
    let has_base = base.is_some();
    let output =
        |outputs: &[OutputTensor],
         metadata: &BTreeMap<String, String>,
         reference: &Checkpoint,
         models: &[&Checkpoint]| { open_output(req, outputs, metadata, reference, models, has_base) };
    let mut report = merge_checkpoints(plugin, &job, base.as_ref(), &experts, &output, opts, observer, cancel)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_engine::error::ErrorKind;

    /// A small f32 checkpoint of one tensor at `path`.
    fn checkpoint(path: &Path) {
        let data: Vec<u8> = [1f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
        safetensors::serialize_to_file([("w", view)], None, path).unwrap();
    }

    #[test]
    fn a_broken_input_is_an_input_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.safetensors");
        checkpoint(&base);

        // A path that does not exist.
        let missing = dir.path().join("nowhere.safetensors");
        let e = open_expert(&missing, Some(&base)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(
            matches!(&e, EngineError::Input { path, .. } if path == &missing),
            "{e:?}"
        );
        assert!(e.to_string().contains("does not exist"), "{e}");

        // A LoRA adapter saved without its safetensors weights.
        let adapter = dir.path().join("adapter");
        std::fs::create_dir(&adapter).unwrap();
        std::fs::write(adapter.join("adapter_config.json"), r#"{"r": 4, "lora_alpha": 8}"#).unwrap();
        std::fs::write(adapter.join("adapter_model.bin"), b"pickle").unwrap();
        let e = open_expert(&adapter, Some(&base)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(
            matches!(&e, EngineError::Input { path, .. } if path == &adapter),
            "{e:?}"
        );
        assert!(e.to_string().contains("safe_serialization=True"), "{e}");
    }
}

//! A sliced merge merged slice by slice (see [`super`]'s module doc): each slice's sources are
//! the inputs of a merge of its own, run by instances of the method made for its number of
//! models with its own parameters, and every slice writes its tensors into the one output,
//! written atomically as any merge's. Inputs are read tensor by tensor as in any merge.

use super::{Slice, align, check, open_slice_input};
use crate::request::{MergeRequest, open_output};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::executor::{ExecOptions, Observer};
use mergescope_engine::layered::layer_position;
use mergescope_engine::merge::{
    FileSink, FileSource, GroupRun, InstanceGroup, MergeReport, Plan, check_output_path, elements, file_desc,
    file_label, instance_groups, output_metadata, plain_instance, plan_outputs, recorded_params, write_copies,
};
use mergescope_engine::plugin::Plugin;
use mergescope_engine::plugin::instance::CallEnv;
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// One slice merged on its own.
struct Part<'p> {
    /// Its inputs: the slice's base first when the merge has one, then its other models.
    inputs: Vec<Checkpoint>,
    /// What it writes.
    plan: Plan,
    /// Its instances and the tensors each merges.
    groups: Vec<InstanceGroup<'p>>,
    /// The parameters it records (the recipe's overlaid by the slice's, resolved).
    recorded: Value,
}

/// `error` in slice `what`: a parameter or input problem named with the slice.
fn in_slice(what: &str, error: EngineError) -> EngineError {
    match error {
        EngineError::Param(m) => {
            EngineError::Param(format!("{what} (the recipe's params with the slice's over them): {m}"))
        }
        EngineError::Invalid(m) => EngineError::Invalid(format!("{what}: {m}")),
        other => other,
    }
}

/// The parameters of `slice`: the recipe's `params` (a JSON object) with the slice's own over
/// them, key by key.
fn slice_params(params: &Value, slice: &Slice, what: &str) -> Result<Value> {
    let mut out = match params {
        Value::Object(m) => m.clone(),
        Value::Null => serde_json::Map::new(),
        other => {
            return Err(EngineError::Param(format!(
                "parameters must be a table of name = value, got {other}"
            )));
        }
    };
    if let Some(own) = &slice.params {
        match crate::recipe::toml_to_json(&toml::Value::Table(own.clone())) {
            Value::Object(m) => out.extend(m),
            other => return Err(EngineError::Bug(format!("{what}.params read as {other}"))),
        }
    }
    Ok(Value::Object(out))
}

/// `name` with its layer numbered within a slice whose first layer is output layer `offset`.
fn slice_local(name: &str, offset: usize) -> String {
    let mut parts: Vec<String> = name.split('.').map(str::to_owned).collect();
    let position = layer_position(&parts.iter().map(String::as_str).collect::<Vec<_>>());
    if let Some((at, layer)) = position {
        parts[at] = layer.saturating_sub(offset).to_string();
    }
    parts.join(".")
}

/// Merges `req`, whose slices are merged one by one ([`super::is_slice_by_slice`]), with
/// `plugin` into its output; what [`crate::request::merge_files`] does for such a request.
pub(crate) fn merge_files(
    plugin: &Plugin,
    req: &MergeRequest,
    opts: &ExecOptions,
    observer: Observer<'_>,
    cancel: &AtomicBool,
) -> Result<MergeReport> {
    let started = Instant::now();
    let has_base = req.base.is_some();
    check(&req.slices, has_base, req.experts.len())?;
    let tokenizer = req.folder.as_ref().and_then(|f| f.tokenizer.as_ref());
    let env = CallEnv {
        device: &opts.device,
        cancel,
        log: observer.log,
        threads: opts.threads,
    };
    // Every slice's inputs, headers only.
    let mut opened: Vec<(Vec<Checkpoint>, usize)> = Vec::with_capacity(req.slices.len());
    for (si, slice) in req.slices.iter().enumerate() {
        let mut inputs = Vec::with_capacity(slice.sources.len());
        let mut offset = 0;
        for k in 0..slice.sources.len() {
            let (input, first_layer) = open_slice_input(&req.slices, si, k)?;
            inputs.push(input);
            offset = first_layer;
        }
        if let Some(spec) = tokenizer {
            align(std::slice::from_ref(slice), spec, &mut inputs)?;
        }
        opened.push((inputs, offset));
    }
    let all: Vec<&Checkpoint> = opened.iter().flat_map(|(inputs, _)| inputs.iter()).collect();
    check_output_path(&req.out, &all)?;

    let mut parts: Vec<Part> = Vec::with_capacity(opened.len());
    let mut notes = Vec::new();
    for (si, (inputs, offset)) in opened.into_iter().enumerate() {
        let what = format!("slices[{si}]");
        let n_experts = inputs.len() - usize::from(has_base);
        if n_experts == 0 {
            // The base alone: its tensors as they are (nothing is merged into it).
            let descs: Vec<_> = inputs.iter().map(file_desc).collect();
            let report = compat::check(&[format!("{what}.sources[0]")], &descs[0], &[], req.on_missing)
                .map_err(EngineError::Incompatible)?;
            let mut plan = plan_outputs(&report.fates, &inputs[0], req.out_dtype);
            let copied: Vec<_> = plan
                .items
                .drain(..)
                .filter_map(|i| inputs[0].tensors.get(&i.name).cloned())
                .collect();
            plan.copies.extend(copied);
            parts.push(Part {
                inputs,
                plan,
                groups: Vec::new(),
                recorded: Value::Null,
            });
            continue;
        }
        let params = slice_params(&req.params, &req.slices[si], &what)?;
        let (layer_wise, single) =
            plain_instance(plugin, &params, req.seed, has_base, n_experts, env).map_err(|e| in_slice(&what, e))?;
        let descs: Vec<_> = inputs.iter().map(file_desc).collect();
        let labels: Vec<String> = inputs
            .iter()
            .enumerate()
            .map(|(k, c)| format!("{} ({what}.sources[{k}])", file_label(&c.path)))
            .collect();
        let others: Vec<_> = descs[1..].iter().collect();
        let report = compat::check(&labels, &descs[0], &others, req.on_missing).map_err(EngineError::Incompatible)?;
        let plan = plan_outputs(&report.fates, &inputs[0], req.out_dtype);
        let local: Vec<String> = plan.items.iter().map(|i| slice_local(&i.name, offset)).collect();
        let groups = instance_groups(
            plugin,
            &params,
            single,
            req.seed,
            has_base,
            n_experts,
            env,
            &plan.items,
            Some(&local),
        )
        .map_err(|e| in_slice(&what, e))?;
        let recorded = recorded_params(&groups, &params, layer_wise);
        notes.extend(report.notes.into_iter().map(|n| format!("{what}: {n}")));
        parts.push(Part {
            inputs,
            plan,
            groups,
            recorded,
        });
    }

    // One output: every slice's tensors, each written once.
    let mut outputs: Vec<_> = parts.iter().flat_map(|p| p.plan.outputs.iter().cloned()).collect();
    outputs.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = outputs.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(EngineError::Bug(format!(
            "tensor '{}' is made by two slices",
            w[0].name
        )));
    }
    // The metadata names the inputs and parameters of the first slice that merges something.
    let Some(first) = parts.iter().find(|p| !p.groups.is_empty()).or(parts.first()) else {
        return Err(EngineError::Invalid(
            "a sliced merge needs at least one slice".to_owned(),
        ));
    };
    let models: Vec<&Checkpoint> = first.inputs.iter().collect();
    let params_json = first.recorded.clone();
    let mut metadata = output_metadata(plugin, &params_json, req.seed, &models, has_base, &notes);
    let per_slice: Vec<Value> = parts.iter().map(|p| p.recorded.clone()).collect();
    metadata.insert("mergescope.slice_params".to_owned(), Value::from(per_slice).to_string());
    let (writer, folder_notes) = open_output(req, &outputs, &metadata, &first.inputs[0], &models, has_base)?;
    for part in &parts {
        write_copies(&writer, &part.inputs[0], &part.plan.copies)?;
    }
    let total: u64 = parts.iter().map(|p| elements(&p.plan.items)).sum();
    let mut done_before = 0u64;
    for part in parts.iter().filter(|p| !p.groups.is_empty()) {
        let n_experts = part.inputs.len() - usize::from(has_base);
        GroupRun::new(plugin, has_base, n_experts, opts, observer, cancel)
            .within(done_before, total)
            .execute(
                &part.groups,
                &FileSource {
                    models: part.inputs.iter().collect(),
                },
                &FileSink { writer: &writer },
            )?;
        done_before += elements(&part.plan.items);
    }
    let report = MergeReport {
        files: Vec::new(),
        merged: parts.iter().map(|p| p.plan.items.len()).sum(),
        copied: parts.iter().map(|p| p.plan.copies.len()).sum(),
        skipped: parts.iter().map(|p| p.plan.skipped).sum(),
        notes: notes.into_iter().chain(folder_notes).collect(),
        input_bytes: all_bytes(&parts),
        seconds: 0.0,
        params: params_json,
    };
    drop(parts);
    let files = writer.commit()?;
    Ok(MergeReport {
        files,
        seconds: started.elapsed().as_secs_f64(),
        ..report
    })
}

/// The bytes of the models the slices read, each counted once.
fn all_bytes(parts: &[Part]) -> u64 {
    let mut seen = std::collections::BTreeMap::new();
    for c in parts.iter().flat_map(|p| p.inputs.iter()) {
        seen.entry(c.path.clone()).or_insert_with(|| c.total_bytes());
    }
    seen.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_numbered_within_the_slice() {
        assert_eq!(
            slice_local("model.layers.7.mlp.up_proj.weight", 5),
            "model.layers.2.mlp.up_proj.weight"
        );
        assert_eq!(slice_local("model.norm.weight", 5), "model.norm.weight");
    }
}

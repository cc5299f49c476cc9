//! mergekit's `slices` (at the top level or in a module), read slice by slice: each slice's
//! sources matched to the recipe's inputs by role, and each tensor's parameters resolved from the
//! slice that produces it, as mergekit 0.1.5 does.
//!
//! What mergekit does (`mergekit/plan.py`, `config.py`, `parameter_resolver.py`):
//!
//! - every slice is merged on its own (`MergePlanner.plan_slice`), with its own sources: the
//!   method's contract is checked per slice (`normalize_config`: the base among the slice's
//!   sources when the method has a base, no model twice), so slices may name other models;
//! - a tensor's parameter is the first of the source's own `parameters` (per-model parameters
//!   only), the slice's `parameters`, the module's and the top level's that gives a value
//!   (`ConfigReader.parameter_sources`, `resolve_parameter`; a filter list no entry of which
//!   matches gives none and falls through);
//! - a gradient's position restarts in every slice: layer i of a slice of n layers is at
//!   t = i / (n − 1), 1 for a one-layer slice (`plan_slice`);
//! - the weights before the layers are merged from `slices[0]`'s sources with its parameters, those
//!   after them from `slices[-1]`'s, both at t = 0 (`plan_module`).
//!
//! How mergescope does it: when every slice merges as many models, input k of the merge is
//! assembled from the k-th source of every slice (the base first, then the other sources in the
//! slice's order; [`crate::slices`]). When the numbers differ, the recipe's slices are merged one
//! by one ([`crate::slices`], "Slice by slice"): each slice's sources, its own `params` resolved
//! for it alone (gradients kept as gradients, which the host evaluates over the slice's own
//! layers), and no top-level parameters; every slice must then have a base when one has (inside
//! `modules` too: [`super::modules`]). Otherwise, a parameter that takes the same value
//! in every slice stays as given (a gradient over the output layers is the same as mergekit's when
//! there is one slice); one that differs between slices, or a gradient with several slices, becomes
//! a `{filter, value}` list with an entry per output layer (its tensors' name prefix and number,
//! e.g. `model.layers.7.`), each gradient evaluated at the layer's position in its slice, an entry
//! per pre-layer tensor (from the first slice) and a last entry for the other tensors (from the
//! last slice), which the host resolves per tensor for every plugin ([`mergescope_engine::layered`]).

use super::methods::Mapping;
use super::{Entry, add_new_notes, check_keys, invalid, params_of};
use crate::recipe::params_to_toml;
use crate::slices::{ModuleScope, Slice, SliceSource, from_first_slice};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::Result;
use mergescope_engine::layered::layer_position;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Keys of a slice.
const SLICE_KEYS: &[&str] = &["sources", "parameters", "base_model", "residual_weight"];

/// One source of a slice, as the configuration gives it.
#[derive(Clone, Debug)]
pub(crate) struct SourceDef {
    pub model: PathBuf,
    pub layers: [usize; 2],
    pub params: Map<String, Value>,
    /// How messages name it (`slices[1].sources[0]`).
    pub what: String,
}

/// One slice, as the configuration gives it.
#[derive(Clone, Debug)]
pub(crate) struct SliceDef {
    pub sources: Vec<SourceDef>,
    /// The slice's own `parameters`.
    pub params: Map<String, Value>,
    /// The slice's own `base_model` (mergekit's `OutputSliceDefinition.base_model`).
    pub base: Option<PathBuf>,
    /// How messages name it (`slices[1]`).
    pub what: String,
}

impl SliceDef {
    /// Number of layers the slice makes.
    fn len(&self) -> usize {
        self.sources.first().map_or(0, |s| s.layers[1] - s.layers[0])
    }
}

/// Reads `slices` (the value of `key`). `allow_empty` lets a source take layers [0, 0) (a module
/// without layers).
pub(crate) fn read(
    file: &Path,
    key: &str,
    slices: &Value,
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
    allow_empty: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<SliceDef>> {
    let list = slices
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| invalid(file, format!("'{key}' must be a non-empty list of {{sources: [...]}}")))?;
    let mut out = Vec::with_capacity(list.len());
    for (si, slice) in list.iter().enumerate() {
        let what = format!("{key}[{si}]");
        let obj = slice
            .as_object()
            .ok_or_else(|| invalid(file, format!("{what} must be a mapping with 'sources'")))?;
        check_keys(file, &what, obj, SLICE_KEYS)?;
        if obj.get("residual_weight").is_some_and(|v| !v.is_null()) {
            notes.push(format!(
                "{what}.residual_weight is ignored, as mergekit 0.1.5 ignores it (it reads it nowhere)"
            ));
        }
        let sources = obj
            .get("sources")
            .and_then(Value::as_array)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid(file, format!("{what} has no 'sources' list")))?;
        let mut defs = Vec::with_capacity(sources.len());
        for (k, src) in sources.iter().enumerate() {
            let what = format!("{what}.sources[{k}]");
            let obj = src
                .as_object()
                .ok_or_else(|| invalid(file, format!("{what} must be a mapping with 'model' and 'layer_range'")))?;
            check_keys(file, &what, obj, &["model", "layer_range", "parameters"])?;
            let model = model_ref(
                &what,
                obj.get("model")
                    .ok_or_else(|| invalid(file, format!("{what} has no 'model'")))?,
            )?;
            let layers = obj
                .get("layer_range")
                .and_then(Value::as_array)
                .and_then(|r| match r.as_slice() {
                    [a, b] => Some([a.as_u64()? as usize, b.as_u64()? as usize]),
                    _ => None,
                })
                .filter(|[a, b]| a < b || (allow_empty && *a == 0 && *b == 0))
                .ok_or_else(|| {
                    invalid(
                        file,
                        format!("{what}: layer_range must be [first, end) with first < end"),
                    )
                })?;
            defs.push(SourceDef {
                model,
                layers,
                params: params_of(file, &what, obj.get("parameters"))?,
                what,
            });
        }
        let span = |s: &SourceDef| s.layers[1] - s.layers[0];
        if let Some(src) = defs.iter().find(|s| span(s) != span(&defs[0])) {
            return Err(invalid(
                file,
                format!(
                    "{what}: its sources span different numbers of layers ({:?} and {:?} in {}); mergekit merges a \
                     slice's layers one to one (\"All inputs to a slice must contain the same number of layers\")",
                    defs[0].layers, src.layers, src.what
                ),
            ));
        }
        let base = match obj.get("base_model") {
            None | Some(Value::Null) => None,
            Some(v) => Some(model_ref(&format!("{what}.base_model"), v)?),
        };
        out.push(SliceDef {
            sources: defs,
            params: params_of(file, &what, obj.get("parameters"))?,
            base,
            what,
        });
    }
    Ok(out)
}

/// The base source (when the method uses one) and the other sources of one slice, in its order.
struct Roles<'s> {
    base: Option<&'s SourceDef>,
    others: Vec<&'s SourceDef>,
}

/// Matches a slice's sources to roles, as mergekit checks each slice (`InputContract.validate_ids`).
fn roles<'s>(file: &Path, mapping: &Mapping, top_base: Option<&Path>, slice: &'s SliceDef) -> Result<Roles<'s>> {
    for (i, a) in slice.sources.iter().enumerate() {
        if let Some(b) = slice.sources[i + 1..].iter().find(|b| b.model == a.model) {
            return Err(invalid(
                file,
                format!(
                    "{} and {} are the same model '{}'; mergekit merges each model once per slice (\"Duplicate merge \
                     inputs\")",
                    a.what,
                    b.what,
                    a.model.display()
                ),
            ));
        }
    }
    if !mapping.uses_base() {
        return Ok(Roles {
            base: None,
            others: slice.sources.iter().collect(),
        });
    }
    let base = slice.base.as_deref().or(top_base);
    let Some(base) = base else {
        if mapping.requires_base() {
            return Err(mapping.no_base(file));
        }
        return Ok(Roles {
            base: None,
            others: slice.sources.iter().collect(),
        });
    };
    let base_source = slice.sources.iter().find(|s| s.model == base).ok_or_else(|| {
        invalid(
            file,
            format!(
                "base_model '{}' is not among the sources of {}; mergekit merges every slice with its base among its \
                 sources (\"Base input is not present in merge inputs\"): list it as a source of every slice",
                base.display(),
                slice.what
            ),
        )
    })?;
    Ok(Roles {
        base: Some(base_source),
        others: slice.sources.iter().filter(|s| s.model != base).collect(),
    })
}

/// What a module's (or the top level's) slices become in the recipe.
pub(crate) struct Plan {
    /// The base of the first slice (the recipe's base), when the method has one.
    pub base: Option<PathBuf>,
    /// The other models of the first slice (the recipe's experts).
    pub experts: Vec<PathBuf>,
    /// The recipe's slices (sources in the order of its inputs: the base, then the others).
    pub slices: Vec<Slice>,
    /// The plugin's parameters.
    pub params: Map<String, Value>,
}

/// Plans `slices` with the method `mapping`: roles per slice, the recipe's slices, and the
/// parameters resolved per slice over `shared` (the top level's, or the module's chained over
/// the top level's). `scope` is the module the slices build; `expand_gradients` evaluates every
/// gradient per slice even for one slice (several modules: the host would count layers over
/// all of them). With `slice_by_slice` (or when the slices merge different numbers of models)
/// every slice gets its own parameters, to be merged on its own.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan(
    file: &Path,
    mapping: &Mapping,
    top_base: Option<&Path>,
    shared: &Map<String, Value>,
    slices: &[SliceDef],
    scope: Option<&ModuleScope>,
    expand_gradients: bool,
    slice_by_slice: bool,
    notes: &mut Vec<String>,
) -> Result<Plan> {
    let Some(first) = slices.first() else {
        return Err(invalid(file, "'slices' is empty"));
    };
    let roles: Vec<Roles> = slices
        .iter()
        .map(|s| roles(file, mapping, top_base, s))
        .collect::<Result<_>>()?;
    // Every slice has a base or none; the number of other models may differ (then every slice
    // is merged on its own, as mergekit merges it).
    let has_base = roles[0].base.is_some();
    for (slice, r) in slices.iter().zip(&roles) {
        // A slice of the base alone keeps the base's tensors (mergekit's task-vector methods
        // merge nothing into it).
        if r.others.is_empty() && (r.base.is_none() || !mapping.keeps_base_alone()) {
            return Err(invalid(
                file,
                format!("{}.sources lists no model to merge besides the base", slice.what),
            ));
        }
        if !r.others.is_empty() {
            mapping.check_expert_count(file, &slice.what, r.others.len())?;
        }
        if r.base.is_some() != has_base {
            return Err(invalid(
                file,
                format!(
                    "{}.sources: {} merges {} a base, {} {}; mergescope merges every slice with a base or every \
                     slice without one: give every slice a base_model (or none)",
                    slice.what,
                    slice.what,
                    if r.base.is_some() { "with" } else { "without" },
                    first.what,
                    if has_base { "with one" } else { "without" },
                ),
            ));
        }
    }
    // (A module may keep the base alone; the modules together must merge something.)
    if scope.is_none() && roles.iter().all(|r| r.others.is_empty()) {
        return Err(invalid(
            file,
            "every slice lists only the base: there is nothing to merge",
        ));
    }
    let uniform = !slice_by_slice && roles.iter().all(|r| r.others.len() == roles[0].others.len());
    if !mapping.uses_base()
        && let Some(b) = top_base
        && !slices.iter().any(|s| s.sources.iter().any(|src| src.model == b))
    {
        return Err(invalid(
            file,
            "base_model is not among the slices' sources; list it in a slice or remove it",
        ));
    }

    // Every key is one of the method's.
    for slice in slices {
        for key in slice.params.keys() {
            mapping.check_key(file, key, &format!("{}.parameters", slice.what), notes)?;
        }
        for src in &slice.sources {
            for key in src.params.keys() {
                mapping.check_key(file, key, &format!("{}.parameters", src.what), notes)?;
                if key != "int8_mask" && !mapping.is_per_model_key(key) {
                    notes.push(format!(
                        "'{key}' in {}.parameters is ignored, as mergekit ignores it: a model's own parameters \
                         give only the per-model ones (give '{key}' in the slice's or the top-level parameters)",
                        src.what
                    ));
                }
            }
        }
    }

    let (params, slice_params) = if uniform {
        let params = resolve(file, mapping, shared, slices, &roles, scope, expand_gradients, notes)?;
        (params, vec![None; slices.len()])
    } else {
        // Each slice's parameters on its own layers (the host numbers them within the slice).
        let mut per_slice = Vec::with_capacity(slices.len());
        for i in 0..slices.len() {
            let mut own = Vec::new();
            let p = resolve(
                file,
                mapping,
                shared,
                &slices[i..=i],
                &roles[i..=i],
                scope,
                false,
                &mut own,
            )?;
            add_new_notes(notes, own);
            per_slice.push(Some(params_to_toml(&p)));
        }
        (Map::new(), per_slice)
    };

    let recipe_slices = roles
        .iter()
        .zip(slice_params)
        .map(|(r, params)| Slice {
            sources: r
                .base
                .iter()
                .chain(r.others.iter())
                .map(|src| SliceSource {
                    model: src.model.clone(),
                    layers: src.layers,
                })
                .collect(),
            module: scope.cloned(),
            params,
        })
        .collect();
    // The recipe's inputs: those of the first slice that merges something.
    let lead = roles.iter().find(|r| !r.others.is_empty()).unwrap_or(&roles[0]);
    Ok(Plan {
        base: lead.base.map(|s| s.model.clone()),
        experts: lead.others.iter().map(|s| s.model.clone()).collect(),
        slices: recipe_slices,
        params,
    })
}

/// The plugin's parameters for `slices` (with their `roles`, as many other models in each):
/// each resolved per slice over `shared` and spread over the slices' output layers ([`Layout`]).
#[allow(clippy::too_many_arguments)]
fn resolve(
    file: &Path,
    mapping: &Mapping,
    shared: &Map<String, Value>,
    slices: &[SliceDef],
    roles: &[Roles],
    scope: Option<&ModuleScope>,
    expand_gradients: bool,
    notes: &mut Vec<String>,
) -> Result<Map<String, Value>> {
    let Some(first) = roles.first() else {
        return Ok(Map::new());
    };
    let has_base = first.base.is_some();
    let mut layout = Layout::new(slices, scope, expand_gradients);
    // Shared parameters: the slice's, then the top level's (or the module's).
    let mut shared_keys: BTreeSet<&String> = shared.keys().collect();
    shared_keys.extend(slices.iter().flat_map(|s| s.params.keys()));
    let mut shared_out = Map::new();
    for key in shared_keys {
        if key == "int8_mask" {
            shared_out.insert(key.clone(), Value::Null);
            continue;
        }
        if mapping.is_per_model_key(key) {
            continue;
        }
        let settings: Vec<Option<Value>> = slices
            .iter()
            .map(|s| chain(s.params.get(key), shared.get(key)))
            .collect();
        if let Some(v) = layout.expand(file, key, "", &settings, mapping.mergekit_default(key))? {
            shared_out.insert(key.clone(), v);
        }
    }
    // Per-model parameters, for the j-th other source of every slice: the source's own, the
    // slice's, the top level's.
    let mut model_keys: BTreeSet<&String> = shared.keys().collect();
    model_keys.extend(slices.iter().flat_map(|s| s.params.keys()));
    model_keys.extend(
        slices
            .iter()
            .flat_map(|s| s.sources.iter().flat_map(|src| src.params.keys())),
    );
    model_keys.retain(|k| mapping.is_per_model_key(k));
    let mut experts: Vec<Entry> = first
        .others
        .iter()
        .map(|src| Entry {
            model: src.model.clone(),
            params: Map::new(),
        })
        .collect();
    for (j, entry) in experts.iter_mut().enumerate() {
        for key in &model_keys {
            let settings: Vec<Option<Value>> = slices
                .iter()
                .zip(roles)
                .map(|(s, r)| {
                    let slice_level = chain(s.params.get(*key), shared.get(*key));
                    chain(r.others[j].params.get(*key), slice_level.as_ref())
                })
                .collect();
            let slot = format!(
                " (of each slice's model {}{})",
                j + 1,
                if has_base { " besides the base" } else { "" }
            );
            if let Some(v) = layout.expand(file, key, &slot, &settings, mapping.mergekit_default(key))? {
                entry.params.insert((*key).clone(), v);
            }
        }
    }
    let refs: Vec<&Entry> = experts.iter().collect();
    mapping.params(file, &shared_out, &refs, notes)
}

/// mergekit's precedence of two settings: `v`, and where `v` is not given, or is a filter list no
/// entry of which matches, `fallback` (a one-entry `{filter, value}` mapping counts as a list).
pub(crate) fn chain(v: Option<&Value>, fallback: Option<&Value>) -> Option<Value> {
    let v = match v {
        None | Some(Value::Null) => return fallback.map(listed),
        Some(v) => listed(v),
    };
    match (&v, fallback) {
        (Value::Array(items), Some(f))
            if !items.is_empty()
                && items.iter().all(Value::is_object)
                && !items
                    .iter()
                    .any(|i| i.get("filter").is_none_or(|f| f.is_null() || f == "*")) =>
        {
            let mut out = items.clone();
            out.push(json!({ "value": listed(f) }));
            Some(Value::Array(out))
        }
        _ => Some(v),
    }
}

/// A one-entry `{filter, value}` mapping as a list of one entry (mergekit reads it so).
fn listed(v: &Value) -> Value {
    match v {
        Value::Object(o) if o.contains_key("value") => Value::Array(vec![v.clone()]),
        other => other.clone(),
    }
}

/// Whether a value given in the YAML holds a gradient (a list of plain values) anywhere.
pub(crate) fn has_gradient(v: &Value) -> bool {
    match v {
        Value::Array(items) if !items.is_empty() && items.iter().all(|i| !i.is_object() && !i.is_array()) => true,
        Value::Array(items) => items.iter().any(has_gradient),
        Value::Object(obj) => obj.get("value").is_some_and(has_gradient),
        _ => false,
    }
}

/// Whether a value is numeric all through (numbers, gradients of numbers, filter lists of those).
fn numeric(v: &Value) -> bool {
    match v {
        Value::Number(_) => true,
        Value::Array(items) => !items.is_empty() && items.iter().all(numeric),
        Value::Object(obj) => obj.get("value").is_some_and(numeric),
        _ => false,
    }
}

/// `v` with every gradient evaluated at position `t`, as mergekit's `evaluate_setting`
/// interpolates: scaled = t·(n − 1), i0 = ⌊scaled⌋, the value (1 − f)·v[i0] + f·v[i0 + 1].
fn at_t(v: &Value, t: f64) -> Value {
    match v {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            let anchors: Vec<f64> = items.iter().filter_map(Value::as_f64).collect();
            if anchors.len() == 1 {
                return items[0].clone();
            }
            let last = anchors.len() - 1;
            let scaled = t * last as f64;
            let i0 = (scaled.floor() as usize).min(last);
            let i1 = (i0 + 1).min(last);
            let frac = scaled - i0 as f64;
            json!((1.0 - frac) * anchors[i0] + frac * anchors[i1])
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| at_t(i, t)).collect()),
        Value::Object(obj) => Value::Object(
            obj.iter()
                .map(|(k, x)| (k.clone(), if k == "value" { at_t(x, t) } else { x.clone() }))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The tensor names a per-layer expansion needs: read from the first slice's first model.
struct Names {
    /// The prefixes of the layers' tensor names up to the layer number (`model.layers.`).
    prefixes: Vec<String>,
    /// The tensors outside the layers taken from the first slice.
    first: Vec<String>,
    /// The other tensors outside the layers whose names hold one of `first` (they get entries of
    /// their own before those).
    shadowed: Vec<String>,
    /// Whether a layer entry may be left out where it equals the last entry (no `first` name
    /// is found inside a layer tensor's name, so a layer tensor never falls to those).
    droppable: bool,
}

/// The output layers of the slices, and how a parameter is spread over them.
struct Layout<'a> {
    slices: &'a [SliceDef],
    scope: Option<&'a ModuleScope>,
    expand_gradients: bool,
    /// The first output layer of each slice.
    offsets: Vec<usize>,
    total: usize,
    names: Option<Names>,
}

impl<'a> Layout<'a> {
    fn new(slices: &'a [SliceDef], scope: Option<&'a ModuleScope>, expand_gradients: bool) -> Self {
        let mut offsets = Vec::with_capacity(slices.len());
        let mut total = 0;
        for s in slices {
            offsets.push(total);
            total += s.len();
        }
        Layout {
            slices,
            scope,
            expand_gradients,
            offsets,
            total,
            names: None,
        }
    }

    fn names(&mut self) -> Result<&Names> {
        if self.names.is_none() {
            let model = self
                .slices
                .first()
                .and_then(|s| s.sources.first())
                .map(|s| s.model.clone())
                .unwrap_or_default();
            let ckpt = Checkpoint::open(&model)?;
            let scope = self.scope;
            let mut prefixes = BTreeSet::new();
            let mut layer_names = Vec::new();
            let mut first = Vec::new();
            let mut last = Vec::new();
            for name in ckpt.tensors.keys().filter(|n| scope.is_none_or(|m| m.contains(n))) {
                let parts: Vec<&str> = name.split('.').collect();
                match layer_position(&parts) {
                    Some((at, _)) => {
                        prefixes.insert(format!("{}.", parts[..at].join(".")));
                        layer_names.push(name.clone());
                    }
                    None if from_first_slice(name, self.total == 0) => first.push(name.clone()),
                    None => last.push(name.clone()),
                }
            }
            let holds_first = |n: &String| first.iter().any(|f| n.contains(f.as_str()));
            let droppable = !layer_names.iter().any(holds_first);
            let shadowed = last.iter().filter(|n| holds_first(n)).cloned().collect();
            self.names = Some(Names {
                prefixes: prefixes.into_iter().collect(),
                first,
                shadowed,
                droppable,
            });
        }
        match &self.names {
            Some(n) => Ok(n),
            None => Err(mergescope_engine::error::EngineError::Bug(
                "slice layer names not read".to_owned(),
            )),
        }
    }

    /// One parameter's value over the output (`settings`: its setting in each slice, `None`
    /// where no scope gives one, then `default` applies): the setting itself where every slice
    /// has the same and no gradient must restart, else a `{filter, value}` list over the output
    /// layers (see the module doc). `slot` names the model in messages.
    fn expand(
        &mut self,
        file: &Path,
        key: &str,
        slot: &str,
        settings: &[Option<Value>],
        default: Option<Value>,
    ) -> Result<Option<Value>> {
        let Some(first) = settings.first() else {
            return Ok(None);
        };
        let same = settings.iter().all(|s| s == first);
        if same
            && first
                .as_ref()
                .is_none_or(|v| !has_gradient(v) || (self.slices.len() == 1 && !self.expand_gradients))
        {
            return Ok(first.clone());
        }
        let mut values = Vec::with_capacity(settings.len());
        for (s, slice) in settings.iter().zip(self.slices) {
            match s.clone().or_else(|| default.clone()) {
                Some(v) => values.push(v),
                None => {
                    let given = self
                        .slices
                        .iter()
                        .zip(settings)
                        .find(|(_, s)| s.is_some())
                        .map_or("", |(g, _)| g.what.as_str());
                    return Err(invalid(
                        file,
                        format!(
                            "'{key}'{slot} is set for {given} but not for {}; mergescope needs its value in every \
                             slice: give it there too (or under the top-level parameters)",
                            slice.what
                        ),
                    ));
                }
            }
        }
        if let Some(v) = values.iter().find(|v| !numeric(v)) {
            return Err(invalid(
                file,
                format!(
                    "'{key}'{slot} differs between the slices ({}) and {v} is not a number; mergescope varies only \
                     numeric parameters over the layers: give every slice the same",
                    values.iter().map(Value::to_string).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let (Some(head), Some(tail)) = (values.first(), values.last()) else {
            return Ok(None);
        };
        let pre = at_t(head, 0.0);
        if self.total == 0 {
            return Ok(Some(pre));
        }
        let post = at_t(tail, 0.0);
        let mut per_layer: Vec<(usize, Value)> = Vec::with_capacity(self.total);
        for ((slice, setting), offset) in self.slices.iter().zip(&values).zip(&self.offsets) {
            let n = slice.len();
            for i in 0..n {
                // mergekit's plan_slice: t = i / (n − 1), 1 for a slice of one layer.
                let t = if n > 1 { i as f64 / (n - 1) as f64 } else { 1.0 };
                per_layer.push((offset + i, at_t(setting, t)));
            }
        }
        let names = self.names()?;
        let mut entries = Vec::new();
        for (layer, v) in per_layer {
            if names.droppable && v == post {
                continue;
            }
            for p in &names.prefixes {
                entries.push(json!({ "filter": format!("{p}{layer}."), "value": v }));
            }
        }
        if pre != post {
            for name in &names.shadowed {
                entries.push(json!({ "filter": name, "value": post }));
            }
            for name in &names.first {
                entries.push(json!({ "filter": name, "value": pre }));
            }
        }
        if entries.is_empty() {
            return Ok(Some(post));
        }
        entries.push(json!({ "value": post }));
        Ok(Some(Value::Array(entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_are_evaluated_as_mergekit_interpolates() {
        let g = json!([0.0, 1.0, 0.5]);
        assert_eq!(at_t(&g, 0.0), json!(0.0));
        assert_eq!(at_t(&g, 0.25), json!(0.5));
        assert_eq!(at_t(&g, 1.0), json!(0.5));
        let f = json!([{"filter": "mlp", "value": [0.2, 0.6]}, {"value": 0.4}]);
        assert_eq!(at_t(&f, 0.5), json!([{"filter": "mlp", "value": 0.4}, {"value": 0.4}]));
        assert_eq!(at_t(&json!(3), 0.7), json!(3));
    }

    #[test]
    fn filter_lists_fall_through_and_gradients_are_found() {
        let v = json!([{"filter": "attention", "value": 0.9}]);
        assert_eq!(
            chain(Some(&v), Some(&json!(0.2))),
            Some(json!([{"filter": "attention", "value": 0.9}, {"value": 0.2}]))
        );
        assert_eq!(chain(Some(&json!(0.5)), Some(&json!(0.2))), Some(json!(0.5)));
        assert_eq!(chain(None, Some(&json!(0.2))), Some(json!(0.2)));
        assert_eq!(
            chain(Some(&json!({"filter": "mlp", "value": 1})), None),
            Some(json!([{"filter": "mlp", "value": 1}]))
        );
        assert!(has_gradient(&json!([0.1, 0.9])));
        assert!(has_gradient(&json!([{"filter": "mlp", "value": [0, 1]}])));
        assert!(!has_gradient(&json!([{"filter": "mlp", "value": 0.5}])));
        assert!(numeric(&json!([{"filter": "mlp", "value": [0, 1]}, {"value": 2}])));
        assert!(!numeric(&json!(true)));
    }
}

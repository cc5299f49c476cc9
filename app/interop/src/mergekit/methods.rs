//! Each mergekit merge method as a mergescope plugin with the parameters that reproduce it
//! (mergekit 0.1.5's definitions and defaults; docs/mergekit.md lists the agreement of each).

use super::{Entry, invalid};
use mergescope_engine::error::Result;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::path::Path;

/// How a mergekit method uses `base_model`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Base {
    /// The method starts from the base (task vectors): `base_model` must be given.
    Required,
    /// Used when given.
    Optional,
    /// Not a role: the base, when listed, is one more input.
    Ignored,
}

/// How a mergekit parameter becomes a mergescope one.
#[derive(Clone, Copy, Debug)]
enum Conv {
    /// The same value.
    Same,
    /// 1 − value (mergekit's keep `density` → DARE's `drop_rate`).
    OneMinus,
    /// A bool choosing between two strings (true, false).
    Choose(&'static str, &'static str),
}

/// One parameter of a method: mergekit's name, mergescope's, whether it is given per model,
/// mergekit's default when it differs from the plugin's (written into the recipe), mergekit's
/// default where it is the plugin's (`implied`: written only where slices spell the parameter
/// out per layer, `sliced`), and the conversion.
#[derive(Clone, Copy, Debug)]
struct Param {
    mergekit: &'static str,
    ours: &'static str,
    per_model: bool,
    default: Option<DefaultValue>,
    implied: Option<DefaultValue>,
    conv: Conv,
}

/// A default written into the recipe.
#[derive(Clone, Copy, Debug)]
enum DefaultValue {
    Number(f64),
    Bool(bool),
}

impl DefaultValue {
    fn json(self) -> Value {
        match self {
            DefaultValue::Number(n) => json!(n),
            DefaultValue::Bool(b) => json!(b),
        }
    }
}

const fn shared(mergekit: &'static str, ours: &'static str) -> Param {
    Param {
        mergekit,
        ours,
        per_model: false,
        default: None,
        implied: None,
        conv: Conv::Same,
    }
}

const fn per_model(mergekit: &'static str, ours: &'static str) -> Param {
    Param {
        per_model: true,
        ..shared(mergekit, ours)
    }
}

const fn default(mut p: Param, v: DefaultValue) -> Param {
    p.default = Some(v);
    p
}

const fn conv(mut p: Param, c: Conv) -> Param {
    p.conv = c;
    p
}

/// mergekit's default `v`, the plugin's too (so the recipe leaves it out).
const fn implied(mut p: Param, v: DefaultValue) -> Param {
    p.implied = Some(v);
    p
}

use DefaultValue::{Bool, Number};

/// A mergekit method as a mergescope plugin.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// mergekit's `merge_method`.
    pub mergekit: &'static str,
    /// The mergescope plugin id (empty for [`PLUGIN_ID`], whose plugin is the one the
    /// configuration names).
    pub plugin: &'static str,
    base: Base,
    /// Exactly this many non-base inputs, when the method says so.
    experts: Option<usize>,
    /// Plugin parameters set to reproduce mergekit (not user-settable through mergekit).
    fixed: &'static [(&'static str, &'static str)],
    params: &'static [Param],
}

/// Parameters of mergekit's generalized task arithmetic (ties, dare, breadcrumbs, della).
const LAMBDA: Param = default(shared("lambda", "lambda"), Number(1.0));
const WEIGHT: Param = per_model("weight", "task_weights");
const TIES_FIXED: &[(&str, &str)] = &[
    ("trim_scope", "tensor"),
    ("count_rule", "mergekit"),
    ("election", "mass"),
    ("zero_sign", "positive"),
];

/// dare_ties and dare_linear (mergekit's density is the keep probability; rescale is L1).
const DARE_PARAMS: &[Param] = &[
    LAMBDA,
    WEIGHT,
    default(conv(per_model("density", "drop_rate"), Conv::OneMinus), Number(1.0)),
    default(
        conv(shared("rescale", "rescale"), Conv::Choose("l1", "none")),
        Bool(true),
    ),
    shared("normalize", "normalize"),
];
/// breadcrumbs and breadcrumbs_ties.
const BREADCRUMBS_PARAMS: &[Param] = &[
    LAMBDA,
    WEIGHT,
    default(per_model("density", "density"), Number(1.0)),
    implied(per_model("gamma", "gamma"), Number(0.01)),
    shared("normalize", "normalize"),
];

const MAPPINGS: &[Mapping] = &[
    Mapping {
        mergekit: "linear",
        plugin: "weight-average",
        base: Base::Ignored,
        experts: None,
        fixed: &[],
        params: &[per_model("weight", "weights"), shared("normalize", "normalize")],
    },
    Mapping {
        mergekit: "task_arithmetic",
        plugin: "task-arithmetic",
        base: Base::Required,
        experts: None,
        fixed: &[],
        params: &[LAMBDA, WEIGHT, shared("normalize", "normalize")],
    },
    Mapping {
        mergekit: "ties",
        plugin: "ties",
        base: Base::Required,
        experts: None,
        fixed: TIES_FIXED,
        params: &[
            LAMBDA,
            WEIGHT,
            default(per_model("density", "density"), Number(1.0)),
            default(
                conv(shared("normalize", "aggregation"), Conv::Choose("dis-mean", "dis-sum")),
                Bool(true),
            ),
        ],
    },
    Mapping {
        mergekit: "dare_ties",
        plugin: "dare",
        base: Base::Required,
        experts: None,
        fixed: &[("combine", "ties-sum")],
        params: DARE_PARAMS,
    },
    Mapping {
        mergekit: "dare_linear",
        plugin: "dare",
        base: Base::Required,
        experts: None,
        fixed: &[("combine", "sum")],
        params: DARE_PARAMS,
    },
    Mapping {
        mergekit: "breadcrumbs",
        plugin: "breadcrumbs",
        base: Base::Required,
        experts: None,
        fixed: &[("consensus", "none")],
        params: BREADCRUMBS_PARAMS,
    },
    Mapping {
        mergekit: "breadcrumbs_ties",
        plugin: "breadcrumbs",
        base: Base::Required,
        experts: None,
        fixed: &[("consensus", "sign")],
        params: BREADCRUMBS_PARAMS,
    },
    Mapping {
        mergekit: "della",
        plugin: "della",
        base: Base::Required,
        experts: None,
        fixed: &[("consensus", "sign")],
        params: &[
            LAMBDA,
            WEIGHT,
            default(per_model("density", "density"), Number(1.0)),
            implied(per_model("epsilon", "epsilon"), Number(0.15)),
            default(shared("normalize", "normalize"), Bool(true)),
            default(shared("rescale", "rescale"), Bool(true)),
        ],
    },
    Mapping {
        mergekit: "della_linear",
        plugin: "della",
        base: Base::Required,
        experts: None,
        fixed: &[("consensus", "none")],
        params: &[
            LAMBDA,
            WEIGHT,
            default(per_model("density", "density"), Number(1.0)),
            implied(per_model("epsilon", "epsilon"), Number(0.15)),
            default(shared("normalize", "normalize"), Bool(false)),
            default(shared("rescale", "rescale"), Bool(true)),
        ],
    },
    Mapping {
        mergekit: "slerp",
        plugin: "slerp",
        base: Base::Required,
        experts: Some(1),
        fixed: &[],
        params: &[shared("t", "t")],
    },
    Mapping {
        mergekit: "nuslerp",
        plugin: "nuslerp",
        base: Base::Optional,
        experts: Some(2),
        fixed: &[],
        params: &[
            per_model("weight", "weights"),
            shared("nuslerp_flatten", "flatten"),
            shared("nuslerp_row_wise", "row_wise"),
        ],
    },
    Mapping {
        mergekit: "multislerp",
        plugin: "multislerp",
        base: Base::Optional,
        experts: None,
        fixed: &[],
        params: &[
            per_model("weight", "weights"),
            shared("normalize_weights", "normalize_weights"),
            implied(shared("eps", "eps"), Number(1e-8)),
        ],
    },
    Mapping {
        mergekit: "model_stock",
        plugin: "model-stock",
        base: Base::Required,
        experts: None,
        fixed: &[],
        params: &[shared("filter_wise", "filter_wise")],
    },
    Mapping {
        mergekit: "sce",
        plugin: "sce",
        base: Base::Required,
        experts: None,
        fixed: &[],
        params: &[implied(shared("select_topk", "select_topk"), Number(1.0))],
    },
    Mapping {
        mergekit: "karcher",
        plugin: "karcher",
        base: Base::Ignored,
        experts: None,
        fixed: &[],
        params: &[
            implied(shared("max_iter", "max_iter"), Number(10.0)),
            implied(shared("tol", "tol"), Number(1e-5)),
        ],
    },
    Mapping {
        mergekit: "nearswap",
        plugin: "nearswap",
        base: Base::Required,
        experts: Some(1),
        fixed: &[],
        // Required by mergekit and by the plugin: a config without t is refused, naming it.
        params: &[shared("t", "t")],
    },
    Mapping {
        mergekit: "ram",
        plugin: "ram",
        base: Base::Required,
        experts: None,
        fixed: &[],
        params: &[shared("epsilon", "epsilon")],
    },
    Mapping {
        mergekit: "ramplus_tl",
        plugin: "ramplus-tl",
        base: Base::Required,
        experts: None,
        fixed: &[],
        params: &[shared("r", "r"), shared("alpha", "alpha"), shared("epsilon", "epsilon")],
    },
    Mapping {
        mergekit: "arcee_fusion",
        plugin: "arcee-fusion",
        base: Base::Required,
        experts: Some(1),
        fixed: &[],
        params: &[],
    },
    Mapping {
        mergekit: "passthrough",
        plugin: "passthrough",
        base: Base::Ignored,
        experts: Some(1),
        fixed: &[],
        // mergekit's scale None multiplies by nothing: the plugin's 1.
        params: &[implied(per_model("scale", "scale"), Number(1.0))],
    },
];

/// The mergekit methods mergescope reproduces.
pub const MERGEKIT_METHODS: &[&str] = &[
    "linear",
    "task_arithmetic",
    "ties",
    "dare_ties",
    "dare_linear",
    "breadcrumbs",
    "breadcrumbs_ties",
    "della",
    "della_linear",
    "slerp",
    "nuslerp",
    "multislerp",
    "model_stock",
    "sce",
    "karcher",
    "nearswap",
    "ram",
    "ramplus_tl",
    "arcee_fusion",
    "passthrough",
];

/// A `merge_method` that is not one of mergekit's names but a loaded plugin's own id: the models'
/// roles as the plugin's (a `base_model` is its base), the top-level `parameters` passed to it
/// as they are and the models' own `parameters` as one value per expert.
pub static PLUGIN_ID: Mapping = Mapping {
    mergekit: "",
    plugin: "",
    base: Base::Optional,
    experts: None,
    fixed: &[],
    params: &[],
};

/// The plugin and parameters that reproduce mergekit's `merge_method`.
pub fn plugin_for(merge_method: &str) -> Option<&'static Mapping> {
    MAPPINGS.iter().find(|m| m.mergekit == merge_method)
}

/// Applies `f` to every number of a (possibly layer-wise) value: a number, a gradient, or
/// filter entries whose `value` is one of those.
fn map_numbers(v: &Value, f: &dyn Fn(f64) -> f64) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map_or_else(|| v.clone(), |x| json!(f(x))),
        Value::Array(items) => Value::Array(items.iter().map(|i| map_numbers(i, f)).collect()),
        Value::Object(obj) => Value::Object(
            obj.iter()
                .map(|(k, x)| (k.clone(), if k == "value" { map_numbers(x, f) } else { x.clone() }))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A plugin id's parameters ([`PLUGIN_ID`]): the top-level ones as they are; a key some model
/// gives in its own `parameters` becomes one value per expert (the model's, else the top-level
/// one), or one value when they agree. The plugin's schema checks them when the merge starts.
fn passthrough_params(file: &Path, shared: &Map<String, Value>, experts: &[&Entry]) -> Result<Map<String, Value>> {
    let mut out = shared.clone();
    let per_model: BTreeSet<&String> = experts.iter().flat_map(|e| e.params.keys()).collect();
    for key in per_model {
        let mut list = Vec::with_capacity(experts.len());
        for e in experts {
            let v = e.params.get(key).or_else(|| shared.get(key)).ok_or_else(|| {
                invalid(
                    file,
                    format!(
                        "'{key}' is given for some models but not for '{}'; give it for every model (or once under \
                         the top-level parameters)",
                        e.model.display()
                    ),
                )
            })?;
            list.push(v.clone());
        }
        let first = list[0].clone();
        let value = if list.iter().all(|v| *v == first) {
            first
        } else {
            Value::Array(list)
        };
        out.insert(key.clone(), value);
    }
    Ok(out)
}

impl Mapping {
    /// Whether this is a loaded plugin named by its own id ([`PLUGIN_ID`]).
    pub(crate) fn is_plugin_id(&self) -> bool {
        self.plugin.is_empty()
    }

    /// Whether the plugin parameter `ours` is given per model (one value per expert).
    pub(crate) fn is_per_model(&self, ours: &str) -> bool {
        self.params.iter().any(|p| p.ours == ours && p.per_model)
    }

    /// Whether the plugin takes a base model.
    pub fn uses_base(&self) -> bool {
        self.base != Base::Ignored
    }

    /// Whether the method cannot run without a base model.
    pub(crate) fn requires_base(&self) -> bool {
        self.base == Base::Required
    }

    /// Whether mergekit's parameter `mergekit` is given per model (mergekit resolves it for each
    /// input from the input's own parameters first).
    pub(crate) fn is_per_model_key(&self, mergekit: &str) -> bool {
        self.params.iter().any(|p| p.mergekit == mergekit && p.per_model)
    }

    /// mergekit's default of its parameter `mergekit`, in mergekit's terms, when it has one
    /// (written into the recipe where it differs from the plugin's, or where slices spell the
    /// parameter out per layer).
    pub(crate) fn mergekit_default(&self, mergekit: &str) -> Option<Value> {
        self.params
            .iter()
            .find(|p| p.mergekit == mergekit)
            .and_then(|p| p.default.or(p.implied))
            .map(DefaultValue::json)
    }

    /// Checks that `key` (given in `where_`) is a parameter of the method; `int8_mask` is
    /// accepted and ignored, with a note.
    pub(crate) fn check_key(&self, file: &Path, key: &str, where_: &str, notes: &mut Vec<String>) -> Result<()> {
        if key == "int8_mask" {
            let note = "int8_mask only saves mergekit memory; mergescope ignores it";
            if !notes.iter().any(|n| n == note) {
                notes.push(note.to_owned());
            }
            return Ok(());
        }
        if self.is_plugin_id() || self.params.iter().any(|p| p.mergekit == key) {
            return Ok(());
        }
        let known: BTreeSet<&str> = self.params.iter().map(|p| p.mergekit).collect();
        let known = if known.is_empty() {
            "none".to_owned()
        } else {
            known.into_iter().collect::<Vec<_>>().join(", ")
        };
        Err(invalid(
            file,
            format!(
                "{where_}: merge_method {} has no parameter '{key}'; it has {known}",
                self.mergekit
            ),
        ))
    }

    /// For a method without a base role, mergekit merges a `base_model` that `models` does not
    /// list as one more input, after the others: the entries with it added (and a note).
    pub(crate) fn add_unlisted_base(&self, base: Option<&Path>, entries: &mut Vec<Entry>, notes: &mut Vec<String>) {
        let (Base::Ignored, Some(b)) = (self.base, base) else {
            return;
        };
        if entries.iter().any(|e| e.model == b) {
            return;
        }
        self.append_unlisted_base("", b, entries, notes);
    }

    /// Appends the entry of a `base_model` the models do not list (mergekit merges it as one more
    /// input, after them), with a note (starting with `prefix`) when the method has no base role.
    pub(crate) fn append_unlisted_base(
        &self,
        prefix: &str,
        b: &Path,
        entries: &mut Vec<Entry>,
        notes: &mut Vec<String>,
    ) {
        if !self.uses_base() {
            notes.push(format!(
                "{prefix}{} has no base role: base_model '{}' is merged as one more input, after the models, as \
                 mergekit does",
                self.mergekit,
                b.display()
            ));
        }
        entries.push(Entry {
            model: b.to_path_buf(),
            params: Map::new(),
        });
    }

    /// The base entry (when the method uses one and it is an input) and the experts, in the
    /// configuration's order (of `models`; slices are matched slice by slice in `sliced`).
    pub(crate) fn roles<'e>(
        &self,
        file: &Path,
        base: Option<&Path>,
        entries: &'e [Entry],
    ) -> Result<(Option<&'e Entry>, Vec<&'e Entry>)> {
        let is_base = |e: &Entry| base.is_some_and(|b| e.model == b);
        let (base_entry, experts): (Option<&Entry>, Vec<&Entry>) = match self.base {
            Base::Ignored => (None, entries.iter().collect()),
            Base::Required | Base::Optional => {
                if self.base == Base::Required && base.is_none() {
                    return Err(self.no_base(file));
                }
                let base_entry = entries.iter().find(|e| is_base(e));
                (base_entry, entries.iter().filter(|e| !is_base(e)).collect())
            }
        };
        if experts.is_empty() {
            return Err(invalid(file, "lists no model to merge besides the base"));
        }
        self.check_expert_count(file, "this config", experts.len())?;
        Ok((base_entry, experts))
    }

    /// The error of a method that needs a base without one.
    pub(crate) fn no_base(&self, file: &Path) -> mergescope_engine::error::EngineError {
        invalid(
            file,
            format!(
                "merge_method {} needs base_model (the model the others were tuned from)",
                self.mergekit
            ),
        )
    }

    /// Whether a slice of the base alone keeps the base's tensors: mergekit's generalized task
    /// arithmetic (task arithmetic, TIES, DARE, breadcrumbs, DELLA) returns the base when it has
    /// no task vector.
    pub(crate) fn keeps_base_alone(&self) -> bool {
        matches!(
            self.mergekit,
            "task_arithmetic"
                | "ties"
                | "dare_ties"
                | "dare_linear"
                | "breadcrumbs"
                | "breadcrumbs_ties"
                | "della"
                | "della_linear"
        )
    }

    /// Checks the number of models besides the base (`n`, of `what`) against the method's.
    pub(crate) fn check_expert_count(&self, file: &Path, what: &str, n: usize) -> Result<()> {
        match self.experts {
            Some(want) if want != n => Err(invalid(
                file,
                format!(
                    "merge_method {} takes exactly {want} model{} besides the base, {what} has {n}",
                    self.mergekit,
                    if want == 1 { "" } else { "s" },
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The plugin parameters: the fixed ones, then each mergekit parameter converted (per-model
    /// values as one value per expert, or one value when they agree).
    pub(crate) fn params(
        &self,
        file: &Path,
        shared_params: &Map<String, Value>,
        experts: &[&Entry],
        notes: &mut Vec<String>,
    ) -> Result<Map<String, Value>> {
        if self.is_plugin_id() {
            return passthrough_params(file, shared_params, experts);
        }
        let mut out = Map::new();
        for (k, v) in self.fixed {
            out.insert((*k).to_owned(), json!(v));
        }
        for key in shared_params.keys() {
            self.check_key(file, key, "parameters", notes)?;
        }
        for e in experts {
            for key in e.params.keys() {
                self.check_key(file, key, &format!("the parameters of '{}'", e.model.display()), notes)?;
            }
        }
        for p in self.params {
            let convert = |v: &Value| -> Result<Value> {
                match p.conv {
                    Conv::Same => Ok(v.clone()),
                    Conv::OneMinus => Ok(map_numbers(v, &|x| 1.0 - x)),
                    Conv::Choose(yes, no) => match v {
                        Value::Bool(b) => Ok(json!(if *b { yes } else { no })),
                        other => Err(invalid(
                            file,
                            format!("'{}' must be true or false, not {other}", p.mergekit),
                        )),
                    },
                }
            };
            let given = if p.per_model {
                let values: Vec<Option<&Value>> = experts
                    .iter()
                    .map(|e| e.params.get(p.mergekit).or_else(|| shared_params.get(p.mergekit)))
                    .collect();
                if values.iter().all(Option::is_none) {
                    // mergekit has no default for it (`ParameterSpec` without `default`): it
                    // refuses the configuration ("Missing required parameter"), so do we.
                    if let (None, None, Some(e)) = (p.default, p.implied, experts.first()) {
                        return Err(invalid(
                            file,
                            format!(
                                "mergekit's {} needs '{}' for every model and '{}' has none (mergekit refuses it: \
                                 \"Missing required parameter {}\"); give it under each model's parameters or once \
                                 under the top-level parameters",
                                self.mergekit,
                                p.mergekit,
                                e.model.display(),
                                p.mergekit
                            ),
                        ));
                    }
                    None
                } else {
                    let fallback = p.default.map(DefaultValue::json);
                    let mut list = Vec::with_capacity(values.len());
                    for (e, v) in experts.iter().zip(&values) {
                        let v = v.cloned().or_else(|| fallback.clone()).ok_or_else(|| {
                            invalid(
                                file,
                                format!(
                                    "'{}' is given for some models but not for '{}'; give it for every model (or once \
                                     under the top-level parameters)",
                                    p.mergekit,
                                    e.model.display()
                                ),
                            )
                        })?;
                        list.push(v);
                    }
                    // One number for all when the models agree; else one value per model (a
                    // number, or mergekit's per-model gradients and filters, which the host
                    // resolves per tensor). A method of exactly one model (passthrough, whose
                    // plugin's `scale` is not per task) takes that model's value as it is.
                    let first = list[0].clone();
                    if (first.is_number() && list.iter().all(|v| *v == first))
                        || (self.experts == Some(1) && list.len() == 1)
                    {
                        Some(first)
                    } else {
                        Some(Value::Array(list))
                    }
                }
            } else {
                shared_params.get(p.mergekit).cloned()
            };
            let value = match given.or_else(|| p.default.map(DefaultValue::json)) {
                Some(v) => v,
                None => continue,
            };
            out.insert(p.ours.to_owned(), convert(&value)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_method_has_a_mapping_and_back() {
        for m in MERGEKIT_METHODS {
            assert!(plugin_for(m).is_some(), "{m}");
        }
        assert_eq!(MAPPINGS.len(), MERGEKIT_METHODS.len());
    }

    #[test]
    fn numbers_inside_gradients_and_filters_are_converted() {
        let v = json!([{"filter": "mlp", "value": [0.25, 0.5]}, {"value": 0.75}]);
        assert_eq!(
            map_numbers(&v, &|x| 1.0 - x),
            json!([{"filter": "mlp", "value": [0.75, 0.5]}, {"value": 0.25}])
        );
    }
}

//! Layer-wise and filtered parameter values, as mergekit has them: any shared numeric parameter
//! of a per-tensor method may be
//!
//! - a **gradient**, a list of anchor values interpolated across the layers (`t = [0, 0.5, 1]`,
//!   or `--param t=0,0.5,1`): layer l of L takes the value at position l/(L − 1) along the
//!   anchors, linearly between neighbours; tensors outside the layers (embeddings, final norm,
//!   output head) take the first anchor, as in mergekit;
//! - a list of **filters**, `[{filter = "self_attn", value = …}, {value = …}]`: the first entry
//!   whose filter is a substring of the tensor name (or that has no filter, or `"*"`) gives the
//!   value, itself a number or a gradient; a tensor no entry matches takes the default.
//!
//! A per-task parameter (one value per expert) may take a filter list for every expert, or a
//! list with one number, gradient or filter list per expert (`task_weights = [[0, 1], 0.5]`):
//! mergekit's per-model gradients.
//!
//! The host resolves these for every tensor before the plugin sees them ([`split`]): the
//! tensors are grouped by the values they take, and each group is merged by an instance created
//! with plain values, so every plugin supports layer-wise parameters without knowing of them.

use crate::error::{EngineError, Result};
use crate::plugin::{ParamSchema, schema::ParamType};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The transformer layer a tensor belongs to: the number after a `layers`, `layer`, `h` or
/// `blocks` component of its name (`model.layers.3.mlp.up_proj.weight` → 3).
pub fn layer_index(name: &str) -> Option<usize> {
    layer_position(&name.split('.').collect::<Vec<_>>()).map(|(_, layer)| layer)
}

/// Where the layer number of a tensor name stands: (index of that component among the
/// name's dot-separated `parts`, the layer). Slices renumber the layer there.
pub fn layer_position(parts: &[&str]) -> Option<(usize, usize)> {
    let at = parts
        .windows(2)
        .position(|w| matches!(w[0], "layers" | "layer" | "h" | "blocks"))?
        + 1;
    Some((at, parts[at].parse().ok()?))
}

/// A value given per tensor.
#[derive(Clone, Debug, PartialEq)]
enum Setting {
    /// One value everywhere.
    Value(f64),
    /// Anchors interpolated across the layers.
    Gradient(Vec<f64>),
    /// The first entry whose filter matches the tensor name.
    Filtered(Vec<(Option<String>, Setting)>),
}

fn bad(name: &str, what: impl std::fmt::Display) -> EngineError {
    EngineError::Param(format!(
        "parameter '{name}': {what}; a layer-wise value is a number, a list of numbers (anchors across the \
         layers, e.g. t=0,0.5,1) or a list of {{filter, value}} entries (e.g. \
         [{{\"filter\": \"self_attn\", \"value\": [0, 1]}}, {{\"value\": 0.5}}])"
    ))
}

fn number(name: &str, v: &Value) -> Result<f64> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| bad(name, format!("{n} is not a number"))),
        Value::String(s) => Err(EngineError::Param(crate::plugin::schema::text_is_not(
            name, s, "a number", "0.5",
        ))),
        other => Err(bad(name, format!("{other} is not a number"))),
    }
}

/// Parses a value that is a gradient or a filter list; `None` for a plain value.
fn parse(name: &str, v: &Value) -> Result<Option<Setting>> {
    match v {
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            let mut entries = Vec::with_capacity(items.len());
            for item in items {
                let Some(obj) = item.as_object() else { continue };
                if let Some(key) = obj.keys().find(|k| *k != "filter" && *k != "value") {
                    return Err(bad(name, format!("a filter entry has the unknown key '{key}'")));
                }
                let filter = match obj.get("filter") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(f)) if f == "*" => None,
                    Some(Value::String(f)) => Some(f.clone()),
                    Some(other) => return Err(bad(name, format!("filter {other} is not a string"))),
                };
                let value = obj
                    .get("value")
                    .ok_or_else(|| bad(name, "a filter entry has no 'value'"))?;
                let setting = match parse(name, value)? {
                    Some(s) => s,
                    None => Setting::Value(number(name, value)?),
                };
                entries.push((filter, setting));
            }
            Ok(Some(Setting::Filtered(entries)))
        }
        Value::Array(items) => {
            let anchors = items.iter().map(|x| number(name, x)).collect::<Result<Vec<_>>>()?;
            match anchors.len() {
                0 => Err(bad(name, "the list is empty")),
                1 => Ok(Some(Setting::Value(anchors[0]))),
                _ => Ok(Some(Setting::Gradient(anchors))),
            }
        }
        _ => Ok(None),
    }
}

/// The value of `setting` on tensor `name` at layer position `t` in [0, 1]; `None` when no
/// filter matches (the parameter's default applies).
fn evaluate(setting: &Setting, name: &str, t: f64) -> Option<f64> {
    match setting {
        Setting::Value(v) => Some(*v),
        Setting::Gradient(anchors) => {
            let scaled = t * (anchors.len() - 1) as f64;
            let i0 = (scaled.floor() as usize).min(anchors.len() - 1);
            let i1 = (i0 + 1).min(anchors.len() - 1);
            let frac = scaled - i0 as f64;
            Some((1.0 - frac) * anchors[i0] + frac * anchors[i1])
        }
        Setting::Filtered(entries) => entries
            .iter()
            .find(|(filter, _)| filter.as_deref().is_none_or(|f| name.contains(f)))
            .and_then(|(_, s)| evaluate(s, name, t)),
    }
}

/// A parameter's layer-wise value: one for every expert, or one per expert.
#[derive(Clone, Debug, PartialEq)]
enum Layered {
    /// A shared parameter's value, or a per-task parameter's value for every expert.
    Shared(Setting),
    /// A per-task parameter's value for each expert (a number or a layer-wise value each).
    PerExpert(Vec<Setting>),
}

/// Whether a per-task parameter's value gives some expert a layer-wise value: a list whose
/// items are not all numbers and not all filter entries (a list of filter entries is one
/// layer-wise value for every expert; a list of numbers is one number per expert).
fn per_expert_layered(v: &Value) -> bool {
    let Value::Array(items) = v else {
        return false;
    };
    !items.iter().all(Value::is_number) && !items.iter().all(Value::is_object)
}

/// The layer-wise parameters of `params` (a JSON object of the user's values), by name. Shared
/// numeric parameters take a gradient or filters; a per-task parameter keeps a list of numbers
/// as one number per expert, takes a filter list as one layer-wise value for every expert, and
/// a list mixing numbers, gradients and filter lists as one value per expert.
fn layered(params: &Value, schema: &[ParamSchema]) -> Result<BTreeMap<String, Layered>> {
    let mut out = BTreeMap::new();
    let Some(obj) = params.as_object() else {
        return Ok(out);
    };
    for (key, v) in obj {
        let Some(p) = schema.iter().find(|p| &p.name == key) else {
            continue; // unknown names are reported by the schema check
        };
        if !matches!(p.ty, ParamType::Float { .. } | ParamType::Int { .. }) {
            continue;
        }
        if !p.per_task {
            if let Some(setting) = parse(key, v)? {
                out.insert(key.clone(), Layered::Shared(setting));
            }
            continue;
        }
        if per_expert_layered(v) {
            let settings = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|item| match parse(key, item)? {
                    Some(setting) => Ok(setting),
                    None => Ok(Setting::Value(number(key, item)?)),
                })
                .collect::<Result<Vec<_>>>()?;
            out.insert(key.clone(), Layered::PerExpert(settings));
        } else if v
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_object))
            && let Some(setting) = parse(key, v)?
        {
            out.insert(key.clone(), Layered::Shared(setting));
        }
    }
    Ok(out)
}

/// Whether `params` gives any parameter of `schema` layer-wise (callers that cannot split a
/// merge by tensor refuse it).
pub fn is_layered(params: &Value, schema: &[ParamSchema]) -> Result<bool> {
    Ok(!layered(params, schema)?.is_empty())
}

/// One group of a split merge: the plain parameter values and the indices (into the names given
/// to [`split`]) of the tensors that take them.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The user's parameters with every layer-wise value resolved to a number (or left out,
    /// where no filter matched, so the default applies).
    pub params: Value,
    /// The tensors of the group, as indices into the names.
    pub tensors: Vec<usize>,
}

/// Splits a merge of the tensors `names` by the values its layer-wise parameters take on each
/// (see the module doc); `None` when no parameter is layer-wise. Groups come in the order of
/// their first tensor.
pub fn split(params: &Value, schema: &[ParamSchema], names: &[String]) -> Result<Option<Vec<Group>>> {
    let settings = layered(params, schema)?;
    if settings.is_empty() {
        return Ok(None);
    }
    let layers = names.iter().filter_map(|n| layer_index(n)).max().map_or(0, |m| m + 1);
    let ints: Vec<&str> = schema
        .iter()
        .filter(|p| matches!(p.ty, ParamType::Int { .. }))
        .map(|p| p.name.as_str())
        .collect();
    let mut groups: Vec<Group> = Vec::new();
    let mut by_params: BTreeMap<String, usize> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        // mergekit: layer l of L at l/(L − 1) (1 for a single layer); other tensors at 0.
        let t = match layer_index(name) {
            Some(l) if layers > 1 => l as f64 / (layers - 1) as f64,
            Some(_) => 1.0,
            None => 0.0,
        };
        let mut flat: Map<String, Value> = params.as_object().cloned().unwrap_or_default();
        for (key, layered) in &settings {
            // Integer parameters take the integer part, as mergekit's int() does.
            let number = |v: f64| {
                if ints.contains(&key.as_str()) {
                    Value::from(v.trunc() as i64)
                } else {
                    Value::from(v)
                }
            };
            match layered {
                Layered::Shared(setting) => match evaluate(setting, name, t) {
                    Some(v) => flat.insert(key.clone(), number(v)),
                    None => flat.remove(key),
                },
                Layered::PerExpert(settings) => {
                    // An expert no filter matches takes the parameter's default.
                    let default = schema
                        .iter()
                        .find(|p| &p.name == key)
                        .and_then(|p| p.default.as_f64())
                        .unwrap_or(0.0);
                    let values: Vec<Value> = settings
                        .iter()
                        .map(|s| number(evaluate(s, name, t).unwrap_or(default)))
                        .collect();
                    flat.insert(key.clone(), Value::Array(values))
                }
            };
        }
        let flat = Value::Object(flat);
        let key = flat.to_string();
        match by_params.get(&key) {
            Some(g) => groups[*g].tensors.push(i),
            None => {
                by_params.insert(key, groups.len());
                groups.push(Group {
                    params: flat,
                    tensors: vec![i],
                });
            }
        }
    }
    Ok(Some(groups))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::schema::parse_schema;
    use serde_json::json;

    fn schema() -> Vec<ParamSchema> {
        parse_schema(
            r#"[{"name":"t","type":"float","default":0.5,"help":"t"},
                {"name":"k","type":"int","default":1,"help":"k"},
                {"name":"w","type":"float","default":1.0,"per_task":true,"help":"w"}]"#,
        )
        .unwrap()
    }

    fn names(layers: usize) -> Vec<String> {
        let mut n = vec!["model.embed_tokens.weight".to_owned()];
        for l in 0..layers {
            n.push(format!("model.layers.{l}.self_attn.q_proj.weight"));
            n.push(format!("model.layers.{l}.mlp.up_proj.weight"));
        }
        n.push("model.norm.weight".to_owned());
        n
    }

    fn value_of(groups: &[Group], tensor: usize, key: &str) -> Option<f64> {
        let g = groups.iter().find(|g| g.tensors.contains(&tensor)).unwrap();
        g.params.get(key).and_then(Value::as_f64)
    }

    #[test]
    fn layer_indices_come_from_the_name() {
        assert_eq!(layer_index("model.layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(layer_index("transformer.h.3.attn.c_attn.weight"), Some(3));
        assert_eq!(layer_index("encoder.layer.0.output.dense.weight"), Some(0));
        assert_eq!(layer_index("model.embed_tokens.weight"), None);
        assert_eq!(layer_index("model.layers.norm.weight"), None);
    }

    #[test]
    fn per_task_values_may_be_layer_wise_per_expert() {
        // w (per task, default 1): expert 0 a gradient [0, 1] over 3 layers, expert 1 the number
        // 0.5, expert 2 filters (mlp → 2, none else → the default 1).
        let n = names(3);
        let params = json!({"w": [[0.0, 1.0], 0.5, [{"filter": "mlp", "value": 2.0}]]});
        assert!(is_layered(&params, &schema()).unwrap());
        let groups = split(&params, &schema(), &n).unwrap().unwrap();
        let w = |tensor: usize| {
            let g = groups.iter().find(|g| g.tensors.contains(&tensor)).unwrap();
            g.params["w"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect::<Vec<_>>()
        };
        // Tensors: 0 embed, then (q, up) per layer, last the norm.
        assert_eq!(w(0), [0.0, 0.5, 1.0]);
        assert_eq!(w(1), [0.0, 0.5, 1.0]);
        assert_eq!(w(2), [0.0, 0.5, 2.0]);
        assert_eq!(w(3), [0.5, 0.5, 1.0]);
        assert_eq!(w(6), [1.0, 0.5, 2.0]);
        // A list of numbers stays one number per expert; a filter list is one value for all.
        assert!(!is_layered(&json!({"w": [0.2, 0.3]}), &schema()).unwrap());
        let all = split(&json!({"w": [{"filter": "mlp", "value": 3.0}]}), &schema(), &n)
            .unwrap()
            .unwrap();
        assert_eq!(value_of(&all, 2, "w"), Some(3.0));
        assert_eq!(value_of(&all, 1, "w"), None);
    }

    #[test]
    fn gradients_interpolate_anchors_across_layers() {
        // 5 layers, anchors [0, 1, 0.5]: layer l at position l/4·2 = l/2 along the anchors:
        // layer 0 → 0, 1 → 0.5, 2 → 1, 3 → 0.75, 4 → 0.5; outside the layers → the first anchor.
        let n = names(5);
        let groups = split(&json!({"t": [0, 1, 0.5]}), &schema(), &n).unwrap().unwrap();
        let expected = [0.0, 0.5, 1.0, 0.75, 0.5];
        for (l, e) in expected.iter().enumerate() {
            assert_eq!(value_of(&groups, 1 + 2 * l, "t"), Some(*e), "layer {l}");
            assert_eq!(value_of(&groups, 2 + 2 * l, "t"), Some(*e), "layer {l}");
        }
        assert_eq!(value_of(&groups, 0, "t"), Some(0.0));
        assert_eq!(value_of(&groups, n.len() - 1, "t"), Some(0.0));
        // One group per distinct value: 0, 0.5, 1, 0.75.
        assert_eq!(groups.len(), 4);
    }

    #[test]
    fn filters_pick_the_first_matching_entry() {
        let n = names(3);
        let p = json!({"t": [{"filter": "self_attn", "value": [0, 1]}, {"filter": "mlp", "value": 0.25}], "k": 3});
        let groups = split(&p, &schema(), &n).unwrap().unwrap();
        // self_attn of layers 0, 1, 2 → 0, 0.5, 1; mlp → 0.25; others match nothing → default.
        assert_eq!(value_of(&groups, 1, "t"), Some(0.0));
        assert_eq!(value_of(&groups, 3, "t"), Some(0.5));
        assert_eq!(value_of(&groups, 5, "t"), Some(1.0));
        assert_eq!(value_of(&groups, 2, "t"), Some(0.25));
        assert_eq!(value_of(&groups, 0, "t"), None);
        // Other parameters are carried unchanged.
        assert!(groups.iter().all(|g| g.params["k"] == json!(3)));
        // A catch-all entry applies where nothing else matched.
        let p = json!({"t": [{"filter": "mlp", "value": 0.25}, {"value": 0.75}]});
        let groups = split(&p, &schema(), &n).unwrap().unwrap();
        assert_eq!(value_of(&groups, 0, "t"), Some(0.75));
    }

    #[test]
    fn plain_and_per_task_values_are_not_layer_wise() {
        let n = names(2);
        assert_eq!(split(&json!({"t": 0.3, "w": [1, 2, 3]}), &schema(), &n).unwrap(), None);
        assert_eq!(split(&json!({"w": [1, 2]}), &schema(), &n).unwrap(), None);
        // Integer gradients take the integer part.
        let groups = split(&json!({"k": [1, 4]}), &schema(), &n).unwrap().unwrap();
        let k: Vec<i64> = groups.iter().map(|g| g.params["k"].as_i64().unwrap()).collect();
        assert_eq!(k, vec![1, 4]);
    }

    #[test]
    fn malformed_values_name_the_parameter() {
        let n = names(2);
        for (p, needle) in [
            (json!({"t": [0, "x"]}), "'x' is not a number"),
            // Text is not a number, even when it reads as one (a recipe's t = "0.5").
            (
                json!({"t": [0, "0.5"]}),
                "the text \"0.5\", not a number: write it without quotes",
            ),
            (json!({"t": [{"filter": "mlp"}]}), "no 'value'"),
            (
                json!({"t": [{"filter": "mlp", "value": 1, "weight": 2}]}),
                "unknown key 'weight'",
            ),
            (json!({"t": [{"filter": 1, "value": 1}]}), "filter 1 is not a string"),
        ] {
            let e = split(&p, &schema(), &n).unwrap_err().to_string();
            assert!(e.contains("parameter 't'") && e.contains(needle), "{e}");
        }
    }
}

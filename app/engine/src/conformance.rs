//! What every per-tensor merge method must satisfy, checked on synthetic inputs: the harness
//! behind `mergescope plugins test`.
//!
//! The inputs are a base and experts of odd shapes (a 37×23 matrix, a 41-vector, a 4-D kernel,
//! a scalar) filled with the values kernels get wrong (exact and negative zeros, ties:
//! `sdk::testing::awkward_values`), and the same rounded to bf16. The properties:
//! the merge runs; its outputs are finite and of their inputs' shapes (the host refuses any
//! other); the same bits for 1, 2 and 8 worker threads, small chunks and a one-tensor memory
//! budget; an empty tensor merges; values outside a parameter's bounds are refused; and every
//! parameter changes the result for some setting of the choice parameters.

use crate::executor::ExecOptions;
use crate::merge::{MemModel, MemTensor, merge_in_memory_with};
use crate::plugin::Plugin;
use crate::plugin::schema::ParamType;
use mergescope_plugin_api::sdk::testing::awkward_values;
use serde_json::{Map, Value, json};

/// The outcome of one property.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The property, as a sentence.
    pub property: String,
    /// Whether it holds.
    pub passed: bool,
    /// What was seen (the error, the differing run, the parameter).
    pub detail: String,
}

impl Check {
    fn new(property: impl Into<String>, result: Result<String, String>) -> Check {
        let (passed, detail) = match result {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        Check {
            property: property.into(),
            passed,
            detail,
        }
    }
}

/// The synthetic base and `n_experts` experts; values rounded to bf16 when `bf16`.
fn inputs(n_experts: usize, bf16: bool) -> (MemModel, Vec<MemModel>) {
    let shapes: [(&str, &[usize]); 4] = [
        ("layers.0.weight", &[37, 23]),
        ("layers.0.bias", &[41]),
        ("conv.weight", &[3, 2, 3, 3]),
        ("scale", &[]),
    ];
    let round = |v: f32| if bf16 { half::bf16::from_f32(v).to_f32() } else { v };
    let model = |seed: u32, offset: f32| -> MemModel {
        shapes
            .iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let n = shape.iter().product::<usize>();
                let data: Vec<f32> = awkward_values(n, seed * 31 + i as u32)
                    .into_iter()
                    .map(|v| round(v + offset))
                    .collect();
                ((*name).to_owned(), MemTensor::new(shape.to_vec(), data))
            })
            .collect()
    };
    let base = model(1, 0.0);
    let experts = (0..n_experts)
        .map(|t| {
            let delta = model(2 + t as u32, 0.0);
            base.iter()
                .map(|(name, b)| {
                    let data: Vec<f32> = b
                        .data
                        .iter()
                        .zip(&delta[name].data)
                        .map(|(x, d)| round(x + d))
                        .collect();
                    (name.clone(), MemTensor::new(b.shape.clone(), data))
                })
                .collect()
        })
        .collect();
    (base, experts)
}

fn options(threads: usize, chunk_elems: usize, memory_budget_bytes: u64) -> ExecOptions {
    ExecOptions {
        threads,
        chunk_elems,
        memory_budget_bytes,
        ..Default::default()
    }
}

/// Valid values of a parameter other than its default, near and far (a convergence tolerance
/// or a threshold may only matter far from its default), to see whether it changes the result.
fn other_values(ty: &ParamType, default: &Value) -> Vec<Value> {
    match ty {
        ParamType::Float { min, max } => default.as_f64().map_or_else(Vec::new, |d| {
            let mut candidates = vec![d * 0.5, d + 0.37, d * 1000.0, d - 0.37];
            candidates.extend(min.iter().chain(max.iter()).copied());
            distinct_in_range(d, candidates.into_iter().filter(|x| x.is_finite()), *min, *max)
        }),
        ParamType::Int { min, max } => default.as_i64().map_or_else(Vec::new, |d| {
            let candidates = [d + 1, d - 1, d * 2, 0, 1].into_iter().chain(min.iter().copied());
            distinct_in_range(d, candidates, *min, *max)
        }),
        ParamType::Bool => default.as_bool().map(|b| vec![json!(!b)]).unwrap_or_default(),
        ParamType::Choice { choices } => choices
            .iter()
            .filter(|c| Some(c.as_str()) != default.as_str())
            .map(|c| json!(c))
            .collect(),
    }
}

/// The `candidates` other than `default` within [`min`, `max`], each once, in order, as JSON.
fn distinct_in_range<T: Copy + PartialOrd + Into<Value>>(
    default: T,
    candidates: impl IntoIterator<Item = T>,
    min: Option<T>,
    max: Option<T>,
) -> Vec<Value> {
    let mut kept: Vec<T> = Vec::new();
    for x in candidates {
        if x != default && min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m) && !kept.contains(&x) {
            kept.push(x);
        }
    }
    kept.into_iter().map(Into::into).collect()
}

/// A value of `p` outside its bounds, when it has bounds.
fn out_of_range(ty: &ParamType) -> Option<Value> {
    match ty {
        ParamType::Float { min: Some(m), .. } => Some(json!(m - 1.0)),
        ParamType::Float { max: Some(m), .. } => Some(json!(m + 1.0)),
        ParamType::Int { min: Some(m), .. } => Some(json!(m - 1)),
        ParamType::Int { max: Some(m), .. } => Some(json!(m + 1)),
        _ => None,
    }
}

/// Checks `plugin` (a per-tensor method) with `params` (the user's, over the defaults) on
/// synthetic experts and a base: `n_experts` of them, or when `None` the first of 3, 2 and 1
/// that the method merges (SLERP takes one, NuSLERP two).
pub fn check_plugin(plugin: &Plugin, params: &Map<String, Value>, n_experts: Option<usize>) -> Vec<Check> {
    let mut checks = Vec::new();
    if plugin.is_model_level() {
        checks.push(Check::new(
            "is a per-tensor method",
            Err(format!(
                "'{}' is model-level: it runs on calibration data in a session, which these synthetic checks do not have; \
                 test it with `mergescope merge --benchmark demo/mlp --method {} --eval`",
                plugin.id(),
                plugin.id()
            )),
        ));
        return checks;
    }
    let run = |params: &Map<String, Value>, base: &MemModel, experts: &[MemModel], opts: &ExecOptions| {
        merge_in_memory_with(plugin, &Value::Object(params.clone()), 0, Some(base), experts, opts)
            .map_err(|e| e.to_string())
    };
    let counts = n_experts.map_or(vec![3, 2, 1], |n| vec![n]);
    let mut first = None;
    let mut other_errors = Vec::new();
    let mut found = None;
    for n in counts {
        let (base, experts) = inputs(n, false);
        match run(params, &base, &experts, &ExecOptions::default()) {
            Ok(m) => {
                found = Some((n, base, experts, m));
                break;
            }
            Err(e) => {
                if first.is_none() {
                    first = Some(e);
                } else {
                    other_errors.push(e);
                }
            }
        }
    }
    let (n_experts, base, experts, reference) = match (found, first) {
        (Some(f), _) => f,
        (None, e) => {
            // Of the refusals for 3, 2 and 1 experts, one that is not about their number.
            let e = e.unwrap_or_default();
            let e = other_errors
                .into_iter()
                .find(|x| !x.contains("this merge has"))
                .unwrap_or(e);
            let property = if e.contains("finite") || e.contains("NaN") || e.contains("inf") {
                "outputs are finite"
            } else if e.contains("shape") {
                "outputs have their inputs' shapes"
            } else {
                "merges a base and experts of odd shapes"
            };
            checks.push(Check::new(property, Err(e)));
            return checks;
        }
    };
    checks.push(Check::new(
        "merges a base and experts of odd shapes; outputs finite and of their inputs' shapes",
        Ok(format!(
            "{} tensors, {n_experts} expert{} and a base",
            reference.len(),
            if n_experts == 1 { "" } else { "s" }
        )),
    ));
    let (base16, experts16) = inputs(n_experts, true);
    checks.push(Check::new(
        "merges bf16-valued inputs",
        run(params, &base16, &experts16, &ExecOptions::default()).map(|_| String::new()),
    ));

    let variants = [
        ("1 thread", options(1, 1 << 18, 2 << 30)),
        ("8 threads", options(8, 1 << 18, 2 << 30)),
        ("2 threads, chunks of 7 elements", options(2, 7, 2 << 30)),
        (
            "a one-byte memory budget (one tensor at a time)",
            options(2, 1 << 18, 1),
        ),
    ];
    let mut differing = Vec::new();
    for (what, opts) in &variants {
        match run(params, &base, &experts, opts) {
            Ok(m) if m == reference => {}
            Ok(m) => {
                let tensor = m
                    .iter()
                    .find(|(n, t)| reference.get(*n) != Some(t))
                    .map(|(n, _)| n.clone());
                differing.push(format!("{what}: tensor '{}' differs", tensor.unwrap_or_default()));
            }
            Err(e) => differing.push(format!("{what}: {e}")),
        }
    }
    checks.push(Check::new(
        "the same bits whatever the threads, chunks and memory budget",
        if differing.is_empty() {
            Ok("1, 2 (default) and 8 threads, chunks of 7, one tensor at a time".to_owned())
        } else {
            Err(differing.join("; "))
        },
    ));

    let empty = |v: f32| -> MemModel {
        [
            ("empty".to_owned(), MemTensor::new(vec![0, 5], Vec::new())),
            ("one".to_owned(), MemTensor::new(vec![2], vec![v, -v])),
        ]
        .into_iter()
        .collect()
    };
    let empty_experts: Vec<MemModel> = (0..n_experts).map(|t| empty(0.5 + t as f32)).collect();
    checks.push(Check::new(
        "an empty tensor (shape [0, 5]) merges",
        run(params, &empty(0.25), &empty_experts, &ExecOptions::default()).map(|_| String::new()),
    ));

    // The merges the parameter checks compare against: the user's settings, and each other
    // value of a choice or bool parameter (a parameter may matter only with one: CART's `rank`
    // with rank_mode = absolute, NuSLERP's `row_wise` with flatten = false). Each runs once.
    let mut settings = vec![(None, params.clone(), reference)];
    for q in plugin.schema() {
        let values: Vec<Value> = match &q.ty {
            ParamType::Choice { choices } => choices.iter().map(|c| json!(c)).collect(),
            ParamType::Bool => vec![json!(true), json!(false)],
            _ => Vec::new(),
        };
        if params.contains_key(&q.name) {
            continue;
        }
        for v in values {
            let mut s = params.clone();
            s.insert(q.name.clone(), v);
            if let Ok(merged) = run(&s, &base, &experts, &ExecOptions::default()) {
                settings.push((Some(q.name.as_str()), s, merged));
            }
        }
    }

    for p in plugin.schema() {
        if params.contains_key(&p.name) {
            continue;
        }
        if let Some(bad) = out_of_range(&p.ty) {
            let mut with = params.clone();
            with.insert(p.name.clone(), bad.clone());
            checks.push(Check::new(
                format!("parameter '{}' = {bad}, outside its bounds, is refused", p.name),
                match run(&with, &base, &experts, &ExecOptions::default()) {
                    Ok(_) => Err("the merge ran".to_owned()),
                    Err(e) => Ok(e),
                },
            ));
        }
        let mut others = other_values(&p.ty, &p.default);
        if others.is_empty() {
            continue;
        }
        if p.per_task {
            // One value for all experts is scale-free for normalised weights: change the first
            // expert's alone.
            for other in &mut others {
                let mut list = vec![p.default.clone(); n_experts];
                list[0] = other.clone();
                *other = Value::Array(list);
            }
        }
        let mut effect = None;
        'search: for (varied, s, a) in &settings {
            if *varied == Some(p.name.as_str()) {
                continue;
            }
            for other in &others {
                let mut with = s.clone();
                with.insert(p.name.clone(), other.clone());
                if run(&with, &base, &experts, &ExecOptions::default()).is_ok_and(|b| *a != b) {
                    effect = Some(other.clone());
                    break 'search;
                }
            }
        }
        checks.push(Check::new(
            format!("parameter '{}' changes the result", p.name),
            match effect {
                Some(other) => Ok(format!("{} → {other}", p.default)),
                None => Err(format!(
                    "{} and each of {} give the same merge, also with every value of the choice and bool \
                     parameters: the method ignores '{}'",
                    p.default,
                    others.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    p.name
                )),
            },
        ));
    }
    checks
}

//! Parameter schemas declared by plugins, and validation of the user's values against them.
//! The same schema builds the GUI form and checks CLI `--param` values and recipes.

use serde::Serialize;
use serde_json::{Map, Value};

/// Type of a parameter, with its range or choices.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ParamType {
    /// A real number.
    Float {
        /// Inclusive lower bound.
        min: Option<f64>,
        /// Inclusive upper bound.
        max: Option<f64>,
    },
    /// An integer.
    Int {
        /// Inclusive lower bound.
        min: Option<i64>,
        /// Inclusive upper bound.
        max: Option<i64>,
    },
    /// true/false.
    Bool,
    /// One of several strings.
    Choice {
        /// Allowed values.
        choices: Vec<String>,
    },
}

/// One parameter of a plugin.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamSchema {
    /// Name.
    pub name: String,
    /// Type and range.
    #[serde(flatten)]
    pub ty: ParamType,
    /// Default value.
    pub default: Value,
    /// Help sentence.
    pub help: String,
    /// One value per expert (float only).
    pub per_task: bool,
    /// The user must give it; the default only fills the window's form.
    pub required: bool,
}

/// A validated value.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// Float.
    Float(f64),
    /// Int.
    Int(i64),
    /// Bool.
    Bool(bool),
    /// Choice.
    Choice(String),
    /// Per-task list.
    List(Vec<f64>),
}

impl ParamValue {
    /// The value as JSON, as recorded in outputs and recipes.
    pub fn to_json(&self) -> Value {
        match self {
            ParamValue::Float(f) => Value::from(*f),
            ParamValue::Int(i) => Value::from(*i),
            ParamValue::Bool(b) => Value::from(*b),
            ParamValue::Choice(s) => Value::from(s.clone()),
            ParamValue::List(v) => Value::from(v.clone()),
        }
    }
}

/// Validated parameters of one merge, in schema order, every parameter present.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResolvedParams {
    /// (name, value) pairs.
    pub values: Vec<(String, ParamValue)>,
}

impl ResolvedParams {
    /// The parameters as a JSON object (recorded in output metadata).
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.values
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect::<Map<_, _>>(),
        )
    }
}

/// Parses the JSON schema a plugin declares.
pub fn parse_schema(json: &str) -> Result<Vec<ParamSchema>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("parameter schema is not valid JSON: {e}"))?;
    let arr = v.as_array().ok_or("parameter schema must be a JSON array")?;
    let mut out: Vec<ParamSchema> = Vec::new();
    for (i, p) in arr.iter().enumerate() {
        let name = p
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("parameter #{i} of the schema has no name"))?
            .to_owned();
        if out.iter().any(|q| q.name == name) {
            return Err(format!("parameter '{name}' is declared twice"));
        }
        let ty_name = p.get("type").and_then(Value::as_str).unwrap_or("");
        let fnum = |k: &str| p.get(k).and_then(Value::as_f64);
        let inum = |k: &str| p.get(k).and_then(Value::as_i64);
        let ty = match ty_name {
            "float" => ParamType::Float {
                min: fnum("min"),
                max: fnum("max"),
            },
            "int" => ParamType::Int {
                min: inum("min"),
                max: inum("max"),
            },
            "bool" => ParamType::Bool,
            "choice" => {
                let choices: Vec<String> = p
                    .get("choices")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_owned)).collect())
                    .unwrap_or_default();
                if choices.is_empty() {
                    return Err(format!("choice parameter '{name}' lists no choices"));
                }
                ParamType::Choice { choices }
            }
            other => return Err(format!("parameter '{name}' has unknown type '{other}'")),
        };
        let per_task = p.get("per_task").and_then(Value::as_bool).unwrap_or(false);
        if per_task && !matches!(ty, ParamType::Float { .. }) {
            return Err(format!("parameter '{name}': only float parameters can be per-task"));
        }
        let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
        let default = p.get("default").cloned().unwrap_or(Value::Null);
        let help = p.get("help").and_then(Value::as_str).unwrap_or("").to_owned();
        let schema = ParamSchema {
            name,
            ty,
            default,
            help,
            per_task,
            required,
        };
        // The default must itself be valid (checked for one expert).
        check_value(&schema, &schema.default, 1).map_err(|e| format!("the schema's default is invalid: {e}"))?;
        out.push(schema);
    }
    Ok(out)
}

/// Levenshtein distance, for did-you-mean suggestions.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest candidate to `word`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn parse_f64(name: &str, v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| format!("parameter '{name}': {n} is not a number")),
        Value::String(s) => Err(text_is_not(name, s, "a number", "0.5")),
        other => Err(format!("parameter '{name}': expected a number, got {other}")),
    }
}

/// The error for text given where a number or a bool is due (`t = "0.05"` in a recipe): the
/// value must be written without quotes.
pub fn text_is_not(name: &str, text: &str, what: &str, example: &str) -> String {
    let looks = text.trim().parse::<f64>().is_ok() || matches!(text.trim(), "true" | "false");
    if looks {
        format!(
            "parameter '{name}' is the text \"{text}\", not {what}: write it without quotes ({name} = {})",
            text.trim()
        )
    } else {
        format!("parameter '{name}': '{text}' is not {what}; write e.g. {name}={example}")
    }
}

fn check_range_f(name: &str, x: f64, min: Option<f64>, max: Option<f64>) -> Result<(), String> {
    if !x.is_finite() {
        return Err(format!("parameter '{name}': {x} is not a finite number"));
    }
    // Merges compute in f32: a larger magnitude would turn every weight it touches into Inf.
    if x.abs() > f64::from(f32::MAX) {
        return Err(format!(
            "parameter '{name}' = {x:e} is beyond the f32 range merges compute in (±{:e}); give a smaller value",
            f32::MAX
        ));
    }
    let lo = min.map_or(String::from("-inf"), |m| m.to_string());
    let hi = max.map_or(String::from("inf"), |m| m.to_string());
    if min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m) {
        return Err(format!(
            "parameter '{name}' = {x} is out of range; allowed: {lo} ≤ {name} ≤ {hi}"
        ));
    }
    Ok(())
}

/// Checks one value against its schema entry and converts it.
fn check_value(p: &ParamSchema, v: &Value, n_experts: usize) -> Result<ParamValue, String> {
    let name = p.name.as_str();
    match &p.ty {
        ParamType::Float { min, max } if p.per_task => {
            let list: Vec<f64> = match v {
                Value::Array(a) => a.iter().map(|x| parse_f64(name, x)).collect::<Result<_, _>>()?,
                other => vec![parse_f64(name, other)?; n_experts],
            };
            if list.len() != n_experts {
                return Err(format!(
                    "parameter '{name}' is per task: give one value for all experts or exactly {n_experts} \
                     (one per expert, in order), not {}",
                    list.len()
                ));
            }
            for x in &list {
                check_range_f(name, *x, *min, *max)?;
            }
            Ok(ParamValue::List(list))
        }
        ParamType::Float { min, max } => {
            let x = parse_f64(name, v)?;
            check_range_f(name, x, *min, *max)?;
            Ok(ParamValue::Float(x))
        }
        ParamType::Int { min, max } => {
            let x = parse_f64(name, v)?;
            if x.fract() != 0.0 || x.abs() > 9.0e15 {
                return Err(format!("parameter '{name}': {x} is not an integer"));
            }
            let i = x as i64;
            check_range_f(name, x, min.map(|m| m as f64), max.map(|m| m as f64))?;
            Ok(ParamValue::Int(i))
        }
        ParamType::Bool => match v {
            Value::Bool(b) => Ok(ParamValue::Bool(*b)),
            Value::String(s) => Err(text_is_not(name, s, "true or false", "true")),
            other => Err(format!("parameter '{name}': expected true or false, got {other}")),
        },
        ParamType::Choice { choices } => {
            let s = v
                .as_str()
                .ok_or_else(|| format!("parameter '{name}': expected one of {}", choices.join(", ")))?;
            if choices.iter().any(|c| c == s) {
                Ok(ParamValue::Choice(s.to_owned()))
            } else {
                let hint = did_you_mean(s, choices.iter().map(String::as_str))
                    .map(|c| format!(" Did you mean '{c}'?"))
                    .unwrap_or_default();
                Err(format!(
                    "parameter '{name}': '{s}' is not one of {}.{hint}",
                    choices.join(", ")
                ))
            }
        }
    }
}

/// Validates user parameters against a schema: unknown keys get a did-you-mean, a missing
/// required one is refused, values are type- and range-checked, other missing ones take the
/// default. `method` names the plugin in errors.
pub fn resolve_params(
    method: &str,
    schema: &[ParamSchema],
    user: &Map<String, Value>,
    n_experts: usize,
) -> Result<ResolvedParams, String> {
    for key in user.keys() {
        if !schema.iter().any(|p| &p.name == key) {
            let known: Vec<&str> = schema.iter().map(|p| p.name.as_str()).collect();
            let hint = did_you_mean(key, known.iter().copied())
                .map(|c| format!(" Did you mean '{c}'?"))
                .unwrap_or_default();
            let list = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            return Err(format!(
                "method '{method}' has no parameter '{key}'.{hint} Its parameters: {list}."
            ));
        }
    }
    let mut values = Vec::new();
    if let Some(p) = schema.iter().find(|p| p.required && !user.contains_key(&p.name)) {
        return Err(format!(
            "method '{method}' needs parameter '{}' ({}); it has no default: give it, e.g. --param {}=VALUE (in a \
             recipe or mergekit YAML, under parameters)",
            p.name,
            p.help.trim_end_matches('.'),
            p.name
        ));
    }
    for p in schema {
        let v = user.get(&p.name).unwrap_or(&p.default);
        let checked = check_value(p, v, n_experts).map_err(|e| format!("method '{method}': {e}"))?;
        values.push((p.name.clone(), checked));
    }
    Ok(ResolvedParams { values })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Vec<ParamSchema> {
        parse_schema(
            r#"[{"name":"density","type":"float","default":0.2,"min":0.0,"max":1.0,"help":"keep"},
                {"name":"lambda","type":"float","default":1.0,"help":"scale"},
                {"name":"weights","type":"float","default":1.0,"per_task":true,"help":"w"},
                {"name":"k","type":"int","default":2,"min":0,"help":"k"},
                {"name":"normalize","type":"bool","default":false,"help":"n"},
                {"name":"aggregation","type":"choice","choices":["dis-mean","dis-sum"],"default":"dis-mean","help":"a"}]"#,
        )
        .unwrap()
    }

    fn resolve(user: Value) -> Result<ResolvedParams, String> {
        resolve_params("ties", &schema(), user.as_object().unwrap(), 3)
    }

    #[test]
    fn defaults_fill_in_and_text_is_not_a_number() {
        let r = resolve(json!({"density": 0.5, "normalize": true, "weights": [1, 2, 3]})).unwrap();
        assert_eq!(r.values[0], ("density".into(), ParamValue::Float(0.5)));
        assert_eq!(r.values[2].1, ParamValue::List(vec![1.0, 2.0, 3.0]));
        assert_eq!(r.values[3].1, ParamValue::Int(2));
        assert_eq!(r.values[4].1, ParamValue::Bool(true));
        assert_eq!(r.values[5].1, ParamValue::Choice("dis-mean".into()));
        let r = resolve(json!({"weights": 0.5})).unwrap();
        assert_eq!(r.values[2].1, ParamValue::List(vec![0.5; 3]));
        // A recipe's `density = "0.5"` or `normalize = "true"` is text: refused, saying how to
        // write it.
        for (user, needle) in [
            (
                json!({"density": "0.5"}),
                "parameter 'density' is the text \"0.5\", not a number: write it without quotes (density = 0.5)",
            ),
            (
                json!({"normalize": "true"}),
                "parameter 'normalize' is the text \"true\", not true or false",
            ),
            (
                json!({"weights": "1,2,3"}),
                "parameter 'weights': '1,2,3' is not a number",
            ),
            (
                json!({"density": "half"}),
                "'half' is not a number; write e.g. density=0.5",
            ),
        ] {
            let e = resolve(user).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn errors_name_the_parameter_and_the_fix() {
        let e = resolve(json!({"densty": 0.3})).unwrap_err();
        assert!(e.contains("'densty'") && e.contains("Did you mean 'density'"), "{e}");
        let e = resolve(json!({"density": 1.5})).unwrap_err();
        assert!(e.contains("out of range") && e.contains("1"), "{e}");
        let e = resolve(json!({"weights": [1, 2]})).unwrap_err();
        assert!(e.contains("exactly 3"), "{e}");
        let e = resolve(json!({"aggregation": "dis-mena"})).unwrap_err();
        assert!(e.contains("Did you mean 'dis-mean'"), "{e}");
        let e = resolve(json!({"k": 1.5})).unwrap_err();
        assert!(e.contains("not an integer"), "{e}");
        let e = resolve(json!({"density": "abc"})).unwrap_err();
        assert!(e.contains("not a number"), "{e}");
    }

    #[test]
    fn a_required_parameter_must_be_given() {
        let schema = parse_schema(
            r#"[{"name":"t","type":"float","default":0.001,"min":0.0,"required":true,"help":"Distance scale."},
                {"name":"w","type":"float","default":1.0,"help":"w"}]"#,
        )
        .unwrap();
        assert!(schema[0].required && !schema[1].required);
        let resolve = |user: Value| resolve_params("nearswap", &schema, user.as_object().unwrap(), 1);
        let e = resolve(json!({"w": 2.0})).unwrap_err();
        assert!(
            e.contains("method 'nearswap' needs parameter 't' (Distance scale)") && e.contains("--param t=VALUE"),
            "{e}"
        );
        let ok = resolve(json!({"t": 0.5})).unwrap();
        assert_eq!(ok.to_json(), json!({"t": 0.5, "w": 1.0}));
        // Given, it is range-checked like any other.
        assert!(resolve(json!({"t": -1.0})).unwrap_err().contains("out of range"));
    }

    #[test]
    fn bad_schemas_are_rejected() {
        assert!(parse_schema("{}").is_err());
        assert!(parse_schema(r#"[{"name":"a","type":"float","default":"x"}]"#).is_err());
        assert!(parse_schema(r#"[{"name":"a","type":"choice","choices":[],"default":"x"}]"#).is_err());
        assert!(parse_schema(r#"[{"name":"a","type":"float","default":5,"max":1}]"#).is_err());
    }

    #[test]
    fn edit_distance_golden() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(did_you_mean("tiez", ["ties", "dare", "cart"]), Some("ties"));
        assert_eq!(did_you_mean("zzzzzz", ["ties"]), None);
    }
}

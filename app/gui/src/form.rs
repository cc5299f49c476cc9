//! The parameter form of a method, generated from its plugin's schema: one field per
//! parameter, per-task values where the schema allows them, and validation by the same
//! function the CLI and recipes use, so the form flags exactly what a run would reject.

use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::plugin::schema::{ParamSchema, ParamType, ResolvedParams, resolve_params};
use serde_json::{Map, Value};

/// The value being edited in one field.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// A real number (one for all experts).
    Float(f64),
    /// An integer.
    Int(i64),
    /// true/false.
    Bool(bool),
    /// One of the schema's choices.
    Choice(String),
}

/// One parameter's field.
#[derive(Clone, Debug)]
pub struct Field {
    /// The plugin's declaration.
    pub schema: ParamSchema,
    /// Current value.
    pub value: FieldValue,
    /// One value per expert, when the schema allows it and the user asked for it.
    pub per_task: Option<Vec<f64>>,
}

impl Field {
    fn from_schema(p: &ParamSchema) -> Field {
        let num = p.default.as_f64().unwrap_or(0.0);
        let value = match &p.ty {
            ParamType::Float { .. } => FieldValue::Float(num),
            ParamType::Int { .. } => FieldValue::Int(p.default.as_i64().unwrap_or(num as i64)),
            ParamType::Bool => FieldValue::Bool(p.default.as_bool().unwrap_or(false)),
            ParamType::Choice { choices } => FieldValue::Choice(
                p.default
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| choices.first().cloned())
                    .unwrap_or_default(),
            ),
        };
        Field {
            schema: p.clone(),
            value,
            per_task: None,
        }
    }

    /// The value as JSON, as a run, a recipe or a project records it.
    pub fn to_json(&self) -> Value {
        if let Some(list) = &self.per_task {
            return Value::from(list.clone());
        }
        match &self.value {
            FieldValue::Float(x) => Value::from(*x),
            FieldValue::Int(i) => Value::from(*i),
            FieldValue::Bool(b) => Value::from(*b),
            FieldValue::Choice(s) => Value::from(s.clone()),
        }
    }

    /// Whether the value differs from the schema's default.
    pub fn is_default(&self) -> bool {
        self.per_task.is_none() && *self == Field::from_schema(&self.schema)
    }

    /// Switches per-task values on (one copy of the shared value per expert) or off.
    pub fn set_per_task(&mut self, on: bool, n_experts: usize) {
        self.per_task = match (on, &self.value) {
            (true, FieldValue::Float(x)) if self.schema.per_task => Some(vec![*x; n_experts]),
            _ => None,
        };
    }

    fn set_json(&mut self, v: &Value) {
        match (&mut self.value, v) {
            (FieldValue::Float(x), Value::Array(a)) if self.schema.per_task => {
                let list: Vec<f64> = a.iter().filter_map(Value::as_f64).collect();
                if let Some(first) = list.first() {
                    *x = *first;
                }
                self.per_task = Some(list);
            }
            (FieldValue::Float(x), v) => {
                if let Some(f) = v.as_f64() {
                    *x = f;
                }
            }
            (FieldValue::Int(i), v) => {
                if let Some(n) = v.as_i64() {
                    *i = n;
                }
            }
            (FieldValue::Bool(b), Value::Bool(n)) => *b = *n,
            (FieldValue::Choice(s), Value::String(n)) => n.clone_into(s),
            _ => {}
        }
    }
}

impl PartialEq for Field {
    fn eq(&self, other: &Field) -> bool {
        self.schema.name == other.schema.name && self.value == other.value && self.per_task == other.per_task
    }
}

/// The form of one method.
#[derive(Clone, Debug)]
pub struct ParamForm {
    /// Plugin id, for error messages.
    pub method: String,
    /// One field per schema parameter, in schema order.
    pub fields: Vec<Field>,
    /// Layer-wise values (gradients across the layers, per-tensor filters) from an opened
    /// recipe, which the fields cannot show: kept as given, shown beside the form and resolved
    /// per tensor by the engine, until the user gives the field one value again.
    pub layer_wise: Map<String, Value>,
}

/// Whether `v` is a layer-wise value of parameter `f` (a gradient or filter list), rather than
/// a number or, for a per-task parameter, one number per expert: the engine's own reading, so
/// the form keeps exactly what a run would resolve per tensor (a malformed value is kept too,
/// for `validate` to name).
fn is_layer_wise(f: &Field, v: &Value) -> bool {
    let one = Value::Object(Map::from_iter([(f.schema.name.clone(), v.clone())]));
    mergescope_engine::layered::is_layered(&one, std::slice::from_ref(&f.schema)).unwrap_or(true)
}

impl ParamForm {
    /// A form with every parameter at its default.
    pub fn new(method: &str, schema: &[ParamSchema]) -> ParamForm {
        ParamForm {
            method: method.to_owned(),
            fields: schema.iter().map(Field::from_schema).collect(),
            layer_wise: Map::new(),
        }
    }

    /// Parameters that differ from their defaults, and required ones (the form's value is the
    /// user's, default or not), as JSON (what a run records), with the layer-wise values as
    /// given.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut out: Map<String, Value> = self
            .fields
            .iter()
            .filter(|f| f.schema.required || !f.is_default())
            .map(|f| (f.schema.name.clone(), f.to_json()))
            .collect();
        out.extend(self.layer_wise.clone());
        out
    }

    /// Sets fields from recorded parameters (unknown names are ignored); layer-wise values are
    /// kept in [`ParamForm::layer_wise`].
    pub fn set_json(&mut self, values: &Map<String, Value>) {
        for f in &mut self.fields {
            let name = f.schema.name.clone();
            match values.get(&name) {
                Some(v) if is_layer_wise(f, v) => {
                    self.layer_wise.insert(name, v.clone());
                }
                Some(v) => {
                    f.set_json(v);
                    self.layer_wise.remove(&name);
                }
                None => {}
            }
        }
    }

    /// Resets every field to its default.
    pub fn reset(&mut self) {
        self.layer_wise.clear();
        for f in &mut self.fields {
            *f = Field::from_schema(&f.schema);
        }
    }

    /// Keeps per-task lists as long as the expert list: new experts take the shared value.
    pub fn fit_experts(&mut self, n_experts: usize) {
        for f in &mut self.fields {
            if let (Some(list), FieldValue::Float(x)) = (&mut f.per_task, &f.value) {
                list.resize(n_experts, *x);
            }
        }
    }

    /// The error of field `i` alone, if its value would be rejected by a run.
    pub fn field_error(&self, i: usize, n_experts: usize) -> Option<String> {
        let f = self.fields.get(i)?;
        if self.layer_wise.contains_key(&f.schema.name) {
            // Checked whole by `validate`; resolved per tensor by the engine.
            return None;
        }
        let mut one = Map::new();
        one.insert(f.schema.name.clone(), f.to_json());
        resolve_params(&self.method, std::slice::from_ref(&f.schema), &one, n_experts.max(1)).err()
    }

    /// Validates the whole form for `n_experts` experts.
    pub fn validate(&self, n_experts: usize) -> Result<ResolvedParams> {
        let schema: Vec<ParamSchema> = self.fields.iter().map(|f| f.schema.clone()).collect();
        let layer_wise = Value::Object(self.layer_wise.clone());
        mergescope_engine::layered::is_layered(&layer_wise, &schema)?;
        let mut plain = self.to_json();
        plain.retain(|k, _| !self.layer_wise.contains_key(k));
        resolve_params(&self.method, &schema, &plain, n_experts.max(1)).map_err(EngineError::Param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_engine::plugin::schema::{ParamValue, parse_schema};
    use serde_json::json;

    fn form() -> ParamForm {
        let schema = parse_schema(
            r#"[{"name":"lambda","type":"float","default":0.3,"min":0.0,"max":2.0,"per_task":true,"help":"scale"},
                {"name":"k","type":"int","default":2,"min":1,"help":"k"},
                {"name":"trim","type":"choice","choices":["tensor","global"],"default":"tensor","help":"t"},
                {"name":"rescale","type":"bool","default":true,"help":"r"}]"#,
        )
        .unwrap();
        ParamForm::new("task-arithmetic", &schema)
    }

    #[test]
    fn defaults_record_nothing_and_resolve_to_the_schema_defaults() {
        let f = form();
        assert!(f.to_json().is_empty());
        let r = f.validate(3).unwrap();
        assert_eq!(r.values[0].1, ParamValue::List(vec![0.3; 3]));
        assert_eq!(r.values[1].1, ParamValue::Int(2));
    }

    #[test]
    fn out_of_range_values_are_flagged_on_their_field_only() {
        let mut f = form();
        f.fields[0].value = FieldValue::Float(2.5);
        let e = f.field_error(0, 3).unwrap();
        assert!(e.contains("lambda") && e.contains("out of range"), "{e}");
        assert_eq!(f.field_error(1, 3), None);
        assert!(f.validate(3).is_err());
        f.fields[1].value = FieldValue::Int(0);
        assert!(f.field_error(1, 3).unwrap().contains("'k'"));
    }

    #[test]
    fn per_task_values_follow_the_expert_list_and_round_trip() {
        let mut f = form();
        f.fields[0].set_per_task(true, 2);
        f.fields[0].per_task = Some(vec![0.1, 0.7]);
        f.fit_experts(3);
        assert_eq!(f.fields[0].per_task, Some(vec![0.1, 0.7, 0.3]));
        let json = f.to_json();
        assert_eq!(json["lambda"], json!([0.1, 0.7, 0.3]));
        assert_eq!(
            f.validate(3).unwrap().values[0].1,
            ParamValue::List(vec![0.1, 0.7, 0.3])
        );
        assert!(f.validate(2).unwrap_err().to_string().contains("exactly 2"));
        let mut g = form();
        g.set_json(&json);
        assert_eq!(g.fields[0].per_task, f.fields[0].per_task);
        g.fields[2].value = FieldValue::Choice("global".into());
        assert_eq!(g.to_json()["trim"], json!("global"));
        g.reset();
        assert!(g.to_json().is_empty());
    }
}

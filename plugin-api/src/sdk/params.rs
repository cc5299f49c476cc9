//! Parameters: the schema a method declares ([`ParamSpec`], serialised by [`schema_json`]) and
//! the validated values it reads back ([`Params`]), with choice parameters as Rust enums
//! ([`Choice`], [`choice_enum!`](crate::choice_enum)).

use super::{Error, Result};
use crate::abi::{self, ParamValue};

/// Type of a parameter in the schema.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    /// A real number, with optional inclusive bounds.
    Float {
        /// Default value.
        default: f64,
        /// Inclusive lower bound.
        min: Option<f64>,
        /// Inclusive upper bound.
        max: Option<f64>,
    },
    /// An integer, with optional inclusive bounds.
    Int {
        /// Default value.
        default: i64,
        /// Inclusive lower bound.
        min: Option<i64>,
        /// Inclusive upper bound.
        max: Option<i64>,
    },
    /// true / false.
    Bool {
        /// Default value.
        default: bool,
    },
    /// One of a fixed set of strings.
    Choice {
        /// Allowed values.
        choices: Vec<&'static str>,
        /// Default value (one of `choices`).
        default: &'static str,
    },
}

/// One entry of a plugin's parameter schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Name, lowercase with underscores.
    pub name: &'static str,
    /// Type, default and range.
    pub ty: ParamType,
    /// One sentence for the form's tooltip and `plugins list`.
    pub help: &'static str,
    /// Float parameters only: one value per expert (a single value is broadcast).
    pub per_task: bool,
    /// The user must give it (the default only fills the window's form): a method whose
    /// result has no sensible value without it, like mergekit's required parameters.
    pub required: bool,
}

impl ParamSpec {
    /// A shared, optional parameter of type `ty`.
    fn of(name: &'static str, ty: ParamType, help: &'static str) -> Self {
        ParamSpec {
            name,
            ty,
            help,
            per_task: false,
            required: false,
        }
    }

    /// A shared float parameter.
    pub fn float(name: &'static str, default: f64, help: &'static str) -> Self {
        ParamSpec::of(
            name,
            ParamType::Float {
                default,
                min: None,
                max: None,
            },
            help,
        )
    }

    /// An integer parameter.
    pub fn int(name: &'static str, default: i64, help: &'static str) -> Self {
        ParamSpec::of(
            name,
            ParamType::Int {
                default,
                min: None,
                max: None,
            },
            help,
        )
    }

    /// A bool parameter.
    pub fn bool(name: &'static str, default: bool, help: &'static str) -> Self {
        ParamSpec::of(name, ParamType::Bool { default }, help)
    }

    /// A choice parameter.
    pub fn choice(name: &'static str, choices: &[&'static str], default: &'static str, help: &'static str) -> Self {
        ParamSpec::of(
            name,
            ParamType::Choice {
                choices: choices.to_vec(),
                default,
            },
            help,
        )
    }

    /// A choice parameter whose values are the Rust enum `T` (see [`Choice`]): the schema's
    /// choices and the value [`Params::choice_of`] returns come from the one list `T::CHOICES`.
    pub fn choice_of<T: Choice>(name: &'static str, default: T, help: &'static str) -> Self {
        ParamSpec::of(
            name,
            ParamType::Choice {
                choices: T::CHOICES.iter().map(|(text, _)| *text).collect(),
                default: default.text(),
            },
            help,
        )
    }

    /// Inclusive range for float and int parameters.
    pub fn range(mut self, lo: f64, hi: f64) -> Self {
        match &mut self.ty {
            ParamType::Float { min, max, .. } => {
                *min = Some(lo);
                *max = Some(hi);
            }
            ParamType::Int { min, max, .. } => {
                *min = Some(lo as i64);
                *max = Some(hi as i64);
            }
            _ => {}
        }
        self
    }

    /// Lower bound only.
    pub fn min(mut self, lo: f64) -> Self {
        match &mut self.ty {
            ParamType::Float { min, .. } => *min = Some(lo),
            ParamType::Int { min, .. } => *min = Some(lo as i64),
            _ => {}
        }
        self
    }

    /// Marks a float parameter as per-task (one value per expert).
    pub fn per_task(mut self) -> Self {
        self.per_task = true;
        self
    }

    /// Marks the parameter as required: the host refuses a merge that does not give it, naming
    /// it; its default only fills the window's form.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }
}

fn json_escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".to_owned()
    }
}

/// Serialises a schema to the JSON the host reads (see plugin-api/README.md).
pub fn schema_json(params: &[ParamSpec]) -> String {
    let mut s = String::from("[");
    for (i, p) in params.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str("{\"name\":");
        json_escape(p.name, &mut s);
        match &p.ty {
            ParamType::Float { default, min, max } => {
                s.push_str(",\"type\":\"float\",\"default\":");
                s.push_str(&json_number(*default));
                if let Some(m) = min {
                    s.push_str(&format!(",\"min\":{}", json_number(*m)));
                }
                if let Some(m) = max {
                    s.push_str(&format!(",\"max\":{}", json_number(*m)));
                }
            }
            ParamType::Int { default, min, max } => {
                s.push_str(&format!(",\"type\":\"int\",\"default\":{default}"));
                if let Some(m) = min {
                    s.push_str(&format!(",\"min\":{m}"));
                }
                if let Some(m) = max {
                    s.push_str(&format!(",\"max\":{m}"));
                }
            }
            ParamType::Bool { default } => {
                s.push_str(&format!(",\"type\":\"bool\",\"default\":{default}"));
            }
            ParamType::Choice { choices, default } => {
                s.push_str(",\"type\":\"choice\",\"choices\":[");
                for (j, c) in choices.iter().enumerate() {
                    if j > 0 {
                        s.push(',');
                    }
                    json_escape(c, &mut s);
                }
                s.push_str("],\"default\":");
                json_escape(default, &mut s);
            }
        }
        if p.required {
            s.push_str(",\"required\":true");
        }
        if p.per_task {
            s.push_str(",\"per_task\":true");
        }
        s.push_str(",\"help\":");
        json_escape(p.help, &mut s);
        s.push('}');
    }
    s.push(']');
    s
}

/// The parameters of one merge, as the host passed them to `create`: every schema parameter,
/// validated against the schema (ranges, choices, finite numbers, one value per expert for
/// per-task lists) with defaults filled in, so a method only reads them.
pub struct Params<'a> {
    values: &'a [ParamValue],
    n_experts: Option<usize>,
}

impl<'a> Params<'a> {
    /// Wraps the host's parameter array.
    ///
    /// # Safety
    /// `ptr` must point to `n` values (or be null with `n == 0`) alive for `'a`.
    pub unsafe fn from_raw(ptr: *const ParamValue, n: usize) -> Params<'a> {
        let values = if ptr.is_null() || n == 0 {
            &[][..]
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(ptr, n) }
        };
        Params {
            values,
            n_experts: None,
        }
    }

    /// The same parameters for a merge of `n` experts (what [`Params::per_task`] checks).
    pub fn for_experts(self, n: usize) -> Params<'a> {
        Params {
            n_experts: Some(n),
            ..self
        }
    }

    fn find(&self, name: &str) -> Result<&'a ParamValue> {
        self.values
            .iter()
            // SAFETY: the host keeps names alive for the call.
            .find(|p| unsafe { p.name.as_str() }.is_ok_and(|n| n == name))
            .ok_or_else(|| Error::Message(format!("parameter '{name}' was not passed by the host")))
    }

    fn expect_kind(&self, p: &ParamValue, name: &str, kind: abi::ParamKind, what: &str) -> Result<()> {
        if p.kind == kind {
            Ok(())
        } else {
            Err(Error::Message(format!(
                "parameter '{name}' is not {what} (kind {})",
                p.kind
            )))
        }
    }

    /// A float parameter.
    pub fn float(&self, name: &str) -> Result<f64> {
        let p = self.find(name)?;
        match p.kind {
            abi::PARAM_FLOAT => Ok(p.number),
            abi::PARAM_INT => Ok(p.integer as f64),
            _ => Err(Error::Message(format!("parameter '{name}' is not a number"))),
        }
    }

    /// A float parameter that must lie strictly between `lo` and `hi` (an open interval, which
    /// the schema's inclusive `range` cannot say); the error names the parameter, its value and
    /// the interval, then `hint` (what the ends mean, the usual value).
    pub fn float_strictly_between(&self, name: &str, lo: f64, hi: f64, hint: &str) -> Result<f64> {
        let x = self.float(name)?;
        if x > lo && x < hi {
            Ok(x)
        } else {
            Err(Error::Message(format!(
                "parameter '{name}' is {x}, but it must lie strictly between {lo} and {hi}; {hint}"
            )))
        }
    }

    /// An int parameter.
    pub fn int(&self, name: &str) -> Result<i64> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_INT, "an integer")?;
        Ok(p.integer)
    }

    /// A bool parameter.
    pub fn bool(&self, name: &str) -> Result<bool> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_BOOL, "a bool")?;
        Ok(p.integer != 0)
    }

    /// A choice parameter.
    pub fn choice(&self, name: &str) -> Result<&'a str> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_CHOICE, "a choice")?;
        // SAFETY: the host keeps the text alive for the call.
        unsafe { p.text.as_str() }.map_err(|_| Error::Message(format!("parameter '{name}' is not UTF-8")))
    }

    /// A float-list (per-task) parameter.
    pub fn list(&self, name: &str) -> Result<Vec<f64>> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_FLOAT_LIST, "a list")?;
        if p.list.is_null() || p.list_len == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the host keeps the list alive for the call.
        Ok(unsafe { std::slice::from_raw_parts(p.list, p.list_len) }.to_vec())
    }

    /// A choice parameter as its enum `T` (declared with [`ParamSpec::choice_of`]).
    pub fn choice_of<T: Choice>(&self, name: &str) -> Result<T> {
        let text = self.choice(name)?;
        T::from_text(text).ok_or_else(|| {
            Error::Message(format!(
                "parameter '{name}' = '{text}' is none of the method's choices ({}); the host should have \
                 refused it, so the plugin's schema and code disagree: rebuild the plugin",
                T::CHOICES.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// A per-task float parameter: one value per expert, in input order (the host broadcasts a
    /// single value the user gave).
    pub fn per_task(&self, name: &str) -> Result<Vec<f64>> {
        let values = self.list(name)?;
        match self.n_experts {
            Some(n) if values.len() != n => Err(Error::Message(format!(
                "parameter '{name}': the host passed {} values for {n} experts; a per-task parameter has one \
                 value per expert",
                values.len()
            ))),
            _ => Ok(values),
        }
    }
}

/// A choice parameter's values as a Rust enum, declared once with [`choice_enum!`](crate::choice_enum):
/// the text users type for each value and the value the method gets.
pub trait Choice: Copy + PartialEq + 'static {
    /// Every value with its text, in the order forms list them.
    const CHOICES: &'static [(&'static str, Self)];

    /// The text of a value.
    fn text(self) -> &'static str {
        Self::CHOICES.iter().find(|(_, v)| *v == self).map_or("", |(t, _)| *t)
    }

    /// The value a text names, if any.
    fn from_text(text: &str) -> Option<Self> {
        Self::CHOICES.iter().find(|(t, _)| *t == text).map(|(_, v)| *v)
    }
}

/// Declares an enum of a choice parameter and its [`Choice`] list in one place:
///
/// ```
/// mergescope_plugin_api::choice_enum! {
///     /// How kept entries are rescaled.
///     pub enum Rescale {
///         /// 1/(1 − p).
///         Inverse = "inverse",
///         /// No rescale.
///         None = "none",
///     }
/// }
/// use mergescope_plugin_api::sdk::Choice;
/// assert_eq!(Rescale::from_text("none"), Some(Rescale::None));
/// assert_eq!(Rescale::Inverse.text(), "inverse");
/// ```
#[macro_export]
macro_rules! choice_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $crate::sdk::Choice for $name {
            const CHOICES: &'static [(&'static str, Self)] = &[$(($text, $name::$variant)),+];
        }
    };
}

//! What the oracle runs with, and the one door its settings come through: the CLI's option
//! values and the window's form fields are both parsed by [`OracleText::settings`] and checked
//! by [`OracleSettings::validate`], so a bad value gets the same message in both, named by the
//! CLI's option.

use candle_core::DType;
use mergescope_engine::error::{EngineError, Result};

/// The floating-point type gradient descent runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32, as the build fine-tunes.
    F32,
    /// f64: the weights, activations, gradients and steps (the default).
    F64,
}

impl Precision {
    /// Both, in the order the front ends offer them.
    pub const ALL: [Precision; 2] = [Precision::F64, Precision::F32];

    /// The candle dtype.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F64 => DType::F64,
        }
    }

    /// `f32` or `f64`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F64 => "f64",
        }
    }

    /// The distance from `x`, rounded to this precision, to the next number of this precision
    /// away from zero.
    pub(super) fn ulp(self, x: f64) -> f64 {
        match self {
            Precision::F32 => {
                let a = (x as f32).abs();
                f64::from(f32::from_bits(a.to_bits() + 1)) - f64::from(a)
            }
            Precision::F64 => {
                let a = x.abs();
                f64::from_bits(a.to_bits() + 1) - a
            }
        }
    }
}

/// What the oracle runs: tasks, examples, learning rates, epoch counts.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleSettings {
    /// Tasks of the build to use, in this order (empty: all of them, in the build's order).
    pub tasks: Vec<String>,
    /// Train texts per task, the first ones of its train split: the full batch.
    pub examples: usize,
    /// Learning rates η.
    pub lrs: Vec<f64>,
    /// Epoch counts E (one full-batch step per epoch).
    pub epochs: Vec<usize>,
    /// Task arithmetic's α (the multi-task step is αη).
    pub alpha: f64,
    /// Tokens kept per text (`None`: the build's).
    pub max_length: Option<usize>,
    /// Test texts per task the models are scored on (the first ones; 0: no scoring).
    pub eval_examples: usize,
    /// The type gradient descent runs in.
    pub precision: Precision,
}

impl Default for OracleSettings {
    fn default() -> Self {
        OracleSettings {
            tasks: Vec::new(),
            examples: 32,
            lrs: vec![2.5e-6, 5e-6, 1e-5, 2e-5],
            epochs: vec![1, 2, 4],
            alpha: 1.0,
            max_length: None,
            eval_examples: 100,
            precision: Precision::F64,
        }
    }
}

/// The largest `--max-length`: the builds keep at most 128 tokens per text.
pub const MAX_LENGTH: usize = 128;

fn bad<T>(m: String) -> Result<T> {
    Err(EngineError::Param(m))
}

impl OracleSettings {
    /// Checks the settings before any work (named as the CLI's options, with what to give
    /// instead).
    pub fn validate(&self) -> Result<()> {
        if self.lrs.is_empty() {
            return bad(format!(
                "--lr: give at least one learning rate η, e.g. --lr {}",
                LRS_EXAMPLE
            ));
        }
        if let Some(lr) = self.lrs.iter().find(|lr| !(lr.is_finite() && **lr > 0.0)) {
            return bad(format!(
                "--lr {lr}: every learning rate η must be a positive number (gradient descent steps downhill); give e.g. --lr {LRS_EXAMPLE}"
            ));
        }
        if self.epochs.is_empty() {
            return bad(format!(
                "--epochs: give at least one epoch count, e.g. --epochs {EPOCHS_EXAMPLE}"
            ));
        }
        if self.epochs.contains(&0) {
            return bad(format!(
                "--epochs 0: every epoch count must be at least 1 (an epoch is one full-batch step; at 0 both models are the base); give e.g. --epochs {EPOCHS_EXAMPLE}"
            ));
        }
        if self.examples == 0 {
            return bad(
                "--examples 0: each task needs at least one train text (the full batch of every step); give --examples 1 or more (default 32)"
                    .into(),
            );
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad(format!(
                "--alpha {}: α must be a positive number (θ_TA = θ0 + α Σ τ_t); give e.g. --alpha 1 (the default)",
                self.alpha
            ));
        }
        if let Some(n) = self.max_length
            && !(1..=MAX_LENGTH).contains(&n)
        {
            return bad(format!(
                "--max-length {n}: tokens kept per text must be between 1 and {MAX_LENGTH}; leave --max-length out to keep the build's"
            ));
        }
        if let Some(name) = self.tasks.iter().find(|t| t.trim().is_empty()) {
            return bad(format!(
                "--tasks: an empty task name ('{name}'); name the build's tasks separated by commas, e.g. --tasks word_sentiment,name_gender, or leave --tasks out for all"
            ));
        }
        let twice = (self.tasks.iter().enumerate()).find_map(|(i, t)| self.tasks[..i].contains(t).then_some(t));
        if let Some(name) = twice {
            return bad(format!("--tasks names '{name}' twice; name each task once"));
        }
        Ok(())
    }
}

const LRS_EXAMPLE: &str = "5e-6,1e-5";
const EPOCHS_EXAMPLE: &str = "1,2,4";

/// `items` joined the way the fields show lists (`, `).
fn join<T: ToString>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The comma-separated entries of `text` (the value of `option`), trimmed; an empty entry
/// between commas is refused. Empty text is an empty list.
fn entries<'a>(option: &str, text: &'a str) -> Result<Vec<&'a str>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    if items.iter().any(|s| s.is_empty()) {
        return bad(format!(
            "{option} '{text}': an empty entry between commas; separate the values by single commas"
        ));
    }
    Ok(items)
}

/// A whole number ≥ 0 typed for `option`; `example` is how a good value reads.
fn count(option: &str, text: &str, example: &str) -> Result<usize> {
    let t = text.trim();
    t.parse::<usize>().or_else(|_| {
        let why = if t.parse::<i64>().is_ok() || t.parse::<f64>().is_ok_and(|x| x < 0.0) {
            "is negative"
        } else {
            "is not a whole number"
        };
        bad(format!(
            "{option} '{t}' {why}; give a whole number of 1 or more, e.g. {option} {example}"
        ))
    })
}

/// Parses `--examples` as typed: a whole number (0 is refused by [`OracleSettings::validate`]).
pub fn parse_examples(text: &str) -> Result<usize> {
    count("--examples", text, "32")
}

/// Parses `--lr` as typed: numbers separated by commas (their signs and finiteness are
/// checked by [`OracleSettings::validate`]).
pub fn parse_lrs(text: &str) -> Result<Vec<f64>> {
    entries("--lr", text)?
        .into_iter()
        .map(|s| {
            s.parse::<f64>().or_else(|_| {
                bad(format!(
                    "--lr '{s}' is not a number; give learning rates separated by commas, e.g. --lr {LRS_EXAMPLE}"
                ))
            })
        })
        .collect()
}

/// Parses `--epochs` as typed: whole numbers separated by commas.
pub fn parse_epochs(text: &str) -> Result<Vec<usize>> {
    entries("--epochs", text)?
        .into_iter()
        .map(|s| count("--epochs", s, EPOCHS_EXAMPLE))
        .collect()
}

/// The settings a user types, as text (the CLI's `--examples`, `--lr`, `--epochs` and
/// `--precision`; the window's oracle form): [`OracleText::settings`] is the one door both go
/// through.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleText {
    /// Train texts per task (`--examples`).
    pub examples: String,
    /// Learning rates η, separated by commas (`--lr`).
    pub lrs: String,
    /// Epoch counts E, separated by commas (`--epochs`).
    pub epochs: String,
    /// The type gradient descent runs in (`--precision`).
    pub precision: Precision,
}

impl Default for OracleText {
    /// [`OracleSettings::default`]'s values, as text.
    fn default() -> Self {
        let d = OracleSettings::default();
        OracleText {
            examples: d.examples.to_string(),
            lrs: d.lrs.iter().map(|lr| format!("{lr:e}")).collect::<Vec<_>>().join(", "),
            epochs: join(&d.epochs),
            precision: d.precision,
        }
    }
}

impl OracleText {
    /// `rest` (tasks, α, max length, scored texts) with these fields parsed into it, checked
    /// by [`OracleSettings::validate`].
    pub fn settings(&self, rest: OracleSettings) -> Result<OracleSettings> {
        let s = OracleSettings {
            examples: parse_examples(&self.examples)?,
            lrs: parse_lrs(&self.lrs)?,
            epochs: parse_epochs(&self.epochs)?,
            precision: self.precision,
            ..rest
        };
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_say_which_option_is_wrong() {
        let ok = OracleSettings::default();
        assert!(ok.validate().is_ok());
        type Edit = fn(&mut OracleSettings);
        let cases: [(Edit, &str); 9] = [
            (|s| s.lrs = vec![0.01, 0.0], "--lr 0"),
            (|s| s.lrs = vec![-1.0], "--lr -1"),
            (|s| s.lrs = vec![f64::NAN], "--lr NaN"),
            (|s| s.epochs = vec![1, 0], "--epochs 0"),
            (|s| s.examples = 0, "--examples 0"),
            (|s| s.max_length = Some(500), "--max-length 500"),
            (|s| s.alpha = f64::INFINITY, "--alpha inf"),
            (|s| s.tasks = vec!["a".into(), "a".into()], "--tasks names 'a' twice"),
            (|s| s.tasks = vec![" ".into()], "--tasks: an empty task name"),
        ];
        for (edit, want) in cases {
            let mut s = ok.clone();
            edit(&mut s);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn the_text_door_parses_what_the_cli_and_the_form_take() {
        let d = OracleText::default();
        assert_eq!(
            (d.examples.as_str(), d.lrs.as_str(), d.epochs.as_str()),
            ("32", "2.5e-6, 5e-6, 1e-5, 2e-5", "1, 2, 4")
        );
        assert_eq!(
            d.settings(OracleSettings::default()).unwrap(),
            OracleSettings::default()
        );
        let t = OracleText {
            examples: " 8 ".into(),
            lrs: "1e-5,2e-5".into(),
            epochs: "2, 1".into(),
            precision: Precision::F32,
        };
        let s = t.settings(OracleSettings::default()).unwrap();
        assert_eq!((s.examples, s.lrs, s.epochs), (8, vec![1e-5, 2e-5], vec![2, 1]));
        type Edit = fn(&mut OracleText);
        let cases: [(Edit, &str); 10] = [
            (|t| t.examples = "abc".into(), "--examples 'abc' is not a whole number"),
            (|t| t.examples = "-3".into(), "--examples '-3' is negative"),
            (|t| t.examples = "2.5".into(), "--examples '2.5' is not a whole number"),
            (|t| t.examples = "0".into(), "--examples 0: each task needs"),
            (|t| t.lrs = "".into(), "--lr: give at least one learning rate"),
            (|t| t.lrs = "1e-5,,2e-5".into(), "--lr '1e-5,,2e-5': an empty entry"),
            (|t| t.lrs = "fast".into(), "--lr 'fast' is not a number"),
            (|t| t.lrs = "NaN".into(), "--lr NaN: every learning rate"),
            (|t| t.epochs = " ".into(), "--epochs: give at least one epoch count"),
            (|t| t.epochs = "1,-2".into(), "--epochs '-2' is negative"),
        ];
        for (edit, want) in cases {
            let mut t = OracleText::default();
            edit(&mut t);
            let e = t.settings(OracleSettings::default()).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}

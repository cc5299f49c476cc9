//! Compatibility of the inputs of a merge: every tensor present everywhere, with one shape,
//! and float where it is merged. Every problem is named in one report, not just the first.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What to do with a tensor that not every input has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingPolicy {
    /// Refuse the merge and list the tensors (default).
    #[default]
    Error,
    /// Keep the reference model's tensor unmerged (the base, or the first expert).
    UseReference,
    /// Leave the tensor out of the output.
    Skip,
}

impl MissingPolicy {
    /// Parses `error`, `use-reference` (alias `base`), `skip`.
    pub fn parse(s: &str) -> Option<MissingPolicy> {
        match s {
            "error" => Some(MissingPolicy::Error),
            "use-reference" | "base" | "reference" => Some(MissingPolicy::UseReference),
            "skip" => Some(MissingPolicy::Skip),
            _ => None,
        }
    }
}

/// Name, dtype and shape of every tensor of one input.
pub type ModelDesc = BTreeMap<String, (DType, Vec<usize>)>;

/// How each tensor of the reference model will be treated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorFate {
    /// Merged by the method.
    Merge,
    /// Copied from the reference unchanged, with the reason.
    Copy(String),
    /// Left out of the output, with the reason.
    Skip(String),
}

/// Result of the compatibility check.
#[derive(Clone, Debug, Default)]
pub struct CompatReport {
    /// Fate of each reference tensor, in name order.
    pub fates: BTreeMap<String, TensorFate>,
    /// Notes for the user and the output metadata (dtype conversions, copies, skips).
    pub notes: Vec<String>,
}

fn list(items: &[String]) -> String {
    const SHOWN: usize = 20;
    let mut s = items
        .iter()
        .take(SHOWN)
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n");
    if items.len() > SHOWN {
        s.push_str(&format!("\n  … and {} more", items.len() - SHOWN));
    }
    s
}

/// Checks `others` against `reference` (labels name the inputs in messages, reference first).
pub fn check(
    labels: &[String],
    reference: &ModelDesc,
    others: &[&ModelDesc],
    missing: MissingPolicy,
) -> Result<CompatReport, String> {
    let mut problems: Vec<String> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut report = CompatReport::default();
    let label = |i: usize| labels.get(i).cloned().unwrap_or_else(|| format!("input {i}"));
    for (i, o) in others.iter().enumerate() {
        let extra: Vec<&String> = o.keys().filter(|k| !reference.contains_key(*k)).collect();
        for k in extra {
            problems.push(format!("tensor '{k}' is in {} but not in {}", label(i + 1), label(0)));
        }
    }
    let mut converted = 0usize;
    for (name, (dtype, shape)) in reference {
        let mut fate = if dtype.is_float() {
            TensorFate::Merge
        } else {
            TensorFate::Copy(format!(
                "'{name}' has non-float dtype {}: copied from {}",
                dtype.name(),
                label(0)
            ))
        };
        for (i, o) in others.iter().enumerate() {
            match o.get(name) {
                None => partial.push(format!("tensor '{name}' is missing from {}", label(i + 1))),
                Some((d, s)) => {
                    if s != shape {
                        problems.push(format!(
                            "tensor '{name}' has shape {s:?} in {} but {shape:?} in {} (different vocabulary or \
                             architecture?)",
                            label(i + 1),
                            label(0)
                        ));
                    }
                    if d != dtype {
                        if d.is_float() && dtype.is_float() {
                            converted += 1;
                        } else {
                            problems.push(format!(
                                "tensor '{name}' has dtype {} in {} but {} in {}",
                                d.name(),
                                label(i + 1),
                                dtype.name(),
                                label(0)
                            ));
                        }
                    }
                }
            }
        }
        if others.iter().any(|o| !o.contains_key(name)) {
            fate = match missing {
                MissingPolicy::Error => fate,
                MissingPolicy::UseReference => {
                    TensorFate::Copy(format!("'{name}' is not in every input: copied from {}", label(0)))
                }
                MissingPolicy::Skip => TensorFate::Skip(format!("'{name}' is not in every input: left out")),
            };
        }
        report.fates.insert(name.clone(), fate);
    }
    if missing == MissingPolicy::Error {
        problems.extend(partial);
    }
    if !problems.is_empty() {
        let n = problems.len();
        let hint = if missing == MissingPolicy::Error {
            "\nFix: use checkpoints fine-tuned from the same base model; for tensors that only some inputs have, \
             --on-missing use-reference keeps the reference's copy and --on-missing skip leaves them out."
        } else {
            "\nFix: use checkpoints fine-tuned from the same base model."
        };
        return Err(format!("{n} problem(s):\n{}{hint}", list(&problems)));
    }
    if converted > 0 {
        report.notes.push(format!(
            "{converted} tensor(s) have a different float dtype in some inputs; all are computed in f32"
        ));
    }
    for fate in report.fates.values() {
        match fate {
            TensorFate::Copy(why) | TensorFate::Skip(why) => report.notes.push(why.clone()),
            TensorFate::Merge => {}
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(items: &[(&str, DType, &[usize])]) -> ModelDesc {
        items
            .iter()
            .map(|(n, d, s)| ((*n).to_owned(), (*d, s.to_vec())))
            .collect()
    }

    #[test]
    fn names_every_problem() {
        let base = desc(&[
            ("a", DType::F32, &[2, 2]),
            ("b", DType::F32, &[3]),
            ("c", DType::F32, &[1]),
        ]);
        let e1 = desc(&[
            ("a", DType::F32, &[2, 3]),
            ("b", DType::F32, &[3]),
            ("x", DType::F32, &[1]),
        ]);
        let labels = vec!["base.safetensors".to_owned(), "e1.safetensors".to_owned()];
        let err = check(&labels, &base, &[&e1], MissingPolicy::Error).unwrap_err();
        assert!(
            err.contains("'a' has shape [2, 3] in e1.safetensors but [2, 2] in base.safetensors"),
            "{err}"
        );
        assert!(
            err.contains("'x' is in e1.safetensors but not in base.safetensors"),
            "{err}"
        );
        assert!(err.contains("'c' is missing from e1.safetensors"), "{err}");
        assert!(err.starts_with("3 problem(s)"), "{err}");
    }

    #[test]
    fn missing_policies_and_int_buffers() {
        let base = desc(&[
            ("a", DType::F32, &[2]),
            ("steps", DType::parse("I64").unwrap(), &[]),
            ("c", DType::BF16, &[1]),
        ]);
        let e1 = desc(&[("a", DType::F16, &[2]), ("steps", DType::parse("I64").unwrap(), &[])]);
        let labels = vec!["base".to_owned(), "e1".to_owned()];
        let r = check(&labels, &base, &[&e1], MissingPolicy::UseReference).unwrap();
        assert_eq!(r.fates["a"], TensorFate::Merge);
        assert!(matches!(r.fates["steps"], TensorFate::Copy(_)));
        assert!(matches!(r.fates["c"], TensorFate::Copy(_)));
        assert!(r.notes.iter().any(|n| n.contains("computed in f32")));
        let r = check(&labels, &base, &[&e1], MissingPolicy::Skip).unwrap();
        assert!(matches!(r.fates["c"], TensorFate::Skip(_)));
    }
}

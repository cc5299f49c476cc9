//! The text benchmark's tasks: five text-classification tasks made by
//! `scripts/text-bench-data.py` from permissively licensed data shipped in registry packages
//! (Debian, PyPI, npm), stored in `assets/text/` (JSON lines, labels as class names, a train,
//! calibration and test split each; `tasks.json` records classes, sources, licences and
//! checksums) and compiled in.
//! Tokenising happens once per build ([`Tokenized`]); batches are padded to their longest.

use crate::family::bert::TokenBatch;
use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::BTreeMap;
use tokenizers::Tokenizer;

/// A split of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TextSplit {
    /// What heads and experts are trained on.
    Train,
    /// Held out, for choosing merge coefficients.
    Calibration,
    /// Held out, for reporting.
    Test,
}

impl TextSplit {
    /// Every split, in file order.
    pub const ALL: [TextSplit; 3] = [TextSplit::Train, TextSplit::Calibration, TextSplit::Test];

    /// The split's file-name part.
    pub fn name(self) -> &'static str {
        match self {
            TextSplit::Train => "train",
            TextSplit::Calibration => "calibration",
            TextSplit::Test => "test",
        }
    }
}

/// One labelled text.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// The text.
    pub text: String,
    /// Class index.
    pub label: usize,
}

/// A text-classification task with its three splits.
#[derive(Clone, Debug, PartialEq)]
pub struct TextTask {
    /// Task name (also its file-name stem).
    pub name: String,
    /// Class names, in label order.
    pub classes: Vec<String>,
    /// Splits by kind.
    pub splits: BTreeMap<TextSplit, Vec<Example>>,
    /// The JSON-lines text of each split as stored (copied next to a build's suite).
    pub files: BTreeMap<TextSplit, String>,
}

impl TextTask {
    /// The examples of `split`.
    pub fn split(&self, split: TextSplit) -> &[Example] {
        self.splits.get(&split).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The file name of `split` (`<task>.<split>.jsonl`).
    pub fn file_name(&self, split: TextSplit) -> String {
        format!("{}.{}.jsonl", self.name, split.name())
    }

    /// Keeps at most `n` examples of `split` (the first ones; the files are in a mixed order).
    pub fn truncate(&mut self, split: TextSplit, n: usize) {
        if let Some(v) = self.splits.get_mut(&split)
            && v.len() > n
        {
            v.truncate(n);
            let text: String = self
                .files
                .get(&split)
                .map(String::as_str)
                .unwrap_or("")
                .lines()
                .take(n)
                .fold(String::new(), |mut acc, l| {
                    acc.push_str(l);
                    acc.push('\n');
                    acc
                });
            self.files.insert(split, text);
        }
    }
}

macro_rules! task_files {
    ($($name:literal),*) => {
        &[$(($name, [
            include_str!(concat!("../../../../assets/text/", $name, ".train.jsonl")),
            include_str!(concat!("../../../../assets/text/", $name, ".calibration.jsonl")),
            include_str!(concat!("../../../../assets/text/", $name, ".test.jsonl")),
        ])),*]
    };
}

/// The built-in tasks' files: name and (train, calibration, test) JSON lines.
const BUILTIN: &[(&str, [&str; 3])] = task_files!(
    "cldr_language",
    "emoji_group",
    "fortune_topic",
    "name_gender",
    "word_sentiment"
);

/// `assets/text/tasks.json`: classes, sources, licences and checksums of the built-in tasks.
pub const TASKS_JSON: &str = include_str!("../../../../assets/text/tasks.json");

/// Parses one split's JSON lines (`{"text": ..., "label": "<class name>"}`); errors name the
/// task, split and line.
pub fn parse_split(task: &str, split: TextSplit, text: &str, classes: &[String]) -> Result<Vec<Example>> {
    let at = |line: usize, what: String| {
        EngineError::invalid(format!(
            "text task '{task}', {} split, line {line}: {what}; rebuild assets/text with scripts/text-bench-data.py",
            split.name()
        ))
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(i + 1, format!("not JSON ({e})")))?;
        let text = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| at(i + 1, "no string \"text\"".into()))?;
        let label = v
            .get("label")
            .and_then(|t| t.as_str())
            .ok_or_else(|| at(i + 1, "no string \"label\"".into()))?;
        let label = classes
            .iter()
            .position(|c| c == label)
            .ok_or_else(|| at(i + 1, format!("label '{label}' is not one of {}", classes.join(", "))))?;
        out.push(Example {
            text: text.to_owned(),
            label,
        });
    }
    if out.is_empty() {
        return Err(at(0, "no examples".into()));
    }
    Ok(out)
}

/// The five built-in tasks, sorted by name.
pub fn builtin_tasks() -> Result<Vec<TextTask>> {
    let meta: serde_json::Value = serde_json::from_str(TASKS_JSON)
        .map_err(|e| EngineError::Bug(format!("assets/text/tasks.json is not JSON: {e}")))?;
    BUILTIN
        .iter()
        .map(|(name, texts)| {
            let classes: Vec<String> = meta
                .get(*name)
                .and_then(|m| m.get("classes"))
                .and_then(|c| c.as_array())
                .map(|c| c.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
                .ok_or_else(|| EngineError::Bug(format!("assets/text/tasks.json lists no classes for '{name}'")))?;
            let mut splits = BTreeMap::new();
            let mut files = BTreeMap::new();
            for (split, text) in TextSplit::ALL.into_iter().zip(texts) {
                splits.insert(split, parse_split(name, split, text, &classes)?);
                files.insert(split, (*text).to_owned());
            }
            Ok(TextTask {
                name: (*name).to_owned(),
                classes,
                splits,
                files,
            })
        })
        .collect()
}

/// Token ids of a list of examples, tokenised once (special tokens added, truncated as the
/// tokenizer says), with their labels.
#[derive(Clone, Debug)]
pub struct Tokenized {
    /// Token ids per example.
    pub ids: Vec<Vec<u32>>,
    /// Token type ids per example.
    pub type_ids: Vec<Vec<u32>>,
    /// Labels per example.
    pub labels: Vec<u32>,
}

impl Tokenized {
    /// Tokenises `examples` with `tokenizer`.
    pub fn new(tokenizer: &Tokenizer, examples: &[Example]) -> Result<Tokenized> {
        let texts: Vec<&str> = examples.iter().map(|e| e.text.as_str()).collect();
        let encodings = tokenizer
            .encode_batch(texts, true)
            .map_err(|e| EngineError::invalid(format!("the tokenizer failed: {e}")))?;
        Ok(Tokenized {
            ids: encodings.iter().map(|e| e.get_ids().to_vec()).collect(),
            type_ids: encodings.iter().map(|e| e.get_type_ids().to_vec()).collect(),
            labels: examples.iter().map(|e| e.label as u32).collect(),
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Examples `idx`, padded with `pad_id` to the longest of them, and their labels.
    pub fn batch(&self, idx: &[usize], pad_id: u32, device: &Device) -> Result<(TokenBatch, Tensor)> {
        let n = idx.len();
        let len = idx.iter().map(|&i| self.ids[i].len()).max().unwrap_or(0);
        let (mut ids, mut types, mut mask) = (vec![pad_id; n * len], vec![0u32; n * len], vec![0u32; n * len]);
        for (row, &i) in idx.iter().enumerate() {
            let (at, k) = (row * len, self.ids[i].len());
            ids[at..at + k].copy_from_slice(&self.ids[i]);
            types[at..at + k].copy_from_slice(&self.type_ids[i]);
            mask[at..at + k].fill(1);
        }
        let labels: Vec<u32> = idx.iter().map(|&i| self.labels[i]).collect();
        Ok((
            TokenBatch {
                ids: Tensor::from_vec(ids, (n, len), device)?,
                type_ids: Tensor::from_vec(types, (n, len), device)?,
                mask: Tensor::from_vec(mask, (n, len), device)?,
            },
            Tensor::from_vec(labels, n, device)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_tasks_parse_with_disjoint_splits() {
        let tasks = builtin_tasks().unwrap();
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cldr_language",
                "emoji_group",
                "fortune_topic",
                "name_gender",
                "word_sentiment"
            ]
        );
        for t in &tasks {
            assert!(t.classes.len() >= 2, "{}", t.name);
            let train: std::collections::HashSet<&str> =
                t.split(TextSplit::Train).iter().map(|e| e.text.as_str()).collect();
            for split in [TextSplit::Calibration, TextSplit::Test] {
                let s = t.split(split);
                assert!(s.len() >= 80, "{} {split:?}", t.name);
                assert!(
                    s.iter().all(|e| !train.contains(e.text.as_str())),
                    "{} {split:?}",
                    t.name
                );
                // Every class is in every split.
                for c in 0..t.classes.len() {
                    assert!(s.iter().any(|e| e.label == c), "{} {split:?} class {c}", t.name);
                }
            }
        }
        let meta: serde_json::Value = serde_json::from_str(TASKS_JSON).unwrap();
        for t in &tasks {
            let m = &meta[&t.name];
            assert!(m["license"].as_str().is_some_and(|l| !l.is_empty()), "{}", t.name);
            assert!(
                m["sources"][0]["sha256"].as_str().is_some_and(|s| s.len() == 64),
                "{}",
                t.name
            );
            assert_eq!(
                m["examples"]["test"].as_u64(),
                Some(t.split(TextSplit::Test).len() as u64)
            );
        }
    }

    #[test]
    fn bad_lines_name_the_task_split_and_line() {
        let classes = ["a".to_owned(), "b".to_owned()];
        let e = parse_split(
            "t",
            TextSplit::Test,
            "{\"text\": \"x\", \"label\": \"a\"}\n{\"text\": \"y\", \"label\": \"c\"}\n",
            &classes,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("'t'") && e.contains("test") && e.contains("line 2") && e.contains("'c'"),
            "{e}"
        );
        let mut t = builtin_tasks().unwrap().remove(0);
        t.truncate(TextSplit::Train, 3);
        assert_eq!(t.split(TextSplit::Train).len(), 3);
        assert_eq!(t.files[&TextSplit::Train].lines().count(), 3);
    }
}

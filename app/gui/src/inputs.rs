//! The checkpoints of a session: one optional base and the experts, each with what the user
//! needs to see before merging (size, dtypes, tensor count) and its compatibility problems.

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat::{self, MissingPolicy, ModelDesc};
use mergescope_engine::error::{EngineError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a checkpoint holds, read from its headers (no tensor data is loaded).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Bytes on disk, all shards together.
    pub bytes: u64,
    /// Number of files (1, or the shards of a folder).
    pub files: usize,
    /// Number of tensors.
    pub tensors: usize,
    /// The dtypes present, e.g. "f32" or "bf16, i64".
    pub dtypes: String,
    /// Names, dtypes and shapes, for compatibility checks.
    pub desc: ModelDesc,
}

impl Summary {
    /// Reads the headers of the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Summary> {
        let c = Checkpoint::open(path)?;
        let dtypes: BTreeSet<&str> = c.tensors.values().map(|t| t.dtype.name()).collect();
        Ok(Summary {
            bytes: c.total_bytes(),
            files: c.files.len(),
            tensors: c.tensors.len(),
            dtypes: dtypes.into_iter().collect::<Vec<_>>().join(", "),
            desc: c
                .tensors
                .iter()
                .map(|(k, t)| (k.clone(), (t.dtype, t.shape.clone())))
                .collect(),
        })
    }
}

/// One checkpoint in the doc.
#[derive(Clone, Debug)]
pub struct InputFile {
    /// File or sharded folder.
    pub path: PathBuf,
    /// The name shown in lists and result tables (a task name for the demo experts).
    pub label: String,
    /// Header summary, or why it could not be read.
    pub summary: std::result::Result<Summary, Arc<EngineError>>,
    /// Compatibility problems with the reference (the base, or the first expert).
    pub problems: Vec<String>,
}

impl InputFile {
    /// Reads `path`'s headers; a label defaults to the file stem.
    pub fn open(path: &Path, label: Option<String>) -> InputFile {
        let label = label.unwrap_or_else(|| default_label(path));
        InputFile {
            path: path.to_path_buf(),
            label,
            summary: Summary::read(path).map_err(Arc::new),
            problems: Vec::new(),
        }
    }

    /// Whether this input can take part in a merge.
    pub fn is_ok(&self) -> bool {
        self.summary.is_ok() && self.problems.is_empty()
    }
}

/// The file stem of a checkpoint file, or the folder name of a sharded checkpoint.
pub fn default_label(path: &Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// How an input is stored in a project file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputRef {
    /// File or folder.
    pub path: PathBuf,
    /// Display label.
    pub label: String,
}

/// The base and the experts, in merge order.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Base (pretrained) checkpoint; methods that need one say so in their help.
    pub base: Option<InputFile>,
    /// Experts, in the order given to the method (per-task parameters follow it).
    pub experts: Vec<InputFile>,
}

impl Inputs {
    /// Sets the base (replacing any), then re-checks compatibility.
    pub fn set_base(&mut self, path: &Path, label: Option<String>) {
        self.base = Some(InputFile::open(path, label));
        self.recheck();
    }

    /// Adds an expert unless that path is already an input; returns whether it was added.
    pub fn add_expert(&mut self, path: &Path, label: Option<String>) -> bool {
        let dup = self.experts.iter().any(|e| e.path == path) || self.base.as_ref().is_some_and(|b| b.path == path);
        if dup {
            return false;
        }
        self.experts.push(InputFile::open(path, label));
        self.recheck();
        true
    }

    /// Removes expert `i`.
    pub fn remove_expert(&mut self, i: usize) {
        if i < self.experts.len() {
            self.experts.remove(i);
            self.recheck();
        }
    }

    /// Moves expert `i` one place up (towards the front).
    pub fn move_up(&mut self, i: usize) {
        if i > 0 && i < self.experts.len() {
            self.experts.swap(i - 1, i);
            self.recheck();
        }
    }

    /// Removes every input.
    pub fn clear(&mut self) {
        self.base = None;
        self.experts.clear();
    }

    /// Whether a merge can start: at least one expert and no problems anywhere.
    pub fn ready(&self) -> Result<()> {
        self.readable()?;
        if let Some(bad) = self.base.iter().chain(&self.experts).find(|f| !f.problems.is_empty()) {
            return Err(EngineError::Invalid(format!(
                "'{}' does not match the other inputs; see its problems",
                bad.label
            )));
        }
        Ok(())
    }

    /// Whether there is an expert and every input can be read (what a run needs before the
    /// inputs' shapes are compared); the message says what to fix.
    pub fn readable(&self) -> Result<()> {
        if self.experts.is_empty() {
            return Err(EngineError::invalid("add at least one expert checkpoint"));
        }
        if let Some(bad) = self.base.iter().chain(&self.experts).find(|f| f.summary.is_err()) {
            return Err(EngineError::Invalid(format!(
                "'{}' cannot be read; remove or replace it",
                bad.label
            )));
        }
        Ok(())
    }

    /// Recomputes every input's compatibility problems against the reference input.
    pub fn recheck(&mut self) {
        let reference = self.base.as_ref().or(self.experts.first());
        let Some((ref_label, Ok(ref_summary))) = reference.map(|r| (r.label.clone(), r.summary.clone())) else {
            for e in self.base.iter_mut().chain(self.experts.iter_mut()) {
                e.problems.clear();
            }
            return;
        };
        let ref_path = reference.map(|r| r.path.clone());
        for e in self.base.iter_mut().chain(self.experts.iter_mut()) {
            e.problems.clear();
            if Some(&e.path) == ref_path.as_ref() {
                continue;
            }
            let Ok(s) = &e.summary else { continue };
            let labels = [ref_label.clone(), e.label.clone()];
            if let Err(msg) = compat::check(&labels, &ref_summary.desc, &[&s.desc], MissingPolicy::Error) {
                e.problems = msg
                    .lines()
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty())
                    .collect();
            }
        }
    }

    /// The inputs as stored in a project.
    pub fn refs(&self) -> (Option<InputRef>, Vec<InputRef>) {
        let r = |f: &InputFile| InputRef {
            path: f.path.clone(),
            label: f.label.clone(),
        };
        (self.base.as_ref().map(r), self.experts.iter().map(r).collect())
    }

    /// Replaces the inputs by those of a project.
    pub fn load_refs(&mut self, base: Option<&InputRef>, experts: &[InputRef]) {
        self.base = base.map(|b| InputFile::open(&b.path, Some(b.label.clone())));
        self.experts = experts
            .iter()
            .map(|e| InputFile::open(&e.path, Some(e.label.clone())))
            .collect();
        self.recheck();
    }
}

/// Bytes in a short human form: "1.2 MB".
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

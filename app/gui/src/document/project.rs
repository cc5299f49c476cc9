//! Saving: a run's output copied out with the recipe that repeats it, and project files (the
//! inputs, the method being edited and every finished run).

use super::{Document, Level};
use crate::form::ParamForm;
use crate::inputs::InputRef;
use crate::runs::{RunRecord, RunStatus};
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::device::DeviceChoice;
use mergescope_engine::error::{EngineError, Result};
use mergescope_lab::demo::Benchmark;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// `format` field of project files.
pub const PROJECT_FORMAT: &str = "mergescope-project";

/// Version of the project file format.
pub const PROJECT_VERSION: u32 = 1;

/// A saved session: inputs, the method being edited, and every finished run with its results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Project {
    /// Always [`PROJECT_FORMAT`].
    pub format: String,
    /// [`PROJECT_VERSION`] when written.
    pub version: u32,
    /// Benchmark folder.
    pub benchmark: Option<PathBuf>,
    /// Suite file merges are evaluated with (when no benchmark is open); absent in projects
    /// written before suites could be opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<PathBuf>,
    /// Base.
    pub base: Option<InputRef>,
    /// Experts.
    pub experts: Vec<InputRef>,
    /// Selected method.
    pub method: Option<String>,
    /// Its non-default parameters.
    pub params: Map<String, Value>,
    /// Seed.
    pub seed: u64,
    /// Device.
    pub device: DeviceChoice,
    /// Runs.
    pub runs: Vec<RunRecord>,
}

impl Project {
    /// Reads and checks a project file.
    pub fn load(path: &Path) -> Result<Project> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
        let p: Project = serde_json::from_str(&text)
            .map_err(|e| EngineError::invalid(format!("'{}' is not a mergescope project ({e})", path.display())))?;
        if p.format != PROJECT_FORMAT {
            return Err(EngineError::Invalid(format!(
                "'{}' is not a mergescope project file",
                path.display()
            )));
        }
        if p.version > PROJECT_VERSION {
            return Err(EngineError::Invalid(format!(
                "'{}' was written by a newer mergescope (format {}, this one reads {PROJECT_VERSION}); update mergescope",
                path.display(),
                p.version
            )));
        }
        Ok(p)
    }
}

impl Document {
    /// Copies run `id`'s output to `dest` (atomically, never over an input) and writes the
    /// recipe that repeats it next to it (`<dest>.recipe.toml`).
    pub fn save_output(&mut self, id: u64, dest: &Path) -> Result<PathBuf> {
        let r = self
            .run_record(id)
            .ok_or_else(|| EngineError::invalid("no such run"))?
            .clone();
        if r.status != RunStatus::Done {
            return Err(EngineError::Invalid(format!(
                "{} has no output to save ({})",
                r.title(),
                r.status.label()
            )));
        }
        let inputs = r.base.iter().chain(&r.experts);
        if inputs.clone().any(|i| same_file(&i.path, dest)) {
            return Err(EngineError::Invalid(format!(
                "'{}' is one of the inputs; mergescope never writes over an input",
                dest.display()
            )));
        }
        if r.output.is_dir() {
            return Err(EngineError::Invalid(format!(
                "{} wrote a Hugging Face model folder (its recipe's tokenizer settings): copy the folder '{}' itself, \
                 or run the recipe with `mergescope merge RECIPE --out FOLDER`",
                r.title(),
                r.output.display()
            )));
        }
        let bytes = std::fs::read(&r.output).map_err(|e| {
            EngineError::invalid(format!(
                "cannot read the merge output '{}' ({e}); run the merge again",
                r.output.display()
            ))
        })?;
        mergescope_engine::writer::write_atomic(dest, &bytes)?;
        let recipe = mergescope_interop::recipe::Recipe {
            method: r.method.clone(),
            base: r.base.as_ref().map(|b| b.path.clone()),
            experts: r.experts.iter().map(|e| e.path.clone()).collect(),
            out: dest.to_path_buf(),
            seed: r.seed,
            dtype: None,
            device: r.device,
            shard_size: None,
            on_missing: MissingPolicy::Error,
            params: mergescope_interop::recipe::params_to_toml(&r.params),
            slices: r.slices.clone(),
            ..mergescope_interop::recipe::Recipe::default()
        };
        let recipe_path = PathBuf::from(format!("{}.recipe.toml", dest.display()));
        let text = toml::to_string_pretty(&recipe)
            .map_err(|e| EngineError::Bug(format!("the recipe of a run cannot be written as TOML: {e}")))?;
        mergescope_engine::writer::write_atomic(&recipe_path, text.as_bytes())?;
        self.note(
            Level::Info,
            format!(
                "{} saved to '{}' (recipe: '{}')",
                r.title(),
                dest.display(),
                recipe_path.display()
            ),
        );
        Ok(recipe_path)
    }

    /// The project file contents.
    pub fn to_project(&self) -> Project {
        let (base, experts) = self.inputs.refs();
        Project {
            format: PROJECT_FORMAT.into(),
            version: PROJECT_VERSION,
            benchmark: self.benchmark.as_ref().map(|b| b.dir.clone()),
            suite: self.suite.clone(),
            base,
            experts,
            method: self.method.clone(),
            params: self.form.as_ref().map(ParamForm::to_json).unwrap_or_default(),
            seed: self.seed,
            device: self.device,
            runs: self.runs.iter().filter(|r| !r.status.is_active()).cloned().collect(),
        }
    }

    /// Saves the project to `path` (atomically).
    pub fn save_project(&mut self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_project())
            .map_err(|e| EngineError::Bug(format!("the project cannot be written as JSON: {e}")))?;
        mergescope_engine::writer::write_atomic(path, text.as_bytes())?;
        self.project_path = Some(path.to_path_buf());
        self.dirty = false;
        self.note(Level::Info, format!("project saved to '{}'", path.display()));
        Ok(())
    }

    /// Replaces the session's inputs, method and runs by those of the project at `path`.
    pub fn open_project(&mut self, path: &Path) -> Result<()> {
        if self.busy() {
            return Err(EngineError::invalid(
                "runs are still going: wait for them or cancel them first",
            ));
        }
        let p = Project::load(path)?;
        self.benchmark = None;
        self.suite = None;
        if let Some(dir) = &p.benchmark {
            match Benchmark::open(dir) {
                Ok(b) => self.benchmark = Some(b),
                Err(e) => self.note(Level::Warn, format!("the project's benchmark cannot be opened: {e}")),
            }
        } else if let Some(suite) = &p.suite {
            // The suite as the project left it; the project's own inputs replace its [models].
            self.use_suite(suite);
        }
        self.inputs.load_refs(p.base.as_ref(), &p.experts);
        if let Some(m) = &p.method {
            if self.registry.plugins.iter().any(|q| q.id() == m) {
                self.select_method(m);
                if let Some(f) = &mut self.form {
                    f.set_json(&p.params);
                }
            } else {
                self.note(
                    Level::Warn,
                    format!("the project uses method '{m}', which is not loaded; load its plugin"),
                );
            }
        }
        self.seed = p.seed;
        self.device = p.device;
        self.runs = p.runs;
        self.job_runs.clear();
        self.next_run = self.runs.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        self.project_path = Some(path.to_path_buf());
        self.dirty = false;
        self.note(Level::Info, format!("opened project '{}'", path.display()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` as the project file `name` in `dir` and loads it.
    fn load_text(dir: &Path, name: &str, text: &str) -> Result<Project> {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        Project::load(&p)
    }

    #[test]
    fn project_files_are_checked_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Project {
            format: PROJECT_FORMAT.into(),
            version: PROJECT_VERSION,
            benchmark: None,
            suite: None,
            base: None,
            experts: vec![InputRef {
                path: "/m/a.safetensors".into(),
                label: "a".into(),
            }],
            method: Some("ties".into()),
            params: Map::new(),
            seed: 3,
            device: DeviceChoice::Cpu,
            runs: Vec::new(),
        };
        let back = load_text(dir.path(), "ok.msproj", &serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!((back.seed, back.experts[0].label.as_str()), (3, "a"));

        let mut newer = serde_json::to_value(&ok).unwrap();
        newer["version"] = Value::from(PROJECT_VERSION + 1);
        let e = load_text(dir.path(), "newer.msproj", &newer.to_string()).unwrap_err();
        assert!(e.to_string().contains("newer mergescope"));

        let mut other = serde_json::to_value(&ok).unwrap();
        other["format"] = Value::from("something-else");
        let e = load_text(dir.path(), "other.msproj", &other.to_string()).unwrap_err();
        assert!(e.to_string().contains("not a mergescope project"));

        let e = load_text(dir.path(), "junk.msproj", "{ not json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("junk.msproj") && e.contains("not a mergescope project"),
            "{e}"
        );
        let e = Project::load(&dir.path().join("missing.msproj"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[test]
    fn parameters_become_typed_toml_in_recipes() {
        let params: Map<String, Value> = serde_json::from_str(
            r#"{"lambda": 0.5, "k": 3, "normalize": true, "trim_scope": "global", "w": [0.5, 1]}"#,
        )
        .unwrap();
        let t = mergescope_interop::recipe::params_to_toml(&params);
        assert_eq!(t["lambda"], toml::Value::Float(0.5));
        assert_eq!(t["k"], toml::Value::Integer(3));
        assert_eq!(t["normalize"], toml::Value::Boolean(true));
        assert_eq!(t["trim_scope"], toml::Value::String("global".into()));
        assert_eq!(
            t["w"],
            toml::Value::Array(vec![toml::Value::Float(0.5), toml::Value::Float(1.0)])
        );
        // Layer-wise values from an opened recipe are kept, as the recipe gave them.
        let layered: Map<String, Value> =
            serde_json::from_str(r#"{"t": [{"filter": "mlp", "value": [0, 1]}, {"value": 0.5}]}"#).unwrap();
        let t = mergescope_interop::recipe::params_to_toml(&layered);
        let back = toml::Value::Table(t).to_string();
        assert!(
            back.contains("filter = \"mlp\"") && back.contains("value = [0.0, 1.0]"),
            "{back}"
        );
    }
}

//! A text-benchmark build as a front end asks for it, and what that comes to: one door for
//! `mergescope demo build --benchmark text` and the window's Benchmark menu. A request names the
//! backbone folder, the tasks (by name), the recipe and the folder; [`TextBuildRequest::plan`]
//! checks the names and the folder at once, and says whether the benchmark is already built by
//! this recipe (reused) or what [`TextBuild::run`] builds. The backbone itself is checked by the
//! build, first thing ([`Backbone::load`](super::build::Backbone::load)).

use super::build::{TextBenchmark, TextRecipe, build_text, text_demo_dir};
use super::data::{TextTask, builtin_tasks};
use crate::demo::BuildProgress;
use candle_core::Device;
use mergescope_engine::error::{EngineError, Result};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

/// A text-benchmark build as asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct TextBuildRequest {
    /// The backbone: a Hugging Face BERT folder (all-MiniLM-L6-v2).
    pub backbone: PathBuf,
    /// The built-in tasks to build, by name; empty: all of them.
    pub tasks: Vec<String>,
    /// The recipe.
    pub recipe: TextRecipe,
    /// The folder to build into; `None`: the cache's ([`text_demo_dir`] of the recipe's seed).
    pub out: Option<PathBuf>,
    /// Build even when the folder holds a build by the same recipe, and replace a folder that
    /// is not a text benchmark.
    pub force: bool,
}

/// What a request comes to.
#[derive(Clone, Debug)]
pub enum TextBuildPlan {
    /// The folder holds a build by the same recipe (and `force` is not set): nothing to do.
    Built(TextBenchmark),
    /// The build to run.
    Build(TextBuild),
}

/// A build to run: the backbone, the tasks with their data, the recipe and the folder.
#[derive(Clone, Debug)]
pub struct TextBuild {
    /// The backbone folder.
    pub backbone: PathBuf,
    /// The tasks.
    pub tasks: Vec<TextTask>,
    /// The recipe.
    pub recipe: TextRecipe,
    /// The folder built into (replaced only once the build is complete).
    pub dir: PathBuf,
}

impl TextBuildRequest {
    /// Every built-in task on `backbone` with the default recipe of `seed`, into the cache.
    pub fn new(backbone: impl Into<PathBuf>, seed: u64) -> TextBuildRequest {
        TextBuildRequest {
            backbone: backbone.into(),
            tasks: Vec::new(),
            recipe: TextRecipe::default_for(seed),
            out: None,
            force: false,
        }
    }

    /// The folder it builds into.
    pub fn dir(&self) -> Result<PathBuf> {
        match &self.out {
            Some(d) => Ok(d.clone()),
            None => text_demo_dir(self.recipe.seed),
        }
    }

    /// Checks the task names and the folder, and says whether the benchmark is already built
    /// by this recipe or what to build. The errors name the command-line flags, as the lab's
    /// other messages do.
    pub fn plan(&self) -> Result<TextBuildPlan> {
        let mut tasks = builtin_tasks()?;
        if !self.tasks.is_empty() {
            let known: Vec<String> = tasks.iter().map(|t| t.name.clone()).collect();
            if let Some(bad) = self.tasks.iter().find(|n| !known.contains(n)) {
                return Err(EngineError::invalid(format!(
                    "--text-tasks: unknown task '{bad}'; the text tasks are {}",
                    known.join(", ")
                )));
            }
            tasks.retain(|t| self.tasks.contains(&t.name));
        }
        let dir = self.dir()?;
        match TextBenchmark::open(&dir) {
            Ok(b) if b.is_current() && b.manifest.recipe == self.recipe && !self.force => {
                return Ok(TextBuildPlan::Built(b));
            }
            Err(_) if dir.exists() && !self.force => {
                return Err(EngineError::invalid(format!(
                    "'{}' exists and is not a text benchmark; choose another --out or pass --force to replace it (nothing was written)",
                    dir.display()
                )));
            }
            _ => {}
        }
        Ok(TextBuildPlan::Build(TextBuild {
            backbone: self.backbone.clone(),
            tasks,
            recipe: self.recipe.clone(),
            dir,
        }))
    }
}

impl TextBuild {
    /// Builds it ([`build_text`]): the backbone is checked first, then heads and experts are
    /// trained with `progress` after each step; `cancel` stops it and leaves the folder as it
    /// was.
    pub fn run(
        &self,
        device: &Device,
        progress: &mut dyn FnMut(&BuildProgress),
        cancel: &AtomicBool,
    ) -> Result<TextBenchmark> {
        build_text(
            &self.backbone,
            &self.tasks,
            &self.recipe,
            &self.dir,
            device,
            progress,
            cancel,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_unknown_tasks_and_refuses_a_folder_that_holds_something_else() {
        let tmp = tempfile::tempdir().unwrap();
        let mut r = TextBuildRequest::new(tmp.path().join("backbone"), 3);
        r.out = Some(tmp.path().join("out"));
        r.tasks = vec!["nope".into()];
        let e = r.plan().unwrap_err().to_string();
        assert!(e.contains("unknown task 'nope'") && e.contains("word_sentiment"), "{e}");
        r.tasks = vec!["word_sentiment".into()];
        let TextBuildPlan::Build(b) = r.plan().unwrap() else {
            panic!("nothing is built yet")
        };
        assert_eq!(b.tasks.len(), 1);
        assert_eq!(b.dir, tmp.path().join("out"));
        assert_eq!(b.recipe.seed, 3);
        std::fs::create_dir_all(tmp.path().join("out")).unwrap();
        let e = r.plan().unwrap_err().to_string();
        assert!(e.contains("not a text benchmark"), "{e}");
        r.force = true;
        assert!(matches!(r.plan().unwrap(), TextBuildPlan::Build(_)));
    }
}

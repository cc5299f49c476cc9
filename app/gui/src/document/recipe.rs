//! Recipes opened in the window: a TOML recipe or a mergekit YAML configuration fills the inputs
//! and the method form; its tokenizer settings apply to the runs of its inputs.

use super::{Document, Level};
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::hf_folder::FolderOutput;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tokenizer settings of an opened recipe (its `[tokenizer]` table and `chat_template`, or a
/// mergekit configuration's `tokenizer_source`, `tokenizer` and `chat_template`), which the
/// method form cannot show: the runs of the recipe's inputs align the inputs' vocabularies and
/// write a Hugging Face folder (weights, config, tokenizer, chat template), as `mergescope merge`
/// does with the recipe.
#[derive(Clone, Debug)]
pub struct RecipeTokenizer {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Its base: the settings apply while the inputs are the recipe's.
    pub base: Option<PathBuf>,
    /// Its experts, in order.
    pub experts: Vec<PathBuf>,
    /// The folder output of its runs, as the recipe's merge request has it.
    pub folder: FolderOutput,
}

impl Document {
    /// Opens a recipe: a mergescope TOML recipe or a mergekit YAML configuration. Its base and
    /// experts become the inputs, its method is selected and its parameters fill the form (the
    /// layer-wise ones are kept beside it); its tokenizer settings are kept for the runs of its
    /// inputs ([`RecipeTokenizer`]); what cannot be shown is an error in the log.
    pub fn open_recipe(&mut self, path: &Path) {
        match self.try_open_recipe(path) {
            Ok(method) => {
                self.note(
                    Level::Info,
                    format!("opened the recipe '{}' ({method})", path.display()),
                );
                self.dirty = true;
            }
            Err(e) => self.note(Level::Error, format!("cannot open the recipe: {e}")),
        }
    }

    fn try_open_recipe(&mut self, path: &Path) -> Result<String> {
        // The merge request the recipe describes is what `mergescope merge` runs; its folder
        // output carries the tokenizer settings the form cannot show.
        let (recipe, notes, request) = if mergescope_engine::mergekit::is_mergekit_config(path) {
            let c = mergescope_engine::mergekit::load(path, &self.runs_dir)?;
            let request = c.to_request(false)?;
            (c.recipe, c.notes, request)
        } else {
            let r = mergescope_engine::recipe::Recipe::load(path)?;
            let request = r.to_request(false)?;
            (r, Vec::new(), request)
        };
        if !recipe.slices.is_empty() {
            return Err(EngineError::Invalid(format!(
                "'{}' builds the model from layer slices, which the window does not show yet; run it with \
                 `mergescope merge {} --out FOLDER`",
                path.display(),
                path.display()
            )));
        }
        if !self.registry.plugins.iter().any(|p| p.id() == recipe.method) {
            return Err(EngineError::Invalid(format!(
                "the recipe's method '{}' is not loaded; load its plugin (File > Load plugin…) and open the recipe again",
                recipe.method
            )));
        }
        self.inputs.clear();
        if let Some(b) = &recipe.base {
            self.inputs.set_base(b, None);
        }
        for e in &recipe.experts {
            self.inputs.add_expert(e, None);
        }
        self.select_method(&recipe.method);
        let n = self.inputs.experts.len();
        if let (Some(form), Value::Object(params)) = (&mut self.form, recipe.params_json()) {
            form.set_json(&params);
            form.fit_experts(n);
        }
        self.seed = recipe.seed;
        self.out_dtype = recipe.dtype;
        self.recipe_tokenizer = request
            .folder
            .filter(|f| f.tokenizer.is_some() || f.chat_template.is_some())
            .map(|folder| RecipeTokenizer {
                recipe: path.to_path_buf(),
                base: recipe.base.clone(),
                experts: recipe.experts.clone(),
                folder,
            });
        if let Some(t) = &self.recipe_tokenizer {
            let what = match (&t.folder.tokenizer, &t.folder.chat_template) {
                (Some(spec), _) => format!(
                    "its vocabularies are aligned to the {} tokenizer{}",
                    match &spec.source {
                        mergescope_engine::tokenizer_union::Source::Union => "union".to_owned(),
                        mergescope_engine::tokenizer_union::Source::Base => "base's".to_owned(),
                        mergescope_engine::tokenizer_union::Source::Model(m) => format!("'{}'", m.display()),
                    },
                    if t.folder.chat_template.is_some() {
                        " and the chat template is set"
                    } else {
                        ""
                    }
                ),
                (None, _) => "the chat template is set".to_owned(),
            };
            self.note(
                Level::Info,
                format!(
                    "the recipe's tokenizer settings apply to its runs from this window: {what}, and each run writes \
                     a Hugging Face folder (weights, config, tokenizer) while the inputs are the recipe's"
                ),
            );
        }
        if let Some(d) = recipe.dtype {
            self.note(
                Level::Info,
                format!("the recipe's runs write {} tensors", d.dtype().name()),
            );
        }
        for n in notes {
            self.note(Level::Info, n);
        }
        Ok(recipe.method)
    }

    /// The opened recipe's tokenizer settings when the inputs are still the recipe's.
    pub(super) fn applied_recipe_tokenizer(&self) -> Option<&RecipeTokenizer> {
        let t = self.recipe_tokenizer.as_ref()?;
        let base = self.inputs.base.as_ref().map(|b| &b.path);
        let experts = self.inputs.experts.iter().map(|e| &e.path);
        (base == t.base.as_ref() && experts.eq(t.experts.iter())).then_some(t)
    }

    /// Whether the inputs can be merged once the recipe's tokenizer settings align their
    /// vocabularies: as [`Inputs::ready`], but the vocabulary tensors may differ in size.
    pub(super) fn ready_with_aligned_vocabularies(&self) -> Result<()> {
        use mergescope_engine::tokenizer_union::VOCAB_TENSORS;
        if self.inputs.experts.is_empty() {
            return Err(EngineError::invalid("add at least one expert checkpoint"));
        }
        let all: Vec<_> = self.inputs.base.iter().chain(&self.inputs.experts).collect();
        let mut descs = Vec::with_capacity(all.len());
        for f in &all {
            let summary = f
                .summary
                .as_ref()
                .map_err(|_| EngineError::Invalid(format!("'{}' cannot be read; remove or replace it", f.label)))?;
            let mut desc = summary.desc.clone();
            desc.retain(|name, _| !VOCAB_TENSORS.contains(&name.as_str()));
            descs.push(desc);
        }
        let labels: Vec<String> = all.iter().map(|f| f.label.clone()).collect();
        let others: Vec<_> = descs.iter().skip(1).collect();
        if let Some(reference) = descs.first() {
            mergescope_engine::compat::check(&labels, reference, &others, MissingPolicy::Error)
                .map_err(EngineError::Incompatible)?;
        }
        Ok(())
    }
}

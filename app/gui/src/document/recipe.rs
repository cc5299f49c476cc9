//! Recipes opened in the window: a TOML recipe or a mergekit YAML configuration fills the inputs
//! and the method form; its tokenizer settings apply to the runs of its inputs.

use super::{Document, Level};
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::error::{EngineError, Result};
use mergescope_interop::hf_folder::FolderOutput;
use mergescope_interop::slices::Slice;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What an opened recipe says that the method form cannot show: its tokenizer settings (its
/// `[tokenizer]` table and `chat_template`, or a mergekit configuration's `tokenizer_source`,
/// `tokenizer` and `chat_template`: the runs align the inputs' vocabularies and write a Hugging
/// Face folder with weights, config, tokenizer and chat template) and its layer slices (the
/// runs build the model from them). They apply to the runs of the recipe's inputs, as
/// `mergescope merge` applies them to the recipe.
#[derive(Clone, Debug)]
pub struct RecipeSettings {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Its base: the settings apply while the inputs are the recipe's.
    pub base: Option<PathBuf>,
    /// Its experts, in order (with slices: the first slice's models).
    pub experts: Vec<PathBuf>,
    /// The folder output of its runs with tokenizer settings, as the recipe's merge request has
    /// it; `None` when the recipe has none.
    pub folder: Option<FolderOutput>,
    /// Its layer slices (empty: the whole models are merged).
    pub slices: Vec<Slice>,
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
        let (recipe, notes, request) = if mergescope_interop::mergekit::is_mergekit_config(path) {
            let ids: Vec<&str> = self.registry.plugins.iter().map(|p| p.id()).collect();
            let c = mergescope_interop::mergekit::load_with_plugins(path, &self.runs_dir, &ids)?;
            let request = c.to_request(false)?;
            (c.recipe, c.notes, request)
        } else {
            let r = mergescope_interop::recipe::Recipe::load(path)?;
            let request = r.to_request(false)?;
            (r, Vec::new(), request)
        };
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
        let folder = request
            .folder
            .filter(|f| f.tokenizer.is_some() || f.chat_template.is_some());
        self.recipe_settings = (folder.is_some() || !request.slices.is_empty()).then(|| RecipeSettings {
            recipe: path.to_path_buf(),
            base: recipe.base.clone(),
            experts: recipe.experts.clone(),
            folder,
            slices: request.slices.clone(),
        });
        if let Some(f) = self.recipe_settings.as_ref().and_then(|t| t.folder.as_ref()) {
            let what = match (&f.tokenizer, &f.chat_template) {
                (Some(spec), _) => format!(
                    "its vocabularies are aligned to the {} tokenizer{}",
                    match &spec.source {
                        mergescope_interop::tokenizer_union::Source::Union => "union".to_owned(),
                        mergescope_interop::tokenizer_union::Source::Base => "base's".to_owned(),
                        mergescope_interop::tokenizer_union::Source::Model(m) => format!("'{}'", m.display()),
                    },
                    if f.chat_template.is_some() {
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
        if !request.slices.is_empty() {
            self.note(
                Level::Info,
                format!(
                    "the recipe builds the model from {} layer slices: its runs from this window merge those slices \
                     (the inputs listed are its first slice's models) while the inputs are the recipe's",
                    request.slices.len()
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

    /// The opened recipe's settings when the inputs are still the recipe's.
    pub(super) fn applied_recipe_settings(&self) -> Option<&RecipeSettings> {
        let t = self.recipe_settings.as_ref()?;
        let base = self.inputs.base.as_ref().map(|b| &b.path);
        let experts = self.inputs.experts.iter().map(|e| &e.path);
        (base == t.base.as_ref() && experts.eq(t.experts.iter())).then_some(t)
    }

    /// Whether the inputs can be merged once the recipe's tokenizer settings align their
    /// vocabularies: as [`Inputs::ready`], but the vocabulary tensors may differ in size.
    pub(super) fn ready_with_aligned_vocabularies(&self) -> Result<()> {
        use mergescope_interop::tokenizer_union::VOCAB_TENSORS;
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

//! What a sweep varies: a TOML specification (defaults, grids, task groups, methods), the
//! `paper-002` preset, and its expansion into sweep points and seeded task groups.

use crate::scaling::fit::Law;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::rng::{SplitMix64, stream_key};
use mergescope_lab::nn::Arch;
use mergescope_lab::train::{OptimConfig, OptimizerKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The fine-tuning hyperparameters of one sweep point, and the number of tasks merged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hyper {
    /// Learning rate η.
    pub lr: f64,
    /// Minibatch size b.
    pub batch: usize,
    /// Fine-tuning steps K.
    pub steps: usize,
    /// Fraction α of each task's training examples (class-balanced subset).
    pub data_ratio: f64,
    /// `sgd`, `momentum` or `adamw`.
    pub optimizer: String,
    /// Tasks merged together, N.
    pub tasks: usize,
}

/// Values tried for each hyperparameter (empty: only the default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Grid {
    /// Learning rates.
    pub lr: Vec<f64>,
    /// Batch sizes.
    pub batch: Vec<usize>,
    /// Step counts (intermediate checkpoints of one run serve the smaller ones).
    pub steps: Vec<usize>,
    /// Data ratios.
    pub data_ratio: Vec<f64>,
    /// Optimisers.
    pub optimizer: Vec<String>,
    /// Numbers of tasks merged.
    pub tasks: Vec<usize>,
}

/// How the grid is walked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One hyperparameter varied at a time, the others at their defaults (the paper's protocol).
    #[default]
    OneAtATime,
    /// Every combination of the grids.
    Grid,
}

/// How per-task results are combined into one number per merged model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregate {
    /// Unweighted mean over the group's tasks (the authors' code).
    #[default]
    Mean,
    /// Over the union of the group's test sets (each example counts once; the paper's text).
    Union,
}

/// One merge method of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    /// Plugin id.
    pub plugin: String,
    /// Name in the results and plots (default: the plugin id).
    #[serde(default)]
    pub label: Option<String>,
    /// Parameters given to the plugin; the string `"1/N"` stands for 1 ÷ the group's size.
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
}

impl MethodSpec {
    /// The name used in the results.
    pub fn name(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.plugin)
    }

    /// The parameters for a merge of `n` tasks (`"1/N"` resolved).
    pub fn params_for(&self, n: usize) -> Value {
        let map = self
            .params
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) if s.replace(' ', "") == "1/N" => Value::from(1.0 / n as f64),
                    other => other.clone(),
                };
                (k.clone(), v)
            })
            .collect();
        Value::Object(map)
    }
}

/// The kind of benchmark a sweep trains on, as its `arch` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchKind {
    /// The demo benchmark of an image architecture (the seven 28×28 tasks).
    Demo(Arch),
    /// The text benchmark (`arch = "text"`): a BERT-family encoder, all-MiniLM-L6-v2, and its
    /// text tasks (docs/text-benchmark.md).
    Text,
}

impl BenchKind {
    /// The `arch` a specification writes for it.
    pub fn name(self) -> &'static str {
        match self {
            BenchKind::Demo(a) => a.name(),
            BenchKind::Text => TEXT_ARCH,
        }
    }
}

/// The `arch` of a sweep on the text benchmark.
pub const TEXT_ARCH: &str = "text";

/// A sweep, as written in its TOML file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// What is fine-tuned: `mlp`, `cnn` or `vit` (the demo benchmark's backbone), or `text`
    /// (the text benchmark's encoder, all-MiniLM-L6-v2).
    pub arch: String,
    /// `demo` (the built demo of `arch`; for `text`, the cache's text build of seed 0),
    /// `demo/<arch>-seed<N>`, or a benchmark folder (for `text`, a text build: the folder
    /// `demo build --benchmark text` writes, or its `suite.toml`): its base and task heads
    /// start every fine-tuning run.
    #[serde(default = "default_benchmark")]
    pub benchmark: String,
    /// Seed of the task groups, the minibatches and the merges.
    #[serde(default)]
    pub seed: u64,
    /// Random task groups G per number of tasks (error bars are standard errors over them).
    #[serde(default = "default_groups")]
    pub groups: usize,
    /// One variable at a time, or the full grid.
    #[serde(default)]
    pub mode: Mode,
    /// Mean over tasks or over the union of test sets.
    #[serde(default)]
    pub aggregate: Aggregate,
    /// Test examples per task (the first ones of each task; default: all).
    #[serde(default)]
    pub eval_examples: Option<usize>,
    /// The hyperparameters every point starts from.
    pub defaults: Hyper,
    /// Values tried.
    #[serde(default)]
    pub grid: Grid,
    /// Merge methods.
    pub methods: Vec<MethodSpec>,
}

fn default_benchmark() -> String {
    "demo".to_owned()
}

fn default_groups() -> usize {
    3
}

/// A swept hyperparameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Variable {
    /// Fine-tuning steps K.
    Steps,
    /// Batch size b.
    Batch,
    /// Learning rate η.
    LearningRate,
    /// Data ratio α.
    DataRatio,
    /// Optimiser (categorical: no law).
    Optimizer,
    /// Number of tasks N.
    Tasks,
}

impl Variable {
    /// Every variable, in plot order.
    pub const ALL: [Variable; 6] = [
        Variable::Steps,
        Variable::Batch,
        Variable::LearningRate,
        Variable::DataRatio,
        Variable::Optimizer,
        Variable::Tasks,
    ];

    /// Name in files and the TOML grid.
    pub fn key(self) -> &'static str {
        match self {
            Variable::Steps => "steps",
            Variable::Batch => "batch",
            Variable::LearningRate => "lr",
            Variable::DataRatio => "data_ratio",
            Variable::Optimizer => "optimizer",
            Variable::Tasks => "tasks",
        }
    }

    /// Axis label.
    pub fn label(self) -> &'static str {
        match self {
            Variable::Steps => "fine-tuning steps K",
            Variable::Batch => "batch size b",
            Variable::LearningRate => "learning rate η",
            Variable::DataRatio => "data ratio α",
            Variable::Optimizer => "optimiser",
            Variable::Tasks => "tasks merged N",
        }
    }

    /// The scaling law of seed 002 for this variable (none for the optimiser).
    pub fn law(self) -> Option<Law> {
        match self {
            Variable::Steps => Some(Law::Steps),
            Variable::Batch => Some(Law::Batch),
            Variable::LearningRate => Some(Law::LearningRate),
            Variable::DataRatio => Some(Law::DataRatio),
            Variable::Tasks => Some(Law::Tasks),
            Variable::Optimizer => None,
        }
    }

    /// The numeric value of `h` for this variable (None for the optimiser).
    pub fn value(self, h: &Hyper) -> Option<f64> {
        match self {
            Variable::Steps => Some(h.steps as f64),
            Variable::Batch => Some(h.batch as f64),
            Variable::LearningRate => Some(h.lr),
            Variable::DataRatio => Some(h.data_ratio),
            Variable::Tasks => Some(h.tasks as f64),
            Variable::Optimizer => None,
        }
    }

    /// Whether `a` and `b` agree on this variable.
    pub fn same(self, a: &Hyper, b: &Hyper) -> bool {
        match self {
            Variable::Optimizer => a.optimizer == b.optimizer,
            v => v.value(a) == v.value(b),
        }
    }
}

impl Hyper {
    /// The optimiser settings (AdamW without weight decay, momentum 0.9).
    pub fn optim(&self) -> Result<OptimConfig> {
        match OptimizerKind::parse(&self.optimizer) {
            Some(OptimizerKind::Sgd) => Ok(OptimConfig::sgd(self.lr)),
            Some(OptimizerKind::Momentum) => Ok(OptimConfig::momentum(self.lr)),
            Some(OptimizerKind::AdamW) => Ok(OptimConfig::adamw(self.lr, 0.0)),
            None => Err(EngineError::Param(format!(
                "optimizer '{}' is unknown: use sgd, momentum or adamw",
                self.optimizer
            ))),
        }
    }

    /// The fine-tuning run this point's experts come from: every hyperparameter but the step
    /// count and N (a run's intermediate checkpoints serve smaller step counts).
    pub fn run_id(&self) -> String {
        format!(
            "lr{}_b{}_a{}_{}",
            self.lr,
            self.batch,
            self.data_ratio,
            self.optimizer.to_ascii_lowercase()
        )
    }

    fn with(&self, var: Variable, value: &Hyper) -> Hyper {
        let mut h = self.clone();
        match var {
            Variable::Steps => h.steps = value.steps,
            Variable::Batch => h.batch = value.batch,
            Variable::LearningRate => h.lr = value.lr,
            Variable::DataRatio => h.data_ratio = value.data_ratio,
            Variable::Optimizer => h.optimizer = value.optimizer.clone(),
            Variable::Tasks => h.tasks = value.tasks,
        }
        h
    }
}

impl Grid {
    /// The grid's values of `var` as points differing from `defaults` in that variable only.
    fn values(&self, var: Variable, defaults: &Hyper) -> Vec<Hyper> {
        let one = |f: &dyn Fn(&mut Hyper)| {
            let mut h = defaults.clone();
            f(&mut h);
            h
        };
        match var {
            Variable::Steps => self.steps.iter().map(|&v| one(&|h| h.steps = v)).collect(),
            Variable::Batch => self.batch.iter().map(|&v| one(&|h| h.batch = v)).collect(),
            Variable::LearningRate => self.lr.iter().map(|&v| one(&|h| h.lr = v)).collect(),
            Variable::DataRatio => self.data_ratio.iter().map(|&v| one(&|h| h.data_ratio = v)).collect(),
            Variable::Optimizer => self
                .optimizer
                .iter()
                .map(|v| one(&|h| h.optimizer = v.clone()))
                .collect(),
            Variable::Tasks => self.tasks.iter().map(|&v| one(&|h| h.tasks = v)).collect(),
        }
    }
}

impl SweepSpec {
    /// Parses a TOML specification; errors name the file's problem.
    pub fn from_toml(text: &str) -> Result<SweepSpec> {
        toml::from_str(text).map_err(|e| EngineError::Param(format!("sweep specification: {e}")))
    }

    /// The specification as TOML.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| EngineError::Invalid(format!("cannot write the sweep as TOML: {e}")))
    }

    /// The demo architecture (an error for a text sweep, which has none).
    pub fn arch(&self) -> Result<Arch> {
        match self.kind()? {
            BenchKind::Demo(a) => Ok(a),
            BenchKind::Text => Err(EngineError::Param(format!(
                "arch '{TEXT_ARCH}' is the text benchmark's encoder, not a demo architecture"
            ))),
        }
    }

    /// The kind of benchmark the sweep trains on.
    pub fn kind(&self) -> Result<BenchKind> {
        if self.arch == TEXT_ARCH {
            return Ok(BenchKind::Text);
        }
        Arch::parse(&self.arch).map(BenchKind::Demo).ok_or_else(|| {
            EngineError::Param(format!(
                "arch '{}' is unknown: use mlp, cnn or vit (the demo benchmark) or text (the text benchmark)",
                self.arch
            ))
        })
    }

    /// Checks every value against a pool of `pool` tasks and the installed `plugins`.
    pub fn validate(&self, pool: usize, plugins: &[&str]) -> Result<()> {
        self.kind()?;
        let bad = |what: String| Err(EngineError::Param(format!("sweep specification: {what}")));
        if self.groups == 0 {
            return bad("groups must be at least 1".into());
        }
        if self.methods.is_empty() {
            return bad("list at least one [[methods]] entry (e.g. plugin = \"task-arithmetic\")".into());
        }
        let mut names = Vec::new();
        for m in &self.methods {
            if !plugins.contains(&m.plugin.as_str()) {
                return bad(format!(
                    "method plugin '{}' is not installed; installed: {}",
                    m.plugin,
                    plugins.join(", ")
                ));
            }
            if m.name() == EXPERT || names.contains(&m.name()) {
                return bad(format!(
                    "method name '{}' is used twice or reserved; give it a distinct label",
                    m.name()
                ));
            }
            names.push(m.name());
        }
        for h in self.points() {
            h.optim()?;
            if !(h.lr.is_finite() && h.lr > 0.0) {
                return bad(format!("learning rate {} must be positive", h.lr));
            }
            if h.batch == 0 || h.steps == 0 {
                return bad("batch size and steps must be at least 1".into());
            }
            if !(h.data_ratio > 0.0 && h.data_ratio <= 1.0) {
                return bad(format!("data ratio {} must be in (0, 1]", h.data_ratio));
            }
            if h.tasks == 0 || h.tasks > pool {
                return bad(format!(
                    "{} tasks per group asked for; the benchmark has {pool} (use 1..={pool})",
                    h.tasks
                ));
            }
        }
        Ok(())
    }

    /// The sweep points, the defaults first, without repeats.
    pub fn points(&self) -> Vec<Hyper> {
        let mut out = vec![self.defaults.clone()];
        match self.mode {
            Mode::OneAtATime => {
                for var in Variable::ALL {
                    out.extend(self.grid.values(var, &self.defaults));
                }
            }
            Mode::Grid => {
                for var in Variable::ALL {
                    let values = self.grid.values(var, &self.defaults);
                    if values.is_empty() {
                        continue;
                    }
                    out = out
                        .iter()
                        .flat_map(|h| values.iter().map(move |v| h.with(var, v)))
                        .chain(out.iter().cloned())
                        .collect();
                }
            }
        }
        let mut unique: Vec<Hyper> = Vec::new();
        for h in out {
            if !unique.contains(&h) {
                unique.push(h);
            }
        }
        unique
    }

    /// The variables with more than one value among the points.
    pub fn swept(&self) -> Vec<Variable> {
        let points = self.points();
        Variable::ALL
            .into_iter()
            .filter(|v| points.iter().any(|h| !v.same(h, &self.defaults)))
            .collect()
    }

    /// The step counts each fine-tuning run must checkpoint, by run id.
    pub fn snapshots(&self) -> BTreeMap<String, Vec<usize>> {
        let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for h in self.points() {
            let v = out.entry(h.run_id()).or_default();
            if !v.contains(&h.steps) {
                v.push(h.steps);
                v.sort_unstable();
            }
        }
        out
    }

    /// The built-in sweeps, by name.
    pub const PRESETS: [&str; 1] = ["paper-002"];

    /// The preset `name` (one of [`SweepSpec::PRESETS`]) for `arch`.
    pub fn preset(name: &str, arch: Arch) -> Result<SweepSpec> {
        SweepSpec::preset_for(name, BenchKind::Demo(arch))
    }

    /// The preset `name` (one of [`SweepSpec::PRESETS`]) for a benchmark of `kind`.
    pub fn preset_for(name: &str, kind: BenchKind) -> Result<SweepSpec> {
        match (name, kind) {
            ("paper-002", BenchKind::Demo(arch)) => Ok(SweepSpec::paper_002(arch)),
            ("paper-002", BenchKind::Text) => Ok(SweepSpec::paper_002_text()),
            _ => Err(EngineError::Param(format!(
                "unknown preset '{name}'; available: {}",
                SweepSpec::PRESETS.join(", ")
            ))),
        }
    }

    /// The `paper-002` preset on the text benchmark: seed 002's protocol around the text
    /// recipe (AdamW, η = 10⁻⁴, b = 32, K = 120 with 10 % warm-up then linear decay; the
    /// defaults are the build's own experts), one variable at a time over the learning rate,
    /// the steps (snapshots of the 120-step run) and the tasks merged (3 of the 5 by default),
    /// three seeded groups, merged by weight averaging (task arithmetic at λ = 1/N, the paper's
    /// simple average), task arithmetic at λ = 0.5 (what `compare` chose on this benchmark's five
    /// tasks) and TIES.
    pub fn paper_002_text() -> SweepSpec {
        let recipe = mergescope_lab::text_bench::TextRecipe::default_for(0);
        SweepSpec::one_at_a_time(
            TEXT_ARCH,
            Hyper {
                lr: recipe.lr,
                batch: recipe.batch_size,
                steps: recipe.expert_steps,
                data_ratio: 1.0,
                optimizer: "adamw".into(),
                tasks: 3,
            },
            Grid {
                lr: vec![3e-5, 1e-4, 3e-4, 1e-3],
                steps: vec![30, 60, 90, 120],
                tasks: vec![2, 3, 4, 5],
                ..Grid::default()
            },
            vec![
                preset_method("weight-average", "WA (TA λ=1/N)", &[]),
                preset_method("task-arithmetic", "TA (λ=0.5)", &[("lambda", Value::from(0.5))]),
                preset_method("ties", "TIES", &[]),
            ],
        )
    }

    /// A preset's specification: seed 002's protocol (seed 0, three task groups, one variable
    /// at a time, the mean over tasks, every test example) on the default benchmark of `arch`.
    fn one_at_a_time(arch: &str, defaults: Hyper, grid: Grid, methods: Vec<MethodSpec>) -> SweepSpec {
        SweepSpec {
            arch: arch.to_owned(),
            benchmark: default_benchmark(),
            seed: 0,
            groups: 3,
            mode: Mode::OneAtATime,
            aggregate: Aggregate::Mean,
            eval_examples: None,
            defaults,
            grid,
            methods,
        }
    }

    /// The `paper-002` preset for `arch`: seed 002's protocol (defaults at the largest step
    /// count, one variable at a time, TA with λ = 1/N, TIES, DARE and AdaMerging, mean over
    /// tasks) scaled to the seven-task demo benchmark.
    /// The `paper-002` preset for `arch`: seed 002's protocol (defaults at the largest step
    /// count, one variable at a time, TA with λ = 1/N, TIES, DARE and AdaMerging, mean over
    /// tasks) scaled to the seven-task demo benchmark.
    pub fn paper_002(arch: Arch) -> SweepSpec {
        SweepSpec::one_at_a_time(
            arch.name(),
            Hyper {
                lr: 5e-4,
                batch: 64,
                steps: 300,
                data_ratio: 1.0,
                optimizer: "adamw".into(),
                tasks: 4,
            },
            Grid {
                lr: vec![2e-4, 5e-4, 2e-3, 5e-3],
                batch: vec![16, 32, 64],
                steps: vec![50, 100, 200, 300],
                data_ratio: vec![0.25, 0.5, 1.0],
                optimizer: Vec::new(),
                tasks: vec![2, 3, 4, 5, 6],
            },
            vec![
                preset_method("task-arithmetic", "TA (λ=1/N)", &[("lambda", Value::from("1/N"))]),
                preset_method("ties", "TIES", &[]),
                preset_method("dare", "DARE", &[("lambda", Value::from("1/N"))]),
                preset_method(
                    "adamerging",
                    "AdaMerging",
                    &[
                        ("granularity", Value::from("task")),
                        ("init", Value::from("1/N")),
                        ("steps", Value::from(40)),
                        ("report_every", Value::from(40)),
                    ],
                ),
            ],
        )
    }
}

/// The method name of the experts' own rows.
pub const EXPERT: &str = "expert";

/// `groups` distinct task groups of `n` tasks from a pool of `pool` (indices, sorted), seeded by
/// `seed` and `n` only, so every sweep point merges the same groups. Fewer groups come back when
/// the pool has fewer distinct subsets.
pub fn task_groups(pool: usize, n: usize, groups: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = SplitMix64::new(stream_key(seed ^ 0x5CA1_1A65, n as u64));
    let mut out: Vec<Vec<usize>> = Vec::new();
    for _ in 0..groups * 50 {
        if out.len() == groups {
            break;
        }
        let mut idx: Vec<usize> = (0..pool).collect();
        rng.shuffle(&mut idx);
        let mut g: Vec<usize> = idx.into_iter().take(n).collect();
        g.sort_unstable();
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// A preset's method: `plugin` under `label`, with `params`.
fn preset_method(plugin: &str, label: &str, params: &[(&str, Value)]) -> MethodSpec {
    MethodSpec {
        plugin: plugin.to_owned(),
        label: Some(label.to_owned()),
        params: params.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_at_a_time_points_vary_one_variable_from_the_defaults() {
        let spec = SweepSpec::preset("paper-002", Arch::Mlp).unwrap();
        let points = spec.points();
        assert_eq!(points[0], spec.defaults);
        // 1 default + 3 other K + 2 b + 3 η + 2 α + 4 N.
        assert_eq!(points.len(), 1 + 3 + 2 + 3 + 2 + 4);
        for h in &points[1..] {
            let differing = Variable::ALL.iter().filter(|v| !v.same(h, &spec.defaults)).count();
            assert_eq!(differing, 1, "{h:?}");
        }
        assert_eq!(
            spec.swept(),
            [
                Variable::Steps,
                Variable::Batch,
                Variable::LearningRate,
                Variable::DataRatio,
                Variable::Tasks
            ]
        );
        // Step counts come from one run per other setting: the default run checkpoints at
        // 50, 100, 200, 300; the N points share it.
        let snaps = spec.snapshots();
        assert_eq!(snaps[&spec.defaults.run_id()], [50, 100, 200, 300]);
        assert_eq!(snaps.len(), 1 + 2 + 3 + 2);
    }

    #[test]
    fn full_grid_is_the_product() {
        let mut spec = SweepSpec::preset("paper-002", Arch::Mlp).unwrap();
        spec.mode = Mode::Grid;
        spec.grid = Grid {
            lr: vec![1e-3, 5e-4],
            batch: vec![16, 64],
            tasks: vec![2, 3, 4],
            ..Grid::default()
        };
        assert_eq!(spec.points().len(), 2 * 2 * 3);
    }

    #[test]
    fn groups_are_distinct_sorted_and_stable() {
        let g = task_groups(7, 4, 3, 0);
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|x| x.len() == 4 && x.windows(2).all(|w| w[0] < w[1])));
        assert_ne!(g[0], g[1]);
        assert_eq!(g, task_groups(7, 4, 3, 0));
        assert_ne!(g, task_groups(7, 4, 3, 1));
        // Only one subset of 7 out of 7.
        assert_eq!(task_groups(7, 7, 3, 0), vec![(0..7).collect::<Vec<_>>()]);
    }

    #[test]
    fn specs_round_trip_through_toml_and_name_bad_values() {
        let spec = SweepSpec::preset("paper-002", Arch::Cnn).unwrap();
        let text = spec.to_toml().unwrap();
        assert_eq!(SweepSpec::from_toml(&text).unwrap(), spec);
        let plugins = ["task-arithmetic", "ties", "dare", "adamerging"];
        spec.validate(7, &plugins).unwrap();
        let e = spec.validate(5, &plugins).unwrap_err().to_string();
        assert!(e.contains("6 tasks per group") && e.contains("1..=5"), "{e}");
        let e = spec.validate(7, &["ties"]).unwrap_err().to_string();
        assert!(e.contains("'task-arithmetic' is not installed"), "{e}");
        let e = SweepSpec::from_toml("arch = \"mlp\"\nsteps = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("steps"), "{e}");
        // "1/N" becomes 1 ÷ the group's size.
        assert_eq!(spec.methods[0].params_for(4)["lambda"], Value::from(0.25));
    }

    /// The text preset varies η, K and N around the build's own recipe, and names its kind.
    #[test]
    fn the_text_preset_is_the_text_recipe_varied_one_at_a_time() {
        let spec = SweepSpec::preset_for("paper-002", BenchKind::Text).unwrap();
        assert_eq!(spec.kind().unwrap(), BenchKind::Text);
        assert!(spec.arch().unwrap_err().to_string().contains("not a demo architecture"));
        assert_eq!(SweepSpec::from_toml(&spec.to_toml().unwrap()).unwrap(), spec);
        let recipe = mergescope_lab::text_bench::TextRecipe::default_for(0);
        assert_eq!(
            (spec.defaults.lr, spec.defaults.batch, spec.defaults.steps),
            (recipe.lr, recipe.batch_size, recipe.expert_steps)
        );
        assert_eq!(spec.swept(), [Variable::Steps, Variable::LearningRate, Variable::Tasks]);
        // One 120-step run per learning rate; its snapshots serve K = 30, 60, 90.
        let snaps = spec.snapshots();
        assert_eq!(snaps.len(), 4);
        assert_eq!(snaps[&spec.defaults.run_id()], [30, 60, 90, 120]);
        spec.validate(5, &["weight-average", "task-arithmetic", "ties"])
            .unwrap();
        let e = SweepSpec {
            arch: "bert".into(),
            ..spec
        }
        .kind()
        .unwrap_err()
        .to_string();
        assert!(e.contains("arch 'bert'") && e.contains("text"), "{e}");
    }
}

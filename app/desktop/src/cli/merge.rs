//! `mergescope merge`: from flags or from a TOML recipe, with a progress bar on stderr.

use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::device::{DeviceChoice, device_name, open_device};
use mergescope_engine::dtype::OutDType;
use mergescope_engine::merge::{ExecOptions, Observer, Phase, Progress};
use mergescope_interop::hf_folder::FolderOutput;
use mergescope_interop::mergekit;
use mergescope_interop::recipe::{Recipe, parse_size};
use mergescope_interop::request::MergeRequest;
use mergescope_lab::data::SplitKind;
use mergescope_lab::data::{TaskData, benchmark_tasks};
use mergescope_lab::demo::{Benchmark, resolve_benchmark};
use mergescope_lab::evaluate::{EvaluatorSpec, suite_models};
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::nn::Arch;
use mergescope_lab::run::{self, TaskSource};
use mergescope_plugin_api::abi;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// A TOML recipe to run instead of the flags below (flags given too override it); a .yml
    /// file is read as a mergekit configuration (as --config).
    #[arg(value_name = "RECIPE.toml")]
    pub recipe: Option<PathBuf>,
    /// A mergekit YAML configuration (merge_method, base_model, models or slices, parameters,
    /// dtype, tokenizer_source) to run; the output is a Hugging Face model folder at --out.
    #[arg(long, value_name = "MERGE.yml", conflicts_with = "recipe")]
    pub config: Option<PathBuf>,
    /// Write a Hugging Face model folder at --out: the weights with the config.json,
    /// generation_config.json and tokenizer of the base (or --config-from) and a model card.
    #[arg(long)]
    pub hf_folder: bool,
    /// The model folder whose config and tokenizer a folder output takes (implies --hf-folder).
    #[arg(long, value_name = "FOLDER")]
    pub config_from: Option<PathBuf>,
    /// Method id (see `mergescope plugins list`).
    #[arg(long)]
    pub method: Option<String>,
    /// Base checkpoint (.safetensors file or folder of shards).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Expert checkpoints, in order (repeat the flag or list several: `--expert a b c`).
    #[arg(long = "expert", value_name = "PATH", num_args = 1..)]
    pub experts: Vec<PathBuf>,
    /// Method parameter `name=value` (repeatable; per-task lists as `name=0.3,0.5,0.2`).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// Seed given to the method and recorded in the output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output dtype of merged tensors: f32, f16 or bf16 (default: as the inputs).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Compute device: cpu, cuda or metal.
    #[arg(long)]
    pub device: Option<String>,
    /// Output file (or folder, when the output is sharded).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Split the output into shards of at most this size (e.g. 2GB); 0 for one file.
    #[arg(long, value_name = "SIZE")]
    pub shard_size: Option<String>,
    /// Tensors not every input has: error, use-reference or skip.
    #[arg(long, value_name = "POLICY")]
    pub on_missing: Option<String>,
    /// Replace the output if it exists (never an input).
    #[arg(long)]
    pub overwrite: bool,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Memory budget for in-flight tensors (e.g. 1GB).
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// Print a JSON report on stdout (time, peak memory, files).
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Evaluate the result per task right after the merge (as `mergescope eval`).
    #[arg(long)]
    pub eval: bool,
    /// Benchmark for --eval and for model-level methods' calibration data (`demo`,
    /// `demo/<arch>`, `demo/<arch>-seed<N>` or a folder); without --base/--expert its base and
    /// experts are the inputs.
    #[arg(long, value_name = "SPEC")]
    pub benchmark: Option<String>,
}

pub(crate) fn parse_params(items: &[String]) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut map = serde_json::Map::new();
    let mut given: Vec<(&str, &str)> = Vec::new();
    for item in items {
        let Some((k, v)) = item.split_once('=') else {
            bail!("--param '{item}' must look like name=value, e.g. --param lambda=0.3");
        };
        let (k, v) = (k.trim(), v.trim());
        if let Some((_, first)) = given.iter().find(|(name, _)| *name == k) {
            bail!("--param {k} is given twice ({k}={first} and {k}={v}); give each parameter once");
        }
        given.push((k, v));
        map.insert(k.to_owned(), typed_value(v));
    }
    Ok(map)
}

/// A `--param` value as the JSON value it stands for, the one place command-line text becomes
/// typed (recipes and the window give typed values; the engine refuses text where a number or
/// a bool is due): `0.3` a number, `true`/`false` a bool, `0,0.5,1` a list of numbers (a
/// gradient, or one value per expert), `[...]` or `{...}` JSON (filter lists); anything else
/// stays text (a choice).
fn typed_value(v: &str) -> serde_json::Value {
    use serde_json::Value;
    if let Ok(x) = v.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(x)
    {
        return Value::Number(n);
    }
    match v {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if (v.starts_with('[') || v.starts_with('{'))
        && let Ok(json) = serde_json::from_str::<Value>(v)
    {
        return json;
    }
    if v.contains(',') {
        let items: Option<Vec<Value>> = v
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
            })
            .collect();
        if let Some(items) = items {
            return Value::Array(items);
        }
    }
    Value::String(v.to_owned())
}

/// Peak resident memory of this process in bytes (Linux), for reports.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The mergekit configuration given (by --config or as a .yml recipe), converted; its notes
/// are printed.
fn mergekit_config(args: &MergeArgs, plugin_ids: &[&str]) -> anyhow::Result<Option<mergekit::Converted>> {
    let path = match (&args.config, &args.recipe) {
        (Some(p), _) => p,
        (None, Some(p)) if mergekit::is_mergekit_config(p) => p,
        _ => return Ok(None),
    };
    let out = args.out.as_deref().with_context(|| {
        format!(
            "a mergekit config writes a Hugging Face model folder: pass --out FOLDER (as mergekit-yaml {} FOLDER)",
            path.display()
        )
    })?;
    let converted = mergekit::load_with_plugins(path, out, plugin_ids)?;
    for n in &converted.notes {
        eprintln!("note: {n}");
    }
    Ok(Some(converted))
}

fn build(args: &MergeArgs, plugin_ids: &[&str]) -> anyhow::Result<(String, MergeRequest, DeviceChoice)> {
    let converted = mergekit_config(args, plugin_ids)?;
    let mut recipe = match (&converted, &args.recipe) {
        (Some(c), _) => Some(c.recipe.clone()),
        (None, Some(p)) => Some(Recipe::load(p)?),
        (None, None) => None,
    };
    let recipe_device = recipe.as_ref().map(|r| r.device);
    let method = args
        .method
        .clone()
        .or_else(|| recipe.as_ref().map(|r| r.method.clone()))
        .context("no method: pass --method ID (see `mergescope plugins list`) or a recipe")?;
    let mut req = match (recipe.take(), &converted) {
        (Some(_), Some(c)) => c.to_request(args.overwrite)?,
        (Some(r), None) => r.to_request(args.overwrite)?,
        (None, _) => MergeRequest::new(Vec::new(), args.out.clone().context("no output: pass --out PATH")?)
            .overwriting(args.overwrite),
    };
    let device = match (&args.device, recipe_device) {
        (Some(d), _) => DeviceChoice::parse(d).with_context(|| format!("--device '{d}': use cpu, cuda or metal"))?,
        (None, Some(d)) => d,
        (None, None) => DeviceChoice::Cpu,
    };
    if args.hf_folder || args.config_from.is_some() {
        let folder = req.folder.get_or_insert_with(FolderOutput::default);
        if let Some(c) = &args.config_from {
            folder.config_from = Some(c.clone());
        }
    }
    if let Some(b) = &args.base {
        req.base = Some(b.clone());
    }
    if !args.experts.is_empty() {
        req.experts = args.experts.clone();
    }
    if let Some(o) = &args.out {
        req.out = o.clone();
    }
    if let Some(s) = args.seed {
        req.seed = s;
    }
    if let Some(d) = &args.dtype {
        req.out_dtype = Some(OutDType::parse(d).with_context(|| format!("--dtype '{d}': use f32, f16 or bf16"))?);
    }
    if let Some(s) = &args.shard_size {
        req.shard_bytes =
            Some(parse_size(s).with_context(|| format!("--shard-size '{s}' is not a size; write e.g. 2GB"))?);
    }
    if let Some(p) = &args.on_missing {
        req.on_missing =
            MissingPolicy::parse(p).with_context(|| format!("--on-missing '{p}': use error, use-reference or skip"))?;
    }
    let extra = parse_params(&args.params)?;
    if let serde_json::Value::Object(m) = &mut req.params {
        m.extend(extra);
    }
    if req.experts.is_empty()
        && let Some(spec) = &args.benchmark
    {
        if is_suite_path(spec) {
            let m = suite_models(&Suite::load(Path::new(spec))?, None, &[])?;
            req.base = req.base.or(Some(m.base));
            req.experts = m.experts;
        } else {
            let b = resolve_benchmark(spec, None)?;
            req.base = req.base.or_else(|| Some(b.base_path()));
            req.experts = b.expert_paths();
        }
    }
    if req.experts.is_empty() {
        bail!(
            "no experts: pass --expert PATH once per expert checkpoint (or --benchmark demo, or a suite with [models])"
        );
    }
    Ok((method, req, device))
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

pub fn run(plugin_dirs: &[PathBuf], args: MergeArgs) -> anyhow::Result<ExitCode> {
    let registry = super::registry(plugin_dirs)?;
    let ids: Vec<&str> = registry.plugins.iter().map(|p| p.id()).collect();
    let (method, req, device_choice) = build(&args, &ids)?;
    let plugin = registry.find(&method).map_err(anyhow::Error::msg)?;
    let (device, note) = open_device(device_choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let mut opts = ExecOptions {
        device,
        threads: args.threads,
        ..ExecOptions::default()
    };
    if let Some(b) = &args.memory_budget {
        opts.memory_budget_bytes =
            parse_size(b).with_context(|| format!("--memory-budget '{b}' is not a size; write e.g. 1GB"))?;
    }
    let bar = super::progress_bar(args.quiet);
    let on_progress = |p: &Progress| {
        let label = match p.phase {
            Phase::Statistics(n) => format!("statistics pass {}", n + 1),
            Phase::Merge if plugin.is_model_level() => format!("{}: {}", plugin.id(), p.tensor),
            Phase::Merge => format!("merging ({})", plugin.id()),
        };
        if let Some(permille) = (p.done * 1000).checked_div(p.total) {
            bar.set_position(permille);
        }
        bar.set_message(label);
    };
    let id = plugin.id().to_owned();
    let on_log = |level: abi::LogLevel, msg: &str| {
        let tag = match level {
            abi::LOG_ERROR => "error",
            abi::LOG_WARN => "warning",
            abi::LOG_INFO => "info",
            _ => "debug",
        };
        if level <= abi::LOG_INFO {
            bar.suspend(|| eprintln!("{tag} [{id}]: {msg}"));
        }
    };
    // Ctrl-C (or SIGTERM) cancels cleanly: workers stop and the temporary output is removed.
    let cancel = super::cancel_on_ctrl_c();
    let observer = Observer {
        progress: &on_progress,
        log: &on_log,
    };
    // Data-driven methods evaluate candidates on the calibration data of the benchmark or suite.
    let calibration = if plugin.is_model_level() {
        let base = req
            .base
            .as_deref()
            .with_context(|| format!("method '{}' starts from the base model: pass --base PATH", plugin.id()))?;
        let spec = args.benchmark.as_deref().unwrap_or("demo");
        if is_suite_path(spec) {
            Some(Calibration::Suite(Box::new(Suite::load(Path::new(spec))?)))
        } else {
            // The architecture from the base's header (names and shapes), without reading its data.
            let header = Checkpoint::open(base)?;
            let arch = Arch::detect(header.tensors.iter().map(|(k, t)| (k.as_str(), t.shape.as_slice())));
            let bench = resolve_benchmark(spec, arch)
                .with_context(|| format!("method '{}' needs the benchmark its experts were tuned on", plugin.id()))?;
            Some(Calibration::Benchmark(Box::new(bench), benchmark_tasks(None)?))
        }
    } else {
        None
    };
    let tasks = calibration.as_ref().map(|c| match c {
        Calibration::Benchmark(bench, tasks) => TaskSource::Benchmark { bench, tasks },
        Calibration::Suite(suite) => TaskSource::Suite(suite),
    });
    let report = run::merge(&plugin, &req, tasks, &opts, observer, cancel).map(|o| {
        if let Some(r) = &o.model {
            if let Some(label) = &r.partial {
                bar.suspend(|| eprintln!("cancelled: wrote the last iterate ('{label}') as a partial result"));
            }
            if let Some(t) = &r.trajectory_file {
                bar.suspend(|| {
                    eprintln!(
                        "trajectory: {} of {} iterates -> {}",
                        r.iterates.len(),
                        r.reported,
                        t.display()
                    )
                });
            }
        }
        o.report
    });
    bar.finish_and_clear();
    let report = report?;
    let gb = report.input_bytes as f64 / 1e9;
    let evaluation = if args.eval {
        let spec = args.benchmark.as_deref().unwrap_or("demo");
        Some(
            super::eval::evaluate(&req.out, &EvaluatorSpec::new(spec, &opts.device))
                .context("the merge succeeded but its evaluation failed")?,
        )
    } else {
        None
    };
    if args.json {
        let j = serde_json::json!({
            "method": plugin.id(),
            "plugin_version": plugin.version(),
            "device": device_name(&opts.device),
            "files": report.files.iter().map(|p| display(p)).collect::<Vec<_>>(),
            "merged_tensors": report.merged,
            "copied_tensors": report.copied,
            "skipped_tensors": report.skipped,
            "notes": report.notes,
            "params": report.params,
            "seed": req.seed,
            "input_bytes": report.input_bytes,
            "seconds": report.seconds,
            "input_gb_per_s": gb / report.seconds.max(1e-9),
            "peak_rss_bytes": peak_rss_bytes(),
            "eval": evaluation.as_ref().map(|e| super::eval::evaluation_json(&req.out, e)).transpose()?,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        for n in &report.notes {
            eprintln!("note: {n}");
        }
        eprintln!(
            "merged {} tensors ({} copied, {} skipped) with {} {} in {:.2} s ({:.2} GB/s of input) -> {}",
            report.merged,
            report.copied,
            report.skipped,
            plugin.id(),
            plugin.version(),
            report.seconds,
            gb / report.seconds.max(1e-9),
            report.files.first().map(|p| display(p)).unwrap_or_default()
        );
        if let Some(e) = &evaluation {
            super::eval::print_header(&req.out, e, SplitKind::Test);
            super::eval::print_report(&e.report);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a model-level method learns on: a demo benchmark with its tasks' data, or a suite.
enum Calibration {
    Benchmark(Box<Benchmark>, Vec<TaskData>),
    Suite(Box<Suite>),
}

#[cfg(test)]
mod tests {
    use super::typed_value;
    use serde_json::json;

    #[test]
    fn param_text_becomes_the_value_it_stands_for() {
        assert_eq!(typed_value("0.3"), json!(0.3));
        assert_eq!(typed_value("-2"), json!(-2.0));
        assert_eq!(typed_value("true"), json!(true));
        assert_eq!(typed_value("0, 0.5,1"), json!([0.0, 0.5, 1.0]));
        assert_eq!(
            typed_value(r#"[{"filter": "mlp", "value": 0.2}, {"value": 1}]"#)[1]["value"],
            json!(1)
        );
        assert_eq!(
            typed_value(r#"[{"filter": "mlp", "value": 0.2}]"#)[0]["filter"],
            json!("mlp")
        );
        assert_eq!(typed_value("global"), json!("global"));
        assert_eq!(typed_value("0,x"), json!("0,x"));
        assert_eq!(typed_value("nan"), json!("nan"));
    }
}

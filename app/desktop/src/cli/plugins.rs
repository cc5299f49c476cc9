//! `mergescope plugins list|show|approve`.

use super::plugin_new::Language;
use anyhow::Context as _;
use clap::Subcommand;
use mergescope_engine::plugin::discovery::user_plugin_dir;
use mergescope_engine::plugin::schema::ParamType;
use mergescope_engine::plugin::{Approvals, Plugin};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum PluginsCommand {
    /// List the method plugins (id, name, version, kind, parameters with defaults).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a method's help text and parameters.
    Show {
        /// Method id.
        id: String,
    },
    /// Make a new plugin project that builds anywhere, offline: a Cargo crate with the Rust SDK
    /// beside it (default), or a C file with the header and a Makefile.
    New {
        /// The method id users will type after --method (lowercase, dashes: my-method).
        id: String,
        /// A Rust crate (the default).
        #[arg(long, conflicts_with = "c")]
        rust: bool,
        /// A C file instead.
        #[arg(long)]
        c: bool,
        /// Folder to create (default: the id, in the current folder); must not exist or be empty.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Check a per-tensor plugin on synthetic inputs: it merges odd shapes and awkward values,
    /// gives finite outputs of the right shapes, the same bits for any threads, chunks and memory
    /// budget, merges an empty tensor, has out-of-range parameters refused, and uses every
    /// parameter. Exits with 1 when a property fails.
    Test {
        /// A plugin library file, or the id of a loaded plugin.
        plugin: String,
        /// Parameter for every run, as for merge (name=value; repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// Number of experts besides the base (default: the first of 3, 2 and 1 the method
        /// merges).
        #[arg(long)]
        experts: Option<usize>,
    },
    /// Approve plugin libraries from outside the app's folder (loading a library runs its code).
    Approve {
        /// Library files to approve (each approval holds for these exact contents: a rebuilt
        /// library needs approving again, or a trusted --folder).
        #[arg(required_unless_present = "folder")]
        paths: Vec<PathBuf>,
        /// Trust a development folder instead: every library built into it loads without
        /// approval, also after each rebuild (for the plugin you are writing; give it to
        /// --plugin-dir too).
        #[arg(long, value_name = "DIR", conflicts_with = "paths")]
        folder: Option<PathBuf>,
    },
}

fn param_line(p: &mergescope_engine::plugin::ParamSchema) -> String {
    let ty = match &p.ty {
        ParamType::Float { min, max } => {
            let range = match (min, max) {
                (Some(a), Some(b)) => format!(" in [{a}, {b}]"),
                (Some(a), None) => format!(" ≥ {a}"),
                (None, Some(b)) => format!(" ≤ {b}"),
                (None, None) => String::new(),
            };
            format!("float{range}{}", if p.per_task { ", per task" } else { "" })
        }
        ParamType::Int { min, max } => match (min, max) {
            (Some(a), Some(b)) => format!("int in [{a}, {b}]"),
            (Some(a), None) => format!("int ≥ {a}"),
            _ => "int".to_owned(),
        },
        ParamType::Bool => "bool".to_owned(),
        ParamType::Choice { choices } => format!("one of {}", choices.join(" | ")),
    };
    format!("{} = {}  ({ty}) {}", p.name, p.default, p.help)
}

fn plugin_json(p: &Plugin) -> serde_json::Value {
    serde_json::json!({
        "id": p.info.id,
        "name": p.info.name,
        "version": p.info.version,
        "kind": p.info.kind,
        "description": p.info.description,
        "abi": p.info.abi,
        "path": p.path,
        "origin": p.origin,
        "params": p.info.params,
    })
}

pub fn run(plugin_dirs: &[PathBuf], cmd: PluginsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginsCommand::List { json } => {
            let reg = super::registry(plugin_dirs)?;
            if json {
                let j = serde_json::json!({
                    "plugins": reg.plugins.iter().map(|p| plugin_json(p)).collect::<Vec<_>>(),
                    "needs_approval": reg.pending,
                    "failed": reg.failures,
                });
                println!("{}", serde_json::to_string_pretty(&j)?);
                return Ok(ExitCode::SUCCESS);
            }
            if reg.plugins.is_empty() {
                println!("No method plugins found.");
            }
            for p in &reg.plugins {
                println!(
                    "{:<18} {:<34} v{:<8} {}",
                    p.info.id, p.info.name, p.info.version, p.info.kind
                );
                for param in p.schema() {
                    println!("    {}", param_line(param));
                }
            }
            for p in &reg.pending {
                let why = if p.changed {
                    "changed since you approved it (rebuilt or replaced)"
                } else {
                    "needs approval"
                };
                println!(
                    "{why}: {} (approve with: mergescope plugins approve '{}'; for a folder you build into, \
                     mergescope plugins approve --folder DIR)",
                    p.path.display(),
                    p.path.display()
                );
            }
            for f in &reg.failures {
                println!("failed: {}: {}", f.path.display(), f.error);
            }
            if let Some(d) = user_plugin_dir() {
                println!("\nYour plugin folder: {}", d.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Show { id } => {
            let reg = super::registry(plugin_dirs)?;
            let p = reg.find(&id).map_err(anyhow::Error::msg)?;
            println!(
                "{} ({}) v{}, {}, ABI {}",
                p.info.name, p.info.id, p.info.version, p.info.kind, p.info.abi
            );
            println!("{}\n\n{}\n\nParameters:", p.info.description, p.info.help);
            for param in p.schema() {
                println!("  {}", param_line(param));
            }
            println!("\nLibrary: {}", p.path.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::New { id, rust: _, c, dir } => {
            let language = if c { Language::C } else { Language::Rust };
            let dir = dir.unwrap_or_else(|| PathBuf::from(&id));
            let written = super::plugin_new::create(&id, language, &dir)?;
            println!("created {} ({} files)", dir.display(), written.len());
            let build = match language {
                Language::Rust => format!(
                    "cd {d} && cargo build --release
  mergescope plugins approve --folder {d}/target/release
  mergescope --plugin-dir {d}/target/release merge --method {id} ...",
                    d = dir.display()
                ),
                Language::C => format!(
                    "cd {d} && make
  mergescope plugins approve --folder {d}
  mergescope --plugin-dir {d} merge --method {id} ...",
                    d = dir.display()
                ),
            };
            println!(
                "next:
  {build}
(see {}/README.md)",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Test {
            plugin,
            params,
            experts,
        } => {
            // A file the user names is loaded: that is what they asked for (as `approve` does).
            let plugin = if std::path::Path::new(&plugin).is_file() {
                std::sync::Arc::new(
                    mergescope_engine::plugin::load_plugin(std::path::Path::new(&plugin))
                        .with_context(|| format!("cannot load '{plugin}'"))?,
                )
            } else {
                super::registry(plugin_dirs)?
                    .find(&plugin)
                    .map_err(anyhow::Error::msg)?
            };
            if experts == Some(0) {
                anyhow::bail!("--experts 0: a merge needs at least one expert");
            }
            let params = super::merge::parse_params(&params)?;
            println!("{} ({}) v{}:", plugin.info.name, plugin.id(), plugin.info.version);
            let checks = mergescope_engine::conformance::check_plugin(&plugin, &params, experts);
            for c in &checks {
                let mark = if c.passed { "ok  " } else { "FAIL" };
                if c.detail.is_empty() {
                    println!("  {mark} {}", c.property);
                } else {
                    println!("  {mark} {}: {}", c.property, c.detail);
                }
            }
            let failed = checks.iter().filter(|c| !c.passed).count();
            println!("{} of {} properties hold", checks.len() - failed, checks.len());
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        PluginsCommand::Approve { folder: Some(dir), .. } => {
            let mut approvals = Approvals::load().map_err(anyhow::Error::msg)?;
            let abs = approvals.trust_folder(&dir).map_err(anyhow::Error::msg)?;
            println!(
                "trusted {}: every plugin library built into it loads without approval, also after a rebuild \
                 (run with --plugin-dir {})",
                abs.display(),
                abs.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Approve { paths, folder: None } => {
            let mut approvals = Approvals::load().map_err(anyhow::Error::msg)?;
            for path in paths {
                // Validate before approving (the user named this file, so loading it is what
                // they asked for): a library that is not a usable plugin is never approved.
                let plugin = mergescope_engine::plugin::load_plugin(&path)
                    .with_context(|| format!("'{}' was not approved", path.display()))?;
                let a = approvals.approve(&path).map_err(anyhow::Error::msg)?;
                println!(
                    "approved {} ({} v{}) sha256 {}",
                    a.path.display(),
                    plugin.id(),
                    plugin.version(),
                    a.sha256
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

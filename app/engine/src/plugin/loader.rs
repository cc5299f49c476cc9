//! Loading one plugin library and checking everything the ABI promises before calling it:
//! header symbol, magic, versions, entry symbol, table size, strings and schema.
//! Libraries are never unloaded (their code may still be referenced by thread-locals or
//! function pointers), so a loaded [`Plugin`] is `'static`.

use super::schema::{ParamSchema, parse_schema};
use mergescope_plugin_api::abi::{self, PluginApiV1, PluginHeader};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Why a library could not be used as a plugin. The message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The file is missing or the dynamic loader refused it.
    #[error("cannot load plugin '{path}': {reason}")]
    Open {
        /// Library path.
        path: PathBuf,
        /// Loader message (with its cause chain).
        reason: String,
    },
    /// The library is not a mergescope plugin (no header, wrong magic).
    #[error("'{path}' is not a mergescope plugin: {reason}")]
    NotAPlugin {
        /// Library path.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The plugin was built for another ABI version.
    #[error("plugin '{path}' uses {reason}")]
    Version {
        /// Library path.
        path: PathBuf,
        /// Both versions and the fix.
        reason: String,
    },
    /// The plugin's table or description is malformed.
    #[error("plugin '{path}' is malformed: {reason}")]
    Malformed {
        /// Library path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Where a plugin was found, which decides whether it needs approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginOrigin {
    /// Next to the executable: shipped with the app, trusted.
    Bundled,
    /// The user's plugin folder.
    UserFolder,
    /// A folder given with `--plugin-dir`, or a file given by path.
    Extra,
}

/// Description of a loaded plugin, as shown by `plugins list`.
#[derive(Clone, Debug, Serialize)]
pub struct PluginInfo {
    /// Stable id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// One-line description.
    pub description: String,
    /// Help text.
    pub help: String,
    /// "per-tensor" or "model-level".
    pub kind: &'static str,
    /// Capability bits.
    pub capabilities: u64,
    /// ABI version the plugin was built against, "major.minor".
    pub abi: String,
    /// Parameters.
    pub params: Vec<ParamSchema>,
}

/// A loaded, validated plugin.
pub struct Plugin {
    /// Library path.
    pub path: PathBuf,
    /// Where it was found.
    pub origin: PluginOrigin,
    /// Its description.
    pub info: PluginInfo,
    pub(crate) api: &'static PluginApiV1,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("origin", &self.origin)
            .field("info", &self.info)
            .finish()
    }
}

impl Plugin {
    /// Stable id.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// Version.
    pub fn version(&self) -> &str {
        &self.info.version
    }

    /// Parameter schema.
    pub fn schema(&self) -> &[ParamSchema] {
        &self.info.params
    }

    /// Whether this is a model-level method (run once over whole models in a session).
    pub fn is_model_level(&self) -> bool {
        self.info.kind == "model-level"
    }

    /// Whether `cap` (an `abi::CAP_*` bit) is set in the static capabilities.
    pub fn has_capability(&self, cap: u64) -> bool {
        self.info.capabilities & cap != 0
    }
}

fn loader_message(e: &libloading::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Checks, before the table is read as a [`PluginApiV1`], that its size covers the 1.0 table
/// and that every function the declared kind needs is present. A C plugin can leave any slot
/// NULL; the Rust type says those slots are never null, so they are read as raw words here
/// (a NULL `merge_tensor` would otherwise crash the first merge).
fn check_required_functions(path: &Path, api_ptr: *const PluginApiV1) -> Result<(), PluginError> {
    use std::mem::offset_of;
    if api_ptr.is_null() {
        return Ok(()); // reported with its own message by the caller
    }
    let base = api_ptr.cast::<u8>();
    // SAFETY: a non-null table pointer from the entry points to at least the 1.0 table's
    // `struct_size` and `kind`, which precede every function slot; unaligned reads of plain
    // integers and pointers from it are valid for any bit pattern.
    let struct_size = unsafe {
        base.add(offset_of!(PluginApiV1, struct_size))
            .cast::<usize>()
            .read_unaligned()
    };
    if struct_size < abi::PLUGIN_API_V1_MIN_SIZE {
        return Ok(()); // reported by the caller with the table sizes
    }
    // SAFETY: as above; the table is at least the 1.0 size, which holds these fields.
    let kind = unsafe {
        base.add(offset_of!(PluginApiV1, kind))
            .cast::<abi::PluginKind>()
            .read_unaligned()
    };
    let per_tensor = kind == abi::KIND_PER_TENSOR;
    let mut required = vec![
        ("create", offset_of!(PluginApiV1, create)),
        ("destroy", offset_of!(PluginApiV1, destroy)),
    ];
    if per_tensor {
        required.push(("merge_tensor", offset_of!(PluginApiV1, merge_tensor)));
    }
    let missing: Vec<&str> = required
        .into_iter()
        // SAFETY: each offset lies inside the 1.0 table checked above.
        .filter(|(_, off)| unsafe { base.add(*off).cast::<*const std::ffi::c_void>().read_unaligned() }.is_null())
        .map(|(name, _)| name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let (kind_name, needed) = if per_tensor {
        ("per-tensor", "create, destroy and merge_tensor")
    } else {
        ("model-level", "create, destroy and run_model")
    };
    Err(PluginError::Malformed {
        path: path.to_path_buf(),
        reason: format!(
            "its table leaves the required function{} {} NULL (a {kind_name} method must provide {needed}); fix the \
             plugin and rebuild it",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", "),
        ),
    })
}

fn static_str(path: &Path, field: &str, s: abi::Str) -> Result<String, PluginError> {
    // SAFETY: the plugin's table points at its own static strings, valid while it is loaded,
    // and plugins are never unloaded.
    unsafe { s.as_str() }
        .map(str::to_owned)
        .map_err(|_| PluginError::Malformed {
            path: path.to_path_buf(),
            reason: format!("its {field} is not valid UTF-8"),
        })
}

/// Loads and validates the plugin library at `path` (explicitly chosen: no approval check).
pub fn load_plugin(path: &Path) -> Result<Plugin, PluginError> {
    load_plugin_as(path, PluginOrigin::Extra)
}

/// Loads and validates a plugin, recording where it was found.
pub fn load_plugin_as(path: &Path, origin: PluginOrigin) -> Result<Plugin, PluginError> {
    let p = path.to_path_buf();
    if !path.is_file() {
        return Err(PluginError::Open {
            path: p,
            reason: "no such file".into(),
        });
    }
    // SAFETY: loading a library runs its initialisers. Only libraries next to the executable,
    // explicitly named ones, and user-approved ones get here (see `discovery`).
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| PluginError::Open {
        path: p.clone(),
        reason: loader_message(&e),
    })?;
    // Never unload: leak the handle so the code stays mapped for the life of the process.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));

    // SAFETY: for a data symbol requested as `*const T`, libloading yields the symbol's address;
    // we only read it after the magic check below.
    let header_ptr = unsafe { lib.get::<*const PluginHeader>(abi::HEADER_SYMBOL.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| PluginError::NotAPlugin {
            path: p.clone(),
            reason: format!("it exports no '{}' symbol", abi::HEADER_SYMBOL),
        })?;
    // SAFETY: the symbol exists; a plugin exports a static PluginHeader there. A non-plugin that
    // happens to export the name is caught by the magic check (we read 16 bytes).
    let header = unsafe { header_ptr.as_ref() }
        .copied()
        .ok_or_else(|| PluginError::NotAPlugin {
            path: p.clone(),
            reason: "its header symbol is null".into(),
        })?;
    if header.magic != abi::MAGIC {
        return Err(PluginError::NotAPlugin {
            path: p,
            reason: format!(
                "its header has the wrong magic bytes {:?} (expected {:?})",
                String::from_utf8_lossy(&header.magic),
                String::from_utf8_lossy(&abi::MAGIC)
            ),
        });
    }
    let (maj, min) = (header.abi_major, header.abi_minor);
    if maj != abi::ABI_MAJOR {
        return Err(PluginError::Version {
            path: p,
            reason: format!(
                "plugin ABI {maj}.{min}, which this host (ABI {}.{}) cannot load; rebuild the plugin against \
                 mergescope-plugin-api {}.x or use a mergescope release with ABI {maj}",
                abi::ABI_MAJOR,
                abi::ABI_MINOR,
                abi::ABI_MAJOR
            ),
        });
    }
    if min > abi::ABI_MINOR {
        return Err(PluginError::Version {
            path: p,
            reason: format!(
                "plugin ABI {maj}.{min}, newer than this host's ABI {}.{}; update mergescope or rebuild the plugin \
                 against an older mergescope-plugin-api",
                abi::ABI_MAJOR,
                abi::ABI_MINOR
            ),
        });
    }
    // SAFETY: the header promised ABI 1, whose entry symbol has type EntryV1.
    let entry =
        unsafe { lib.get::<abi::EntryV1>(abi::ENTRY_SYMBOL_V1.as_bytes()) }.map_err(|_| PluginError::Malformed {
            path: p.clone(),
            reason: format!(
                "its header says ABI {maj}.{min} but it is missing the entry symbol '{}'",
                abi::ENTRY_SYMBOL_V1
            ),
        })?;
    // SAFETY: calling the plugin's entry; the SDK guards it against panics. A plugin written
    // without the SDK that panics here aborts the process: the ABI forbids it.
    let api_ptr = unsafe { entry() };
    check_required_functions(&p, api_ptr)?;
    // SAFETY: a non-null pointer from the entry points to a static table.
    let api: &'static PluginApiV1 = unsafe { api_ptr.as_ref() }.ok_or_else(|| PluginError::Malformed {
        path: p.clone(),
        reason: format!(
            "its entry '{}' returned null (the plugin failed to initialise)",
            abi::ENTRY_SYMBOL_V1
        ),
    })?;
    if api.struct_size < abi::PLUGIN_API_V1_MIN_SIZE {
        return Err(PluginError::Malformed {
            path: p,
            reason: format!(
                "its table is too short: struct_size {} < {} bytes of the ABI 1.0 table; rebuild it against the \
                 current mergescope-plugin-api",
                api.struct_size,
                abi::PLUGIN_API_V1_MIN_SIZE
            ),
        });
    }
    let id = static_str(&p, "id", api.id)?;
    if id.is_empty()
        || !id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        return Err(PluginError::Malformed {
            path: p,
            reason: format!("its id '{id}' must be non-empty lowercase letters, digits, '-' or '_'"),
        });
    }
    let kind = match api.kind {
        abi::KIND_PER_TENSOR => "per-tensor",
        abi::KIND_MODEL_LEVEL => {
            // Read `run_model` only when the plugin's table is long enough to have it.
            let has_run = api.struct_size >= abi::PLUGIN_API_V1_1_MIN_SIZE && api.run_model.is_some();
            if !has_run {
                return Err(PluginError::Malformed {
                    path: p,
                    reason: format!(
                        "it is a model-level method but its table (ABI {maj}.{min}, {} bytes) has no run_model \
                         function; model-level methods need ABI 1.1: rebuild it against plugin-api 1.1 or newer",
                        api.struct_size
                    ),
                });
            }
            "model-level"
        }
        k => {
            return Err(PluginError::Malformed {
                path: p,
                reason: format!("it declares unknown kind {k}"),
            });
        }
    };
    let schema_text = static_str(&p, "parameter schema", api.params_schema_json)?;
    let params = parse_schema(&schema_text).map_err(|reason| PluginError::Malformed {
        path: p.clone(),
        reason,
    })?;
    let info = PluginInfo {
        id,
        name: static_str(&p, "name", api.name)?,
        version: static_str(&p, "version", api.version)?,
        description: static_str(&p, "description", api.description)?,
        help: static_str(&p, "help", api.help)?,
        kind,
        capabilities: api.capabilities,
        abi: format!("{maj}.{min}"),
        params,
    };
    Ok(Plugin {
        path: p,
        origin,
        info,
        api,
    })
}

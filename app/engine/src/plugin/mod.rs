//! The plugin host: discovery and approval, loading and validation, the host tensor table
//! plugins call back into (`call`, `host_api`) and its extensions (`host_ext`), parameter
//! schemas, and plugin instances.

pub mod call;
pub mod discovery;
pub mod host_api;
pub mod host_ext;
pub mod instance;
pub mod loader;
pub mod schema;

pub use discovery::{Approvals, PluginDirs, Registry};
pub use loader::{Plugin, PluginError, PluginInfo, PluginOrigin, load_plugin};
pub use schema::{ParamSchema, ResolvedParams, resolve_params};

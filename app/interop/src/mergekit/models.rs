//! Model references of a mergekit configuration: local folders or files, or Hugging Face ids
//! found in the local Hugging Face cache (mergescope never downloads).

use std::path::{Path, PathBuf};

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
fn hub_cache() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"))?;
    Some(PathBuf::from(home).join(".cache").join("huggingface").join("hub"))
}

/// The snapshot of Hugging Face id `id` (`org/name`, optionally `@revision`) in the hub cache.
fn cached_snapshot(cache: &Path, id: &str) -> Option<PathBuf> {
    let (id, revision) = match id.split_once('@') {
        Some((i, r)) => (i, Some(r)),
        None => (id, None),
    };
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    let revision = match revision {
        Some(r) => std::fs::read_to_string(repo.join("refs").join(r))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| r.to_owned()),
        None => match std::fs::read_to_string(repo.join("refs").join("main")) {
            Ok(s) => s.trim().to_owned(),
            Err(_) => {
                // No refs/main: the only snapshot, if there is exactly one.
                let mut all: Vec<PathBuf> = std::fs::read_dir(&snapshots)
                    .ok()?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.is_dir())
                    .collect();
                return (all.len() == 1).then(|| all.remove(0));
            }
        },
    };
    let p = snapshots.join(revision);
    p.is_dir().then_some(p)
}

/// Resolves a model reference to an absolute path: a path as given (from the working folder),
/// a path relative to the configuration's folder `dir`, or a Hugging Face id in the local
/// cache. The error says where it looked and how to make the model available.
pub fn resolve_model(reference: &str, dir: &Path) -> Result<PathBuf, String> {
    let found = find_model(reference, dir)?;
    Ok(std::fs::canonicalize(&found).unwrap_or(found))
}

fn find_model(reference: &str, dir: &Path) -> Result<PathBuf, String> {
    let reference = reference.trim();
    if reference.is_empty() {
        return Err("the model reference is empty".to_owned());
    }
    if let Some((model, adapter)) = reference.split_once('+') {
        return Err(format!(
            "'{reference}' applies the LoRA adapter '{adapter}' to '{model}', which only a merge input may do (with \
             the base as its model)"
        ));
    }
    let given = PathBuf::from(reference);
    if given.exists() {
        return Ok(given);
    }
    let beside = dir.join(reference);
    if given.is_relative() && beside.exists() {
        return Ok(beside);
    }
    let cache = hub_cache();
    let looks_like_id = reference.split('/').count() == 2 && !reference.starts_with('.') && given.is_relative();
    if looks_like_id
        && let Some(c) = &cache
        && let Some(snapshot) = cached_snapshot(c, reference)
    {
        return Ok(snapshot);
    }
    let mut tried = vec![format!("'{}'", given.display())];
    if given.is_relative() {
        tried.push(format!("'{}'", beside.display()));
    }
    if looks_like_id && let Some(c) = &cache {
        tried.push(format!("the Hugging Face cache '{}'", c.display()));
    }
    let hint = if looks_like_id {
        format!(
            "; mergescope does not download models: fetch it first (`huggingface-cli download {reference}`) or write \
             the path of a local copy"
        )
    } else {
        "; write the path of the model's folder or .safetensors file".to_owned()
    };
    Err(format!(
        "model '{reference}' was not found (looked at {}){hint}",
        tried.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_resolve_to_the_cached_snapshot_of_main() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        std::fs::create_dir_all(repo.join("snapshots").join("abc123")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots").join("def456")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "def456\n").unwrap();
        assert_eq!(
            cached_snapshot(cache.path(), "org/tiny").unwrap(),
            repo.join("snapshots").join("def456")
        );
        assert_eq!(
            cached_snapshot(cache.path(), "org/tiny@abc123").unwrap(),
            repo.join("snapshots").join("abc123")
        );
        assert!(cached_snapshot(cache.path(), "org/other").is_none());
    }

    #[test]
    fn paths_resolve_beside_the_config_and_errors_say_where_they_looked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("expert-a")).unwrap();
        assert_eq!(
            resolve_model("expert-a", dir.path()).unwrap(),
            dir.path().join("expert-a").canonicalize().unwrap()
        );
        let e = resolve_model("nowhere/model-x", dir.path()).unwrap_err();
        assert!(
            e.contains("nowhere/model-x") && e.contains("huggingface-cli download"),
            "{e}"
        );
        let e = resolve_model("base+adapters/lora", dir.path()).unwrap_err();
        assert!(e.contains("LoRA adapter") && e.contains("merge input"), "{e}");
    }
}

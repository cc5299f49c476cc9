//! Writing safetensors outputs atomically: the header is known up front (shapes and dtypes of
//! every output tensor), so files are pre-sized and workers write their tensors at fixed
//! offsets, in any order. Everything goes to a temporary path next to the destination that is
//! renamed into place only when complete; a failed or cancelled merge leaves nothing behind.

use crate::direct_write::DirectFile;
use crate::dtype::{DType, all_within, encode_f32_checked, largest_finite};
use crate::error::{EngineError, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct OutputTensor {
    /// Name.
    pub name: String,
    /// Stored dtype.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl OutputTensor {
    fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size() as u64
    }
}

#[derive(Debug)]
struct Shard {
    file_name: String,
    header: Vec<u8>,
    data_len: u64,
}

/// Where each output tensor goes: (shard index, absolute byte offset, dtype).
type Locations = BTreeMap<String, (usize, u64, DType)>;

fn build_shards(
    tensors: &[OutputTensor],
    metadata: &BTreeMap<String, String>,
    shard_bytes: Option<u64>,
) -> Result<(Vec<Shard>, Locations)> {
    // Group tensors (in name order) into shards of at most `shard_bytes` data bytes.
    let mut sorted: Vec<&OutputTensor> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut groups: Vec<Vec<&OutputTensor>> = vec![Vec::new()];
    let mut current = 0u64;
    for t in sorted {
        let b = t.bytes();
        if let Some(limit) = shard_bytes
            && current > 0
            && current + b > limit
        {
            groups.push(Vec::new());
            current = 0;
        }
        current += b;
        if let Some(g) = groups.last_mut() {
            g.push(t);
        }
    }
    let n = groups.len();
    let mut shards = Vec::new();
    let mut locations = Locations::new();
    for (si, g) in groups.iter().enumerate() {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert(
                "__metadata__".into(),
                serde_json::Value::Object(metadata.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect()),
            );
        }
        let mut offset = 0u64;
        let mut rel = Vec::new();
        for t in g {
            let b = t.bytes();
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, offset + b]}),
            );
            rel.push((t.name.clone(), offset, t.dtype));
            offset += b;
        }
        let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
            .map_err(|e| EngineError::Invalid(format!("cannot encode the output header: {e}")))?;
        // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
        while (json.len() + 8) % 8 != 0 {
            json.push(b' ');
        }
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&json);
        let data_start = bytes.len() as u64;
        for (name, off, dtype) in rel {
            locations.insert(name, (si, data_start + off, dtype));
        }
        let file_name = if n == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", si + 1, n)
        };
        shards.push(Shard {
            file_name,
            header: bytes,
            data_len: offset,
        });
    }
    Ok((shards, locations))
}

/// Writes `bytes` to `path` atomically: a temporary sibling, fsynced, then renamed over
/// `path`. Readers see the old file or the new one, never a partial one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let tmp = tmp_sibling(path, "writing");
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        EngineError::io("cannot write", path, e)
    })
}

/// A small file written beside the tensors of a folder output (`config.json`, tokenizer files,
/// a model card): a plain file name and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtraFile {
    /// File name inside the output folder (no folder part).
    pub name: String,
    /// Contents.
    pub bytes: Vec<u8>,
}

/// How an output is laid out on disk.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum OutputLayout {
    /// One `.safetensors` file, or a folder of shards with an index when the output is split.
    #[default]
    Auto,
    /// Always a folder (a Hugging Face model folder): `model.safetensors` or shards, the index,
    /// and these files beside them.
    Folder(Vec<ExtraFile>),
}

/// An output being written. Dropping it without [`OutputWriter::commit`] removes the
/// temporary files.
#[derive(Debug)]
pub struct OutputWriter {
    final_path: PathBuf,
    tmp_path: PathBuf,
    sharded: bool,
    files: Vec<File>,
    file_paths: Vec<PathBuf>,
    locations: Locations,
    overwrite: bool,
    committed: bool,
    extra: Vec<String>,
    /// Bytes written to each file since its write-back was last started.
    unsynced: Vec<AtomicU64>,
    /// Each file's direct-write handle, where it is written around the page cache.
    direct: Vec<Option<DirectFile>>,
}

/// Bytes written to an output file between two starts of its write-back (see
/// [`start_writeback`]).
const WRITEBACK_EVERY: u64 = 64 << 20;

fn tmp_sibling(path: &Path, tag: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    path.with_file_name(format!(".{name}.{tag}-{}", std::process::id()))
}

impl OutputWriter {
    /// Prepares an output at `out`: a single file, or (when `shard_bytes` splits it) a folder of
    /// shards with `model.safetensors.index.json`. Fails if `out` exists and `overwrite` is false.
    pub fn create(
        out: &Path,
        tensors: &[OutputTensor],
        metadata: &BTreeMap<String, String>,
        shard_bytes: Option<u64>,
        overwrite: bool,
    ) -> Result<OutputWriter> {
        Self::create_with_layout(out, tensors, metadata, shard_bytes, overwrite, &OutputLayout::Auto)
    }

    /// As [`OutputWriter::create`], laid out as `layout` says. A folder output always has a shard
    /// index (listing the extra files it wrote, so that `--overwrite` knows the folder is its own).
    pub fn create_with_layout(
        out: &Path,
        tensors: &[OutputTensor],
        metadata: &BTreeMap<String, String>,
        shard_bytes: Option<u64>,
        overwrite: bool,
        layout: &OutputLayout,
    ) -> Result<OutputWriter> {
        let (shards, locations) = build_shards(tensors, metadata, shard_bytes)?;
        let extra: &[ExtraFile] = match layout {
            OutputLayout::Auto => &[],
            OutputLayout::Folder(files) => files,
        };
        for f in extra {
            let reserved = f.name == INDEX_NAME || shards.iter().any(|s| s.file_name == f.name);
            if !crate::checkpoint::is_plain_file_name(&f.name) || reserved {
                return Err(EngineError::Invalid(format!(
                    "cannot write '{}' into the output folder: it is not a plain file name or it is one of the \
                     weight files",
                    f.name
                )));
            }
        }
        let sharded = shards.len() > 1 || matches!(layout, OutputLayout::Folder(_));
        if out.exists() && !overwrite {
            return Err(EngineError::Invalid(format!(
                "'{}' already exists; mergescope never replaces a file silently: choose another --out or pass --overwrite",
                out.display()
            )));
        }
        if sharded && out.is_file() {
            return Err(EngineError::Invalid(format!(
                "'{}' is a file but this output is a folder of shards; choose another --out (or --shard-size 0 for one file)",
                out.display()
            )));
        }
        if sharded && out.is_dir() {
            check_own_output_folder(out)?;
        }
        if out.is_dir() && !sharded {
            return Err(EngineError::Invalid(format!(
                "'{}' is a folder but the output is a single file; give a file path such as {}/merged.safetensors",
                out.display(),
                out.display()
            )));
        }
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty())
            && !parent.is_dir()
        {
            return Err(EngineError::Invalid(format!(
                "the output folder '{}' does not exist; create it first",
                parent.display()
            )));
        }
        remove_stale_temporaries(out);
        let tmp_path = tmp_sibling(out, "partial");
        let mut files = Vec::new();
        let mut file_paths = Vec::new();
        let mut writer = OutputWriter {
            final_path: out.to_path_buf(),
            tmp_path: tmp_path.clone(),
            sharded,
            files: Vec::new(),
            file_paths: Vec::new(),
            locations,
            overwrite,
            committed: false,
            extra: extra.iter().map(|f| f.name.clone()).collect(),
            unsynced: Vec::new(),
            direct: Vec::new(),
        };
        if sharded {
            std::fs::create_dir(&tmp_path).map_err(|e| EngineError::io("cannot create folder", &tmp_path, e))?;
        }
        // The direct files' writer threads, started with the first of them.
        let mut behind = None;
        for s in &shards {
            let p = if sharded {
                tmp_path.join(&s.file_name)
            } else {
                tmp_path.clone()
            };
            let f = File::create(&p).map_err(|e| EngineError::io("cannot create", &p, e))?;
            let len = s.header.len() as u64 + s.data_len;
            preallocate(&f, len, &p)?;
            let direct = DirectFile::open(&p, len, &mut behind);
            match &direct {
                Some(d) => d.write_with(0, s.header.len(), |b| {
                    b.copy_from_slice(&s.header);
                    true
                })?,
                None => write_all_at(&f, &s.header, 0, &p)?,
            }
            writer.direct.push(direct);
            files.push(f);
            file_paths.push(p);
        }
        if sharded {
            let total: u64 = shards.iter().map(|s| s.data_len).sum();
            let weight_map: BTreeMap<&String, &String> = writer
                .locations
                .iter()
                .map(|(name, (si, _, _))| (name, &shards[*si].file_name))
                .collect();
            let mut index_meta = serde_json::json!({"total_size": total});
            if !extra.is_empty() {
                index_meta[EXTRA_FILES_KEY] = extra.iter().map(|f| f.name.clone()).collect::<Vec<_>>().into();
            }
            let index = serde_json::json!({"metadata": index_meta, "weight_map": weight_map});
            let p = tmp_path.join("model.safetensors.index.json");
            let text = serde_json::to_string_pretty(&index)
                .map_err(|e| EngineError::Invalid(format!("cannot encode the shard index: {e}")))?;
            std::fs::write(&p, text).map_err(|e| EngineError::io("cannot write", &p, e))?;
            for f in extra {
                let p = tmp_path.join(&f.name);
                std::fs::write(&p, &f.bytes).map_err(|e| EngineError::io("cannot write", &p, e))?;
            }
        }
        writer.unsynced = files.iter().map(|_| AtomicU64::new(0)).collect();
        writer.files = files;
        writer.file_paths = file_paths;
        Ok(writer)
    }

    /// Writes encoded bytes of tensor `name` starting at element byte offset `byte_from`.
    pub fn write(&self, name: &str, byte_from: u64, bytes: &[u8]) -> Result<()> {
        let &(si, off, _) = self.location(name)?;
        if let Some(d) = self.direct.get(si).and_then(Option::as_ref) {
            return d.write_with(off + byte_from, bytes.len(), |b| {
                b.copy_from_slice(bytes);
                true
            });
        }
        self.write_buffered(si, off + byte_from, bytes)
    }

    /// Where tensor `name` goes: (shard index, byte offset of its data, dtype).
    fn location(&self, name: &str) -> Result<&(usize, u64, DType)> {
        self.locations
            .get(name)
            .ok_or_else(|| EngineError::Bug(format!("tensor '{name}' is not in the output plan")))
    }

    /// A positioned write through the page cache into shard `si`.
    fn write_buffered(&self, si: usize, at: u64, bytes: &[u8]) -> Result<()> {
        write_all_at(&self.files[si], bytes, at, &self.file_paths[si])?;
        // Every WRITEBACK_EVERY bytes the disk is asked to start writing what is dirty, so the
        // output goes to disk while the merge runs and the fsync before the rename waits only
        // for the last of it.
        if let Some(unsynced) = self.unsynced.get(si) {
            let before = unsynced.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if before + bytes.len() as u64 >= WRITEBACK_EVERY && unsynced.swap(0, Ordering::Relaxed) >= WRITEBACK_EVERY
            {
                start_writeback(&self.files[si]);
            }
        }
        Ok(())
    }

    /// Encodes f32 values of tensor `name` to its output dtype and writes them from element
    /// `elem_from`; returns whether every value was finite, checked while encoding (NaN and Inf
    /// are written as they are: a merge that must refuse them does so with its own message,
    /// and its output never gets its final name). Values beyond the dtype's range (e.g. over
    /// 65504 for F16) are refused rather than silently written as Inf.
    pub fn write_values(&self, name: &str, elem_from: usize, values: &[f32]) -> Result<bool> {
        let &(si, off, dtype) = self.location(name)?;
        let at = off + (elem_from * dtype.size()) as u64;
        let len = values.len() * dtype.size();
        // One pass encodes and checks; only where it finds a value that is not finite or out
        // of range is the slower check below run, to tell the two apart.
        let mut checked = Ok(true);
        let mut fill = |bytes: &mut [u8]| {
            if encode_f32_checked(dtype, values, bytes) {
                return true;
            }
            checked = check_range(dtype, name, elem_from, values).map(|()| false);
            checked.is_ok()
        };
        if let Some(d) = self.direct.get(si).and_then(Option::as_ref) {
            d.write_with(at, len, fill)?;
        } else {
            let mut bytes = vec![0u8; len];
            if fill(&mut bytes) {
                self.write_buffered(si, at, &bytes)?;
            }
        }
        checked
    }

    /// Stored dtype of an output tensor.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.locations.get(name).map(|l| l.2)
    }

    /// Flushes and moves the output into place; returns the written files.
    pub fn commit(mut self) -> Result<Vec<PathBuf>> {
        for d in self.direct.iter().flatten() {
            d.finish()?;
        }
        for (f, p) in self.files.iter().zip(&self.file_paths) {
            f.sync_all().map_err(|e| EngineError::io("cannot flush", p, e))?;
        }
        let old = tmp_sibling(&self.final_path, "old");
        let replacing_dir = self.final_path.is_dir();
        if replacing_dir {
            if !self.overwrite {
                return Err(EngineError::Invalid(format!(
                    "'{}' appeared during the merge",
                    self.final_path.display()
                )));
            }
            check_own_output_folder(&self.final_path)?;
            std::fs::rename(&self.final_path, &old)
                .map_err(|e| EngineError::io("cannot move aside", &self.final_path, e))?;
        }
        std::fs::rename(&self.tmp_path, &self.final_path)
            .map_err(|e| EngineError::io("cannot move the finished output to", &self.final_path, e))?;
        self.committed = true;
        if replacing_dir {
            std::fs::remove_dir_all(&old).map_err(|e| EngineError::io("cannot remove the replaced output", &old, e))?;
        }
        let names: Vec<PathBuf> = if self.sharded {
            let mut v: Vec<PathBuf> = self
                .file_paths
                .iter()
                .filter_map(|p| p.file_name().map(|n| self.final_path.join(n)))
                .collect();
            v.push(self.final_path.join(INDEX_NAME));
            v.extend(self.extra.iter().map(|n| self.final_path.join(n)));
            v
        } else {
            vec![self.final_path.clone()]
        };
        Ok(names)
    }
}

/// Refuses values that `dtype` cannot hold (they would be written as Inf).
fn check_range(dtype: DType, name: &str, elem_from: usize, values: &[f32]) -> Result<()> {
    let Some(max) = largest_finite(dtype) else {
        return Ok(());
    };
    if all_within(values, max) {
        return Ok(());
    }
    if let Some(i) = values.iter().position(|v| v.abs() > max) {
        let peak = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        return Err(EngineError::Invalid(format!(
            "tensor '{name}': element {} is {}, beyond the range of {} (largest finite value ±{max}; this tensor reaches \
                 ±{peak:e}), so it would be written as Inf; keep the input dtype (leave out --dtype) or choose a wider one \
                 (--dtype bf16 or f32)",
            elem_from + i,
            values[i],
            dtype.name()
        )));
    }
    Ok(())
}

/// The index of a shard folder.
const INDEX_NAME: &str = "model.safetensors.index.json";
/// Key of the index's `metadata` listing the files a folder output wrote beside its shards.
const EXTRA_FILES_KEY: &str = "mergescope_files";

/// The extra files that the index of folder `dir` says mergescope wrote (none when unreadable).
fn listed_extra_files(index: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(index) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    json["metadata"][EXTRA_FILES_KEY]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Refuses to replace folder `dir` unless mergescope wrote it: a shard index, only the shards it
/// lists beside it, and mergescope's metadata in them. `--overwrite` never deletes a folder of
/// the user's files.
fn check_own_output_folder(dir: &Path) -> Result<()> {
    let refuse = |why: String| {
        EngineError::Invalid(format!(
            "'{}' is a folder that mergescope did not write ({why}); --overwrite only replaces mergescope's own \
                 output folders: choose another --out, or empty or remove that folder yourself",
            dir.display()
        ))
    };
    let index = dir.join(INDEX_NAME);
    let shards: std::collections::BTreeSet<String> = crate::checkpoint::read_weight_map(&index)
        .map(|map| map.into_iter().map(|(_, file)| file).collect())
        .unwrap_or_default();
    let extras = listed_extra_files(&index);
    let entries = std::fs::read_dir(dir).map_err(|e| EngineError::io("cannot list", dir, e))?;
    let mut foreign = Vec::new();
    for e in entries {
        let name = e
            .map_err(|e| EngineError::io("cannot list", dir, e))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name != INDEX_NAME && !shards.contains(&name) && !extras.contains(&name) {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        let more = if foreign.len() > 3 {
            format!(" and {} more", foreign.len() - 3)
        } else {
            String::new()
        };
        foreign.truncate(3);
        let listed: Vec<String> = foreign.iter().map(|f| format!("'{f}'")).collect();
        return Err(refuse(format!("it holds {}{more}", listed.join(", "))));
    }
    if shards.is_empty() {
        return Err(refuse(format!("it has no readable {INDEX_NAME} listing its shards")));
    }
    let ours = shards.iter().next().is_some_and(|first| {
        crate::checkpoint::Checkpoint::open(&dir.join(first))
            .is_ok_and(|c| c.metadata().contains_key("mergescope.version"))
    });
    if !ours {
        return Err(refuse("its shards carry no mergescope metadata".to_owned()));
    }
    Ok(())
}

/// Removes temporaries that a killed mergescope left beside `out` (`.<name>.partial-<pid>` and
/// the like, whose process is gone). Only on systems with `/proc`, where that can be told.
fn remove_stale_temporaries(out: &Path) {
    let proc_dir = Path::new("/proc");
    if !proc_dir.join("self").exists() {
        return;
    }
    let Some(name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return;
    };
    let prefix = format!(".{name}.");
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix(&prefix) else {
            continue;
        };
        let Some((tag, pid)) = rest.rsplit_once('-') else {
            continue;
        };
        // `.old-` folders hold a replaced output mid-swap: never deleted here.
        let own_tag = matches!(tag, "partial" | "writing");
        let dead = pid.parse::<u32>().is_ok_and(|p| !proc_dir.join(p.to_string()).exists());
        if own_tag && dead {
            let path = e.path();
            let _ignored = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

impl Drop for OutputWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ignored = if self.sharded {
                std::fs::remove_dir_all(&self.tmp_path)
            } else {
                std::fs::remove_file(&self.tmp_path)
            };
        }
    }
}

/// Sizes a new output file to `len` bytes. On Linux the blocks are reserved up front
/// (`fallocate`), so the workers' positioned writes find them allocated instead of each write
/// allocating its own (twice as fast on ext4), and a full disk fails here, before any work;
/// elsewhere, or where the file system cannot, the file is extended sparsely.
fn preallocate(f: &File, len: u64, path: &Path) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        let Ok(size) = libc::off_t::try_from(len) else {
            return Err(EngineError::Invalid(format!(
                "'{}': {len} bytes is too large a file",
                path.display()
            )));
        };
        // SAFETY: fallocate on an open, owned descriptor; it only changes the file's allocation.
        if size > 0 && unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOSPC) {
            return Err(EngineError::io("no space left for the output", path, err));
        }
    }
    f.set_len(len).map_err(|e| EngineError::io("cannot size", path, e))
}

/// Starts writing a file's dirty pages to disk without waiting for them (Linux's
/// `sync_file_range` with `SYNC_FILE_RANGE_WRITE`; elsewhere nothing: the final fsync does it
/// all). A hint: its failure changes nothing, the fsync before the rename still decides.
fn start_writeback(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: an open, owned descriptor; the call only schedules I/O of its page cache.
        unsafe {
            libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}

#[cfg(unix)]
fn write_all_at(f: &File, bytes: &[u8], offset: u64, path: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt as _;
    f.write_all_at(bytes, offset)
        .map_err(|e| EngineError::io("cannot write", path, e))
}

#[cfg(windows)]
fn write_all_at(f: &File, mut bytes: &[u8], mut offset: u64, path: &Path) -> Result<()> {
    use std::os::windows::fs::FileExt as _;
    while !bytes.is_empty() {
        let n = f
            .seek_write(bytes, offset)
            .map_err(|e| EngineError::io("cannot write", path, e))?;
        bytes = &bytes[n..];
        offset += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::dtype::encode_f32;

    fn tensors() -> Vec<OutputTensor> {
        vec![
            OutputTensor {
                name: "b".into(),
                dtype: DType::F32,
                shape: vec![2],
            },
            OutputTensor {
                name: "a".into(),
                dtype: DType::BF16,
                shape: vec![2, 2],
            },
        ]
    }

    fn fill(w: &OutputWriter) {
        let mut bytes = Vec::new();
        encode_f32(DType::BF16, &[1.0, 2.0, 3.0, 4.0], &mut bytes);
        w.write("a", 0, &bytes).unwrap();
        encode_f32(DType::F32, &[5.0], &mut bytes);
        w.write("b", 4, &bytes).unwrap();
        encode_f32(DType::F32, &[6.0], &mut bytes);
        w.write("b", 0, &bytes).unwrap();
    }

    #[test]
    fn single_file_round_trip_with_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.safetensors");
        let meta: BTreeMap<String, String> = [("mergescope.method".to_owned(), "x".to_owned())].into();
        let w = OutputWriter::create(&out, &tensors(), &meta, None, false).unwrap();
        assert!(!out.exists(), "nothing at the destination before commit");
        fill(&w);
        w.commit().unwrap();
        let c = Checkpoint::open(&out).unwrap();
        assert_eq!(c.read_f32(&c.tensors["a"]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.read_f32(&c.tensors["b"]).unwrap(), vec![6.0, 5.0]);
        assert_eq!(c.metadata()["mergescope.method"], "x");
        let e = OutputWriter::create(&out, &tensors(), &meta, None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary files left"
        );
    }

    #[test]
    fn shards_with_index_and_cleanup_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("merged");
        let w = OutputWriter::create(&out, &tensors(), &BTreeMap::new(), Some(8), false).unwrap();
        fill(&w);
        let files = w.commit().unwrap();
        assert_eq!(files.len(), 3);
        let c = Checkpoint::open(&out).unwrap();
        assert_eq!(c.files.len(), 2);
        assert_eq!(c.read_f32(&c.tensors["b"]).unwrap(), vec![6.0, 5.0]);

        let out2 = dir.path().join("dropped.safetensors");
        let w = OutputWriter::create(&out2, &tensors(), &BTreeMap::new(), None, false).unwrap();
        drop(w);
        assert!(!out2.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temporary file removed"
        );
    }

    #[test]
    fn a_large_output_written_in_odd_chunks_from_threads_reads_back_exactly() {
        // Large enough for direct writes (where the file system allows them), in a real folder
        // (/tmp may be a tmpfs); chunks that start and end inside blocks, written out of order.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let out = dir.path().join("big.safetensors");
        let (rows, cols) = (4099usize, 2111usize);
        let specs = vec![
            OutputTensor {
                name: "w".into(),
                dtype: DType::BF16,
                shape: vec![rows, cols],
            },
            OutputTensor {
                name: "b".into(),
                dtype: DType::F32,
                shape: vec![333],
            },
        ];
        assert!(rows * cols * 2 > crate::direct_write::MIN_DIRECT_BYTES as usize);
        // Values bf16 holds exactly (at most 8 significant bits).
        let value = |i: usize| ((i * 37 % 251) as f32 - 125.0) / 4.0;
        let w = OutputWriter::create(&out, &specs, &BTreeMap::new(), None, false).unwrap();
        let n = rows * cols;
        let chunk = 123_457;
        let starts: Vec<usize> = (0..n).step_by(chunk).collect();
        std::thread::scope(|s| {
            for part in [0, 1] {
                let (w, starts) = (&w, &starts);
                s.spawn(move || {
                    for &from in starts.iter().rev().skip(part).step_by(2) {
                        let vals: Vec<f32> = (from..(from + chunk).min(n)).map(value).collect();
                        w.write_values("w", from, &vals).unwrap();
                    }
                });
            }
        });
        w.write_values("b", 0, &(0..333).map(|i| i as f32).collect::<Vec<_>>())
            .unwrap();
        w.commit().unwrap();
        let c = Checkpoint::open(&out).unwrap();
        let got = c.read_f32(&c.tensors["w"]).unwrap();
        assert_eq!(got.len(), n);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, value(i), "element {i}");
        }
        assert_eq!(c.read_f32(&c.tensors["b"]).unwrap()[332], 332.0);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary files left"
        );
    }
}

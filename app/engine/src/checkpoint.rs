//! Reading safetensors checkpoints: one file, or a folder of shards with
//! `model.safetensors.index.json`. Headers are parsed and checked up front; tensor data is
//! read on demand through memory maps, so opening a checkpoint costs almost nothing.

use crate::dtype::{DType, decode_f32_vec};
use crate::error::{EngineError, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Largest header mergescope accepts (safetensors itself caps it at 100 MB).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Index of the shard file in [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset of the data in that file.
    pub start: u64,
    /// Length of the data in bytes.
    pub len: u64,
}

impl TensorEntry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One shard file, mapped read-only.
#[derive(Debug)]
pub struct ShardFile {
    /// Path of the file.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// The `__metadata__` of its header.
    pub metadata: BTreeMap<String, String>,
    map: Mmap,
}

/// An opened checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// What the user gave (file or folder).
    pub path: PathBuf,
    /// Shard files (one for a single-file checkpoint).
    pub files: Vec<ShardFile>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorEntry>,
}

fn open_map(path: &Path) -> Result<(Mmap, u64)> {
    let file = File::open(path).map_err(|e| EngineError::io("cannot open", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| EngineError::io("cannot stat", path, e))?
        .len();
    // SAFETY: the map is read-only; mergescope never writes to its inputs, and the docs warn
    // that an input must not be modified by another program during a merge.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::io("cannot memory-map", path, e))?;
    Ok((map, size))
}

/// Parses the header of a safetensors file held in `map`.
fn parse_header(
    path: &Path,
    map: &[u8],
    file_index: usize,
) -> Result<(BTreeMap<String, TensorEntry>, BTreeMap<String, String>)> {
    let size = map.len() as u64;
    if size < 8 {
        return Err(EngineError::bad(
            path,
            format!(
                "the file has {size} bytes, fewer than the 8-byte header length; it is truncated or not safetensors"
            ),
        ));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&map[..8]);
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(EngineError::bad(
            path,
            format!(
                "the header claims {header_len} bytes (limit {MAX_HEADER_BYTES}); the file is not safetensors or is corrupt"
            ),
        ));
    }
    if 8 + header_len > size {
        return Err(EngineError::bad(
            path,
            format!("the header claims {header_len} bytes but the file has only {size}; the file is truncated"),
        ));
    }
    let header = &map[8..8 + header_len as usize];
    let json: serde_json::Value = serde_json::from_slice(header).map_err(|e| {
        EngineError::bad(
            path,
            format!("the JSON header is corrupt ({e}); the file is damaged or not safetensors"),
        )
    })?;
    let obj = json
        .as_object()
        .ok_or_else(|| EngineError::bad(path, "the JSON header is not an object; the file is not safetensors"))?;
    let data_start = 8 + header_len;
    let data_len = size - data_start;
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            if let Some(m) = v.as_object() {
                for (k, val) in m {
                    metadata.insert(k.clone(), val.as_str().map_or_else(|| val.to_string(), str::to_owned));
                }
            }
            continue;
        }
        let bad = |what: &str| EngineError::bad(path, format!("tensor '{name}': {what}"));
        let dtype_name = v
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("missing dtype"))?;
        let dtype = DType::parse(dtype_name).ok_or_else(|| {
            bad(&format!(
                "unsupported dtype {dtype_name}; mergescope reads F32, F16, BF16, F64 and copies integer types"
            ))
        })?;
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("missing shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("shape has a non-integer dimension"))?;
        let offs = v
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
            .ok_or_else(|| bad("missing or malformed data_offsets"))?;
        let (s, e) = offs;
        if e < s || e > data_len {
            return Err(bad(&format!(
                "data_offsets [{s}, {e}] lie outside the {data_len} data bytes; the file is truncated or corrupt"
            )));
        }
        let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let expected = numel.and_then(|n| n.checked_mul(dtype.size() as u64));
        if expected != Some(e - s) {
            return Err(bad(&format!(
                "shape {shape:?} of {} needs {} bytes but data_offsets span {}; the header is corrupt",
                dtype.name(),
                expected.map_or_else(|| "too many".to_owned(), |x| x.to_string()),
                e - s
            )));
        }
        tensors.insert(
            name.clone(),
            TensorEntry {
                name: name.clone(),
                dtype,
                shape,
                file: file_index,
                start: data_start + s,
                len: e - s,
            },
        );
    }
    Ok((tensors, metadata))
}

impl Checkpoint {
    /// Opens a `.safetensors` file, a folder with `model.safetensors.index.json`, or a folder
    /// holding exactly one `.safetensors` file.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        if !path.exists() {
            return Err(EngineError::Invalid(format!(
                "'{}' does not exist; check the path (a .safetensors file or a folder of shards)",
                path.display()
            )));
        }
        if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                return Self::open_index(path, &index);
            }
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| EngineError::io("cannot list", path, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            return match files.as_slice() {
                [one] => Self::open_files(path, std::slice::from_ref(one)),
                [] => Err(EngineError::Invalid(format!(
                    "'{}' is a folder without .safetensors files; point at a checkpoint file or a folder of shards",
                    path.display()
                ))),
                _ => Err(EngineError::Invalid(format!(
                    "'{}' holds {} .safetensors files but no model.safetensors.index.json saying how they fit together; \
                     add the index or point at one file",
                    path.display(),
                    files.len()
                ))),
            };
        }
        Self::open_files(path, &[path.to_path_buf()])
    }

    fn open_index(dir: &Path, index: &Path) -> Result<Checkpoint> {
        let text = std::fs::read_to_string(index).map_err(|e| EngineError::io("cannot read", index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::bad(index, format!("the index is not valid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| EngineError::bad(index, "the index has no \"weight_map\" object"))?;
        let mut shard_names: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
        shard_names.sort();
        shard_names.dedup();
        let paths: Vec<PathBuf> = shard_names.iter().map(|n| dir.join(n)).collect();
        let ckpt = Self::open_files(dir, &paths)?;
        for (name, file) in map {
            let file = file.as_str().unwrap_or_default();
            match ckpt.tensors.get(name) {
                None => {
                    return Err(EngineError::bad(
                        index,
                        format!("the index lists tensor '{name}' in '{file}', but that shard has no such tensor"),
                    ));
                }
                Some(t) if ckpt.files[t.file].path.file_name().is_none_or(|f| f != file) => {
                    return Err(EngineError::bad(
                        index,
                        format!(
                            "the index puts tensor '{name}' in '{file}' but it is in '{}'",
                            ckpt.files[t.file].path.display()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(ckpt)
    }

    fn open_files(path: &Path, paths: &[PathBuf]) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for (i, p) in paths.iter().enumerate() {
            let (map, size) = open_map(p)?;
            let (ts, metadata) = parse_header(p, &map, i)?;
            for (name, t) in ts {
                if let Some(prev) = tensors.insert(name.clone(), t) {
                    return Err(EngineError::bad(
                        p,
                        format!("tensor '{name}' also appears in '{}'", paths[prev.file].display()),
                    ));
                }
            }
            files.push(ShardFile {
                path: p.clone(),
                size,
                metadata,
                map,
            });
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            files,
            tensors,
        })
    }

    /// Total size of the shard files in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The header metadata (of the first shard).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.files.first().map(|f| f.metadata.clone()).unwrap_or_default()
    }

    /// Raw bytes of a tensor (a view into the memory map).
    pub fn raw_bytes(&self, t: &TensorEntry) -> &[u8] {
        let map = &self.files[t.file].map;
        &map[t.start as usize..(t.start + t.len) as usize]
    }

    /// Reads elements `[from, from + len)` of a float tensor as f32.
    pub fn read_f32_range(&self, t: &TensorEntry, from: usize, len: usize) -> Vec<f32> {
        let es = t.dtype.size();
        let bytes = self.raw_bytes(t);
        decode_f32_vec(t.dtype, &bytes[from * es..(from + len) * es])
    }

    /// Reads a whole float tensor as f32.
    pub fn read_f32(&self, t: &TensorEntry) -> Vec<f32> {
        self.read_f32_range(t, 0, t.numel())
    }

    /// Tells the OS that the pages of elements `[from, from + n)` of `t` will not be needed
    /// again, so they stop counting towards this process's resident memory.
    pub fn release_range(&self, t: &TensorEntry, from: usize, n: usize) {
        #[cfg(unix)]
        {
            let es = t.dtype.size() as u64;
            let page = 4096u64;
            let start = t.start + from as u64 * es;
            let end = start + n as u64 * es;
            let aligned_start = start.div_ceil(page) * page;
            let aligned_end = end / page * page;
            if aligned_end > aligned_start {
                let map = &self.files[t.file].map;
                // SAFETY: the mapping is read-only and file-backed; dropping its pages only makes
                // a later access read them again from the file.
                let _ignored = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        aligned_start as usize,
                        (aligned_end - aligned_start) as usize,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = (t, from, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn write(path: &Path, bytes: &[u8]) {
        let mut f = File::create(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    fn file_with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn reads_a_small_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.safetensors");
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(
            &p,
            &file_with_header(
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"k":"v"}}"#,
                &data,
            ),
        );
        let c = Checkpoint::open(&p).unwrap();
        let t = &c.tensors["w"];
        assert_eq!(c.read_f32(t), vec![1.0, 2.0, 3.0]);
        assert_eq!(c.metadata()["k"], "v");
        assert_eq!(c.read_f32_range(t, 1, 2), vec![2.0, 3.0]);
    }

    #[test]
    fn rejects_truncated_and_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.safetensors");
        write(&p, b"abc");
        let e = Checkpoint::open(&p).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        write(&p, &file_with_header("{not json", &[]));
        let e = Checkpoint::open(&p).unwrap_err().to_string();
        assert!(e.contains("corrupt"), "{e}");
        let data = [0u8; 8];
        write(
            &p,
            &file_with_header(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#, &data),
        );
        let e = Checkpoint::open(&p).unwrap_err().to_string();
        assert!(e.contains("'w'") && e.contains("truncated"), "{e}");
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        write(&p, &huge);
        let e = Checkpoint::open(&p).unwrap_err().to_string();
        assert!(e.contains("not safetensors"), "{e}");
        let e = Checkpoint::open(&dir.path().join("missing.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}

//! Reading safetensors checkpoints: one file, or a folder of shards with
//! `model.safetensors.index.json`. Headers are parsed and checked up front against the format's
//! rules (as strict as the reference parser: every tensor once, data spans in order, contiguous
//! and covering the data section exactly); tensor data is read on demand with positioned reads,
//! so opening a checkpoint costs almost nothing and an input that another program truncates
//! during a merge is an error naming the file, never a crash.

use crate::dtype::{DType, decode_f32_checked};
use crate::error::{EngineError, Result};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

/// Largest header mergescope accepts (the safetensors crate's own limit).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Largest read that goes through the per-thread scratch buffer of `read_f32_range` (the
/// executor's chunks of 4 Mi elements take at most 16 MiB as 32-bit values).
const MAX_SCRATCH_BYTES: usize = 32 << 20;

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

/// Whether `path` is a PEFT LoRA adapter folder (it has `adapter_config.json`).
pub fn is_lora_adapter(path: &Path) -> bool {
    path.is_dir() && path.join("adapter_config.json").is_file()
}

/// The low-rank update of one weight: W += scale·B·A, or (B·A)ᵀ when `transposed` (GPT-2's
/// Conv1D with fan_in_fan_out, and embeddings). When `b` is a vector, the update of a layer's
/// bias by PEFT's `lora_B.bias` (`lora_bias=True`): bias += scale·b, and `a` is not read.
#[derive(Clone, Debug)]
pub struct LowRank {
    /// A: r × in (r × rows of W when transposed); for a bias update, the same entry as `b`.
    pub a: TensorEntry,
    /// B: out × r (cols of W × r when transposed), or the bias update (out).
    pub b: TensorEntry,
    /// alpha / r (or alpha / √r).
    pub scale: f64,
    /// Whether the update is (B·A)ᵀ.
    pub transposed: bool,
}

impl LowRank {
    /// Adds rows of the update to `values`, which hold elements `[from, from + len)` of the
    /// row-major weight (`cols` columns): `values[e] += s·Σ_k c_k(i)·M[k, j]` for element e at
    /// (i, j), in f64, where M (r × cols) is A, or Bᵀ when transposed, and c(i) is row i of B,
    /// or column i of A. `a` and `b` are the whole factors.
    fn add_to(&self, a: &[f32], b: &[f32], cols: usize, from: usize, values: &mut [f32]) {
        let r = self.a.shape[0];
        let m: Vec<f64> = if self.transposed {
            (0..r * cols).map(|x| f64::from(b[(x % cols) * r + x / cols])).collect()
        } else {
            a.iter().map(|v| f64::from(*v)).collect()
        };
        let rows_a = self.a.shape[1];
        let mut acc = vec![0f64; cols];
        let mut e = from;
        let end = from + values.len();
        while e < end {
            let (i, j0) = (e / cols, e % cols);
            let j1 = cols.min(j0 + (end - e));
            acc[j0..j1].iter_mut().for_each(|x| *x = 0.0);
            for k in 0..r {
                let c = if self.transposed {
                    f64::from(a[k * rows_a + i])
                } else {
                    f64::from(b[i * r + k])
                };
                let row = &m[k * cols..(k + 1) * cols];
                for j in j0..j1 {
                    acc[j] += c * row[j];
                }
            }
            for j in j0..j1 {
                let v = &mut values[e - from + j - j0];
                *v = (f64::from(*v) + self.scale * acc[j]) as f32;
            }
            e += j1 - j0;
        }
    }
}

/// Where one row of a tensor read through a [`RowMap`] comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowFrom {
    /// A row of the stored tensor.
    Stored(usize),
    /// A row of the map's `fill` table.
    Fill(usize),
    /// Zeros.
    Zero,
    /// The map's `pad` row.
    Pad,
}

/// A tensor read with its rows (first axis) rearranged: vocabulary-indexed tensors of a model
/// aligned to another vocabulary (`mergescope-interop`'s tokenizer union). The rows are formed for the range
/// being read, never for the whole tensor.
#[derive(Clone, Debug)]
pub struct RowMap {
    /// The tensor as stored.
    pub stored: TensorEntry,
    /// Where each row of the tensor as read comes from.
    pub rows: Vec<RowFrom>,
    /// Rows given by value (`cols` values each), shared by the models aligned together.
    pub fill: std::sync::Arc<Vec<f32>>,
    /// The padding row (`cols` values; empty when no row is `Pad`).
    pub pad: Vec<f32>,
}

impl RowMap {
    /// Values per row.
    pub fn cols(&self) -> usize {
        let rows = self.stored.shape.first().copied().unwrap_or(1).max(1);
        self.stored.numel() / rows
    }
}

/// One shard file, open for positioned reads.
#[derive(Debug)]
pub struct ShardFile {
    /// Path of the file.
    pub path: PathBuf,
    /// Size in bytes when it was opened.
    pub size: u64,
    /// The `__metadata__` of its header.
    pub metadata: BTreeMap<String, String>,
    file: File,
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
    /// Low-rank updates added to some tensors when they are read (a LoRA adapter applied to a
    /// base, `mergescope-interop`'s LoRA reader); empty for a plain checkpoint.
    deltas: BTreeMap<String, LowRank>,
    /// Tensors read with their rows rearranged ([`RowMap`]); empty for a plain checkpoint.
    row_maps: BTreeMap<String, RowMap>,
    /// Whether the model was saved in shards (for an assembled or adapted checkpoint: whether one
    /// of the models it was made from was); its own `files` may also hold an adapter's file or
    /// several models' files.
    sharded: bool,
}

/// Fails unless `path` is a regular file (following links): a FIFO would block the open
/// forever, and a device or socket is never a checkpoint.
fn require_regular_file(path: &Path, what: &str) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| EngineError::io("cannot open", path, e))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let kind = if meta.is_dir() {
        "a folder"
    } else {
        "not a regular file (a pipe, socket or device)"
    };
    Err(EngineError::input(
        path,
        format!("'{}' is {kind}; {what}", path.display()),
    ))
}

fn open_file(path: &Path) -> Result<(File, u64)> {
    require_regular_file(path, "give a .safetensors file or a folder of shards")?;
    let file = File::open(path).map_err(|e| EngineError::io("cannot open", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| EngineError::io("cannot stat", path, e))?
        .len();
    Ok((file, size))
}

/// Reads exactly `buf.len()` bytes at `offset`.
#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.read_exact_at(buf, offset)
}

/// Reads exactly `buf.len()` bytes at `offset`.
#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt as _;
    while !buf.is_empty() {
        match file.seek_read(buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// A tensor's description as the header gives it.
#[derive(serde::Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// A parsed header: its tensors in file order (duplicates kept, so they can be refused) and
/// its metadata. Parsed entry by entry, so memory stays proportional to the header's size.
#[derive(Default)]
struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: BTreeMap<String, String>,
    duplicate: Option<String>,
}

impl<'de> serde::Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = RawHeader;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of tensor descriptions")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
                let mut h = RawHeader::default();
                let mut seen_metadata = false;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if seen_metadata {
                            h.duplicate.get_or_insert(key);
                        }
                        seen_metadata = true;
                        let m: BTreeMap<String, serde_json::Value> = map.next_value()?;
                        for (k, v) in m {
                            let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                            h.metadata.insert(k, text);
                        }
                    } else {
                        let t: RawTensor = map
                            .next_value()
                            .map_err(|e| de::Error::custom(format!("tensor '{key}': {e}")))?;
                        h.tensors.push((key, t));
                    }
                }
                Ok(h)
            }
        }
        d.deserialize_map(HeaderVisitor)
    }
}

/// Parses and checks the header of the safetensors file `file` of `size` bytes.
fn parse_header(
    path: &Path,
    file: &File,
    size: u64,
    file_index: usize,
) -> Result<(BTreeMap<String, TensorEntry>, BTreeMap<String, String>)> {
    if size < 8 {
        return Err(EngineError::bad(
            path,
            format!(
                "the file has {size} bytes, fewer than the 8-byte header length; it is truncated or not safetensors"
            ),
        ));
    }
    let mut len_bytes = [0u8; 8];
    read_exact_at(file, &mut len_bytes, 0).map_err(|e| EngineError::io("cannot read", path, e))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(EngineError::bad(
            path,
            format!(
                "the header claims {header_len} bytes (limit {MAX_HEADER_BYTES}); the file is not safetensors or is corrupt"
            ),
        ));
    }
    if header_len == 0 {
        return Err(EngineError::bad(
            path,
            "the header length is 0, but a safetensors file starts with the length of its JSON header; the file is not safetensors or is corrupt",
        ));
    }
    if 8 + header_len > size {
        return Err(EngineError::bad(
            path,
            format!("the header claims {header_len} bytes but the file has only {size}; the file is truncated"),
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    read_exact_at(file, &mut header, 8).map_err(|e| EngineError::io("cannot read", path, e))?;
    if let Err(e) = std::str::from_utf8(&header) {
        return Err(EngineError::bad(
            path,
            format!(
                "the header is not UTF-8 text (invalid byte at offset {}); the file is not safetensors or is corrupt",
                8 + e.valid_up_to()
            ),
        ));
    }
    let raw: RawHeader = serde_json::from_slice(&header).map_err(|e| {
        EngineError::bad(
            path,
            format!("the JSON header is corrupt ({e}); the file is damaged or not safetensors"),
        )
    })?;
    drop(header);
    if let Some(name) = raw.duplicate {
        return Err(EngineError::bad(
            path,
            format!("'{name}' appears twice in the header; the file is corrupt (each key appears once)"),
        ));
    }
    let data_start = 8 + header_len;
    let data_len = size - data_start;
    let mut tensors = BTreeMap::new();
    for (name, v) in raw.tensors {
        let bad = |what: &str| EngineError::bad(path, format!("tensor '{name}': {what}"));
        let dtype = DType::parse(&v.dtype).ok_or_else(|| {
            bad(&format!(
                "unsupported dtype {}; mergescope reads F32, F16, BF16, F64 and copies integer types",
                v.dtype
            ))
        })?;
        let [s, e] = v.data_offsets;
        if e < s || e > data_len {
            return Err(bad(&format!(
                "data_offsets [{s}, {e}] lie outside the {data_len} data bytes; the file is truncated or corrupt"
            )));
        }
        let shape: Vec<usize> = v
            .shape
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<_>>()
            .ok_or_else(|| bad("a dimension of its shape is too large for this machine"))?;
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
        let entry = TensorEntry {
            name: name.clone(),
            dtype,
            shape,
            file: file_index,
            start: data_start + s,
            len: e - s,
        };
        if tensors.insert(name.clone(), entry).is_some() {
            return Err(bad(
                "it appears twice in the header; the file is corrupt (each tensor is named once)",
            ));
        }
    }
    check_layout(path, &tensors, data_start, data_len)?;
    Ok((tensors, raw.metadata))
}

/// The format's layout rule: the tensors' data spans, in order, tile the data section exactly
/// (no overlap, no hole, no trailing bytes), as the reference parser requires.
fn check_layout(path: &Path, tensors: &BTreeMap<String, TensorEntry>, data_start: u64, data_len: u64) -> Result<()> {
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .values()
        .map(|t| (t.start - data_start, t.start - data_start + t.len, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    let mut end = 0u64;
    for &(s, e, name) in &spans {
        if s < end {
            return Err(EngineError::bad(
                path,
                format!(
                    "tensor '{name}': data_offsets [{s}, {e}] overlap another tensor's data (which ends at {end}); the header is corrupt"
                ),
            ));
        }
        if s > end {
            return Err(EngineError::bad(
                path,
                format!(
                    "tensor '{name}': data_offsets [{s}, {e}] leave {} bytes unused before them; the header is corrupt",
                    s - end
                ),
            ));
        }
        end = e;
    }
    if end != data_len {
        return Err(EngineError::bad(
            path,
            format!(
                "{} bytes follow the last tensor's data; the file is corrupt or something was appended to it",
                data_len - end
            ),
        ));
    }
    Ok(())
}

/// A shard index's `weight_map`, entries in file order with duplicates kept.
#[derive(Default)]
struct WeightMap(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for WeightMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = WeightMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object from tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<WeightMap, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    v.push(entry);
                }
                Ok(WeightMap(v))
            }
        }
        d.deserialize_map(MapVisitor)
    }
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: WeightMap,
}

/// Whether `name` is a plain file name (no folder part, no `..`, not absolute), as shard
/// names in an index must be: an index never makes mergescope read outside its folder.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None)) && !name.contains(['/', '\\'])
}

/// The `weight_map` of the shard index `index` (tensor name, shard file name), in file order
/// with duplicates kept, unchecked beyond being a bounded JSON file of that shape.
pub fn read_weight_map(index: &Path) -> Result<Vec<(String, String)>> {
    let size = require_regular_file(index, "a shard index must be a JSON file")?;
    if size > MAX_HEADER_BYTES {
        return Err(EngineError::bad(
            index,
            format!("the index has {size} bytes (limit {MAX_HEADER_BYTES}); it is not a shard index"),
        ));
    }
    let text = std::fs::read(index).map_err(|e| EngineError::io("cannot read", index, e))?;
    let parsed: ShardIndex = serde_json::from_slice(&text).map_err(|e| {
        EngineError::bad(
            index,
            format!("the index is not a shard index ({e}); it needs a \"weight_map\" object from tensor names to shard files"),
        )
    })?;
    Ok(parsed.weight_map.0)
}

impl Checkpoint {
    /// Opens a `.safetensors` file, a folder with `model.safetensors.index.json`, or a folder
    /// holding exactly one `.safetensors` file.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(EngineError::input(
                    path,
                    format!(
                        "'{}' does not exist; check the path (a .safetensors file or a folder of shards)",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(EngineError::io("cannot open", path, e)),
        };
        if meta.is_dir() {
            if is_lora_adapter(path) {
                return Err(EngineError::input(
                    path,
                    format!(
                        "'{}' is a LoRA adapter (adapter_config.json), not a whole model; give it as an expert with the \
                     model it was trained on as --base, which it is applied to",
                        path.display()
                    ),
                ));
            }
            let index = path.join("model.safetensors.index.json");
            if index.exists() {
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
                [] => Err(EngineError::input(
                    path,
                    format!(
                        "'{}' is a folder without .safetensors files; point at a checkpoint file or a folder of shards",
                        path.display()
                    ),
                )),
                _ => Err(EngineError::input(
                    path,
                    format!(
                        "'{}' holds {} .safetensors files but no model.safetensors.index.json saying how they fit together; \
                     add the index or point at one file",
                        path.display(),
                        files.len()
                    ),
                )),
            };
        }
        Self::open_files(path, &[path.to_path_buf()])
    }

    fn open_index(dir: &Path, index: &Path) -> Result<Checkpoint> {
        let map = read_weight_map(index)?;
        let mut listed: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, file) in &map {
            if !is_plain_file_name(file) {
                return Err(EngineError::bad(
                    index,
                    format!(
                        "the index puts tensor '{name}' in '{file}', which is not a file of this folder; \
                         shard names must be plain file names (no folders, '..' or absolute paths)"
                    ),
                ));
            }
            if let Some(first) = listed.insert(name, file) {
                return Err(EngineError::bad(
                    index,
                    format!(
                        "the index lists tensor '{name}' twice (in '{first}' and '{file}'); each tensor is listed once"
                    ),
                ));
            }
        }
        let mut shard_names: Vec<&str> = listed.values().copied().collect();
        shard_names.sort_unstable();
        shard_names.dedup();
        let paths: Vec<PathBuf> = shard_names.iter().map(|n| dir.join(n)).collect();
        for p in &paths {
            if !p.exists() {
                return Err(EngineError::bad(
                    index,
                    format!(
                        "the index names shard '{}', which is missing from the folder; copy the missing shard or fix the index",
                        p.display()
                    ),
                ));
            }
        }
        let ckpt = Self::open_files(dir, &paths)?;
        for (name, file) in listed {
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
            let (file, size) = open_file(p)?;
            let (ts, metadata) = parse_header(p, &file, size, i)?;
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
                file,
            });
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            sharded: files.len() > 1,
            files,
            tensors,
            deltas: BTreeMap::new(),
            row_maps: BTreeMap::new(),
        })
    }

    /// A checkpoint of tensors taken from other checkpoints under new names: each part is a
    /// source and its (new name, name in the source) pairs. The sources' files are moved in, not
    /// reopened; `path` is what the result is called in messages and records.
    pub fn assemble(path: PathBuf, parts: Vec<(Checkpoint, Vec<(String, String)>)>) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        let mut deltas = BTreeMap::new();
        let mut sharded = false;
        for (source, names) in parts {
            sharded |= source.sharded;
            let offset = files.len();
            let moved = |e: &TensorEntry| TensorEntry {
                file: e.file + offset,
                ..e.clone()
            };
            for (new_name, old_name) in names {
                if let Some(d) = source.deltas.get(&old_name) {
                    deltas.insert(
                        new_name.clone(),
                        LowRank {
                            a: moved(&d.a),
                            b: moved(&d.b),
                            ..d.clone()
                        },
                    );
                }
                let entry = source
                    .tensors
                    .get(&old_name)
                    .ok_or_else(|| EngineError::bad(&source.path, format!("has no tensor '{old_name}'")))?;
                let entry = TensorEntry {
                    name: new_name.clone(),
                    file: entry.file + offset,
                    ..entry.clone()
                };
                if tensors.insert(new_name.clone(), entry).is_some() {
                    return Err(EngineError::Invalid(format!(
                        "'{}': two sources give tensor '{new_name}'",
                        path.display()
                    )));
                }
            }
            files.extend(source.files);
        }
        Ok(Checkpoint::with_deltas(path, files, tensors, deltas, sharded))
    }

    /// A checkpoint whose tensors named in `deltas` get their low-rank update when read.
    pub fn with_deltas(
        path: PathBuf,
        files: Vec<ShardFile>,
        tensors: BTreeMap<String, TensorEntry>,
        deltas: BTreeMap<String, LowRank>,
        sharded: bool,
    ) -> Checkpoint {
        Checkpoint {
            path,
            files,
            tensors,
            deltas,
            row_maps: BTreeMap::new(),
            sharded,
        }
    }

    /// Makes tensor `name` read through `map` (its shape becomes the map's row count times the
    /// stored row shape); the stored tensor must be `map.stored`.
    pub fn map_rows(&mut self, name: &str, map: RowMap) -> Result<()> {
        let Some(entry) = self.tensors.get_mut(name) else {
            return Err(EngineError::bad(&self.path, format!("has no tensor '{name}'")));
        };
        let cols = map.cols();
        let mut shape = map.stored.shape.clone();
        match shape.first_mut() {
            Some(first) => *first = map.rows.len(),
            None => shape.push(map.rows.len()),
        }
        entry.shape = shape;
        entry.len = (map.rows.len() * cols * entry.dtype.size()) as u64;
        self.row_maps.insert(name.to_owned(), map);
        Ok(())
    }

    /// Whether tensor `name` is read with its rows rearranged.
    pub fn has_row_map(&self, name: &str) -> bool {
        self.row_maps.contains_key(name)
    }

    /// Elements `[from, from + len)` of a tensor read through `map` (whose `stored` tensor is one
    /// of this checkpoint's): runs of consecutive stored
    /// rows are read at once.
    pub fn read_mapped(&self, map: &RowMap, from: usize, len: usize) -> Result<Vec<f32>> {
        let cols = map.cols().max(1);
        let mut out = Vec::with_capacity(len);
        let end = from + len;
        let mut row = from / cols;
        while out.len() < len {
            let row_start = row * cols;
            let lo = from.max(row_start);
            match map.rows.get(row).copied() {
                Some(RowFrom::Stored(s)) => {
                    // Extend the run while the stored rows follow on.
                    let mut last = row;
                    while (last + 1) * cols < end
                        && map.rows.get(last + 1) == Some(&RowFrom::Stored(s + last + 1 - row))
                    {
                        last += 1;
                    }
                    let hi = end.min((last + 1) * cols);
                    let (values, _) = self.read_unmapped_range(&map.stored, s * cols + (lo - row_start), hi - lo)?;
                    out.extend_from_slice(&values);
                    row = last + 1;
                    continue;
                }
                Some(RowFrom::Fill(k)) => {
                    let hi = end.min(row_start + cols);
                    let src = map
                        .fill
                        .get(k * cols + (lo - row_start)..k * cols + (hi - row_start))
                        .ok_or_else(|| {
                            EngineError::Invalid(format!("tensor '{}': fill row {k} out of range", map.stored.name))
                        })?;
                    out.extend_from_slice(src);
                }
                Some(RowFrom::Pad) if map.pad.len() == cols => {
                    let hi = end.min(row_start + cols);
                    out.extend_from_slice(&map.pad[lo - row_start..hi - row_start]);
                }
                Some(RowFrom::Zero | RowFrom::Pad) => {
                    let hi = end.min(row_start + cols);
                    out.resize(out.len() + (hi - lo), 0.0);
                }
                None => {
                    return Err(EngineError::Invalid(format!(
                        "tensor '{}': read past its {} rows",
                        map.stored.name,
                        map.rows.len()
                    )));
                }
            }
            row += 1;
        }
        Ok(out)
    }

    /// Whether the model was saved in shards (see the field); a merge's output is sharded like
    /// its reference input by default.
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// Total size of the shard files in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The header metadata (of the first shard).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.files.first().map(|f| f.metadata.clone()).unwrap_or_default()
    }

    /// Fills `buf` from byte `offset` of tensor `t`'s data. A file that became shorter since it
    /// was opened (another program rewriting an input) is an error naming it.
    fn read_into(&self, t: &TensorEntry, offset: u64, buf: &mut [u8]) -> Result<()> {
        let shard = &self.files[t.file];
        let at = t.start + offset;
        read_exact_at(&shard.file, buf, at).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.shrunk(t, at + buf.len() as u64)
            } else {
                EngineError::io("cannot read", &shard.path, e)
            }
        })
    }

    /// The error for an input that no longer holds byte `end` of tensor `t` (another program
    /// rewrote it after it was opened).
    fn shrunk(&self, t: &TensorEntry, end: u64) -> EngineError {
        let shard = &self.files[t.file];
        let now =
            std::fs::metadata(&shard.path).map_or_else(|_| "is gone".to_owned(), |m| format!("has {} bytes", m.len()));
        EngineError::input(
            &shard.path,
            format!(
                "'{}' changed while mergescope was reading it: tensor '{}' needs bytes up to {end} but the file now {now} \
             (it had {} when opened); another program is writing this input: wait until it has finished and run again",
                shard.path.display(),
                t.name,
                shard.size
            ),
        )
    }

    /// Decodes `n` bytes at byte `offset` of tensor `t`'s data to f32 straight from a memory map
    /// of the file (no copy into a buffer first); `None` where mapping is not available. An input
    /// that has shrunk since it was opened is an error here, before anything is mapped.
    fn decode_mapped(&self, t: &TensorEntry, offset: u64, n: usize) -> Result<Option<(Vec<f32>, bool)>> {
        let shard = &self.files[t.file];
        let at = t.start + offset;
        // A held range's file was checked when the hold began ([`Checkpoint::hold`]); any
        // other is checked before it is mapped (one `statx` per chunk and input otherwise).
        if !crate::mapped_read::is_held(&shard.file, at, n) {
            self.check_size(t, at + n as u64)?;
        }
        Ok(crate::mapped_read::with_mapped(&shard.file, at, n, |bytes| {
            decode_f32_checked(t.dtype, bytes)
        }))
    }

    /// Keeps elements `[from, from + len)` of tensor `name`'s stored bytes mapped on this thread
    /// until the guard drops, where its reads decode them from a map (bf16 and f16, without a
    /// low-rank update or a row map), so reading them again neither maps nor faults again;
    /// `None` otherwise (and for a range past the tensor's end).
    pub fn hold(&self, name: &str, from: usize, len: usize) -> Option<crate::mapped_read::HoldGuard> {
        if !self.holdable(name) {
            return None;
        }
        let t = self.tensors.get(name)?;
        let size = t.dtype.size() as u64;
        let (at, bytes) = (t.start + from as u64 * size, len as u64 * size);
        if at + bytes > t.start + t.len {
            return None;
        }
        // A file cut shorter is not held: its reads then fail with the message of
        // `check_size` instead of a SIGBUS.
        self.check_size(t, at + bytes).ok()?;
        let shard = &self.files[t.file];
        crate::mapped_read::hold(&shard.file, at, usize::try_from(bytes).ok()?)
    }

    /// An error naming the tensor where the file that stores `t` now ends before byte `end`.
    fn check_size(&self, t: &TensorEntry, end: u64) -> Result<()> {
        let shard = &self.files[t.file];
        let now = shard
            .file
            .metadata()
            .map_err(|e| EngineError::io("cannot read", &shard.path, e))?
            .len();
        if now < end {
            return Err(self.shrunk(t, end));
        }
        Ok(())
    }

    /// Whether [`Checkpoint::hold`] can keep tensor `name` mapped: it is stored in bf16 or f16
    /// (decoded from a map), without a low-rank update or a row map.
    pub fn holdable(&self, name: &str) -> bool {
        self.tensors.get(name).is_some_and(|t| {
            t.dtype != DType::F32 && !self.deltas.contains_key(name) && !self.row_maps.contains_key(name)
        })
    }

    /// Raw bytes of a tensor, as stored (with its low-rank update, if it has one, encoded in
    /// its dtype).
    pub fn raw_bytes(&self, t: &TensorEntry) -> Result<Vec<u8>> {
        if self.deltas.contains_key(&t.name) || self.row_maps.contains_key(&t.name) {
            let mut out = Vec::with_capacity(t.len as usize);
            crate::dtype::encode_f32(t.dtype, &self.read_f32(t)?, &mut out);
            return Ok(out);
        }
        let mut buf = vec![0u8; t.len as usize];
        self.read_into(t, 0, &mut buf)?;
        Ok(buf)
    }

    /// Reads elements `[from, from + len)` of a float tensor as f32 (with its low-rank update,
    /// if it has one, and its rows rearranged, if it has a [`RowMap`]).
    pub fn read_f32_range(&self, t: &TensorEntry, from: usize, len: usize) -> Result<Vec<f32>> {
        Ok(self.read_f32_range_checked(t, from, len)?.0)
    }

    /// [`Checkpoint::read_f32_range`], and whether the read found every value finite while
    /// decoding (bf16 stored values without an update); `false` means "not checked" or "not
    /// finite", so a caller that must refuse NaN and Inf checks those values itself.
    pub fn read_f32_range_checked(&self, t: &TensorEntry, from: usize, len: usize) -> Result<(Vec<f32>, bool)> {
        if let Some(map) = self.row_maps.get(&t.name) {
            return Ok((self.read_mapped(map, from, len)?, false));
        }
        self.read_unmapped_range(t, from, len)
    }

    /// Elements of the tensor as stored, with its low-rank update; the flag as in
    /// [`Checkpoint::read_f32_range_checked`].
    fn read_unmapped_range(&self, t: &TensorEntry, from: usize, len: usize) -> Result<(Vec<f32>, bool)> {
        let (mut values, finite) = self.read_stored_f32_range(t, from, len)?;
        let Some(d) = self.deltas.get(&t.name) else {
            return Ok((values, finite));
        };
        if d.b.shape.len() == 1 {
            let (b, _) = self.read_stored_f32_range(&d.b, from, len)?;
            for (v, x) in values.iter_mut().zip(b) {
                *v = (f64::from(*v) + d.scale * f64::from(x)) as f32;
            }
            return Ok((values, false));
        }
        let (a, _) = self.read_stored_f32_range(&d.a, 0, d.a.numel())?;
        let (b, _) = self.read_stored_f32_range(&d.b, 0, d.b.numel())?;
        let cols = t.shape.get(1).copied().unwrap_or(1);
        d.add_to(&a, &b, cols, from, &mut values);
        Ok((values, false))
    }

    /// Whether tensor `name` gets a low-rank update when read.
    pub fn has_update(&self, name: &str) -> bool {
        self.deltas.contains_key(name)
    }

    fn read_stored_f32_range(&self, t: &TensorEntry, from: usize, len: usize) -> Result<(Vec<f32>, bool)> {
        let es = t.dtype.size();
        if t.dtype == DType::F32 && cfg!(target_endian = "little") {
            let mut v = vec![0f32; len];
            self.read_into(t, (from * es) as u64, bytemuck::cast_slice_mut(&mut v))?;
            return Ok((v, false));
        }
        let n = len * es;
        if let Some(values) = self.decode_mapped(t, (from * es) as u64, n)? {
            return Ok(values);
        }
        if n > MAX_SCRATCH_BYTES {
            let mut bytes = vec![0u8; n];
            self.read_into(t, (from * es) as u64, &mut bytes)?;
            return Ok(decode_f32_checked(t.dtype, &bytes));
        }
        // Chunk-sized reads go through a per-thread buffer that is zeroed only when it grows (a
        // merge reads the same chunk sizes over and over); larger reads (whole tensors, on
        // threads that live on) get their own buffer, so no thread keeps one tensor's worth.
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with(|scratch| {
            let mut bytes = scratch.borrow_mut();
            if bytes.len() < n {
                bytes.resize(n, 0);
            }
            let bytes = &mut bytes[..n];
            self.read_into(t, (from * es) as u64, bytes)?;
            Ok(decode_f32_checked(t.dtype, bytes))
        })
    }

    /// Reads a whole float tensor as f32.
    pub fn read_f32(&self, t: &TensorEntry) -> Result<Vec<f32>> {
        self.read_f32_range(t, 0, t.numel())
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
        assert_eq!(c.read_f32(t).unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(c.metadata()["k"], "v");
        assert_eq!(c.read_f32_range(t, 1, 2).unwrap(), vec![2.0, 3.0]);
    }

    /// bf16 ranges (decoded from a memory map) read the same values as by position, at every
    /// offset, and a file that shrank since it was opened is an error before anything is mapped.
    #[test]
    fn bf16_ranges_read_the_same_mapped_or_not_and_a_shrunk_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.safetensors");
        let values: Vec<f32> = (0..3000).map(|i| (i as f32 - 1500.0) / 7.0).collect();
        let data: Vec<u8> = values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let header = format!(
            r#"{{"w":{{"dtype":"BF16","shape":[3000],"data_offsets":[0,{}]}}}}"#,
            data.len()
        );
        write(&p, &file_with_header(&header, &data));
        let c = Checkpoint::open(&p).unwrap();
        let t = &c.tensors["w"];
        let want: Vec<f32> = values.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
        for (from, len) in [(0, 3000), (1, 2047), (2047, 3), (2999, 1), (1000, 1000)] {
            assert_eq!(
                c.read_f32_range(t, from, len).unwrap(),
                want[from..from + len],
                "{from}+{len}"
            );
        }
        let size = std::fs::metadata(&p).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(size - 100)
            .unwrap();
        let e = c.read_f32_range(t, 2900, 100).unwrap_err().to_string();
        assert!(e.contains("changed while mergescope was reading it"), "{e}");
        assert_eq!(c.read_f32_range(t, 0, 10).unwrap(), want[..10]);
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

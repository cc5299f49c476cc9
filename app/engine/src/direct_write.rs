//! Output files written around the page cache (Linux's `O_DIRECT`): the disk reads the
//! merged bytes straight from the worker's buffer, where a buffered write first copies them into
//! the page cache (the kernel's copy and page-cache work were a quarter of a task-arithmetic
//! merge's samples, and a buffered file still has to be written back before the rename).
//!
//! Direct writes must start and end on block boundaries and come from block-aligned memory,
//! while the merge writes tensors (and chunks of them) at any byte offset, in any order, from
//! several threads. So each write is laid out in an aligned per-thread staging buffer at its
//! offset within a block; the blocks it covers whole go to the disk at once, and the pieces of
//! the (at most two) blocks at its edges wait in memory until the writes of their neighbours
//! complete the block. Every byte of the file is written exactly once (the header and each
//! tensor's chunks tile it), so every block completes; what is left at [`DirectFile::finish`]
//! (a byte range that was never written) is written with zeros there, as the preallocated file
//! would have held. The last block may run past the end of the file; the file is cut back to
//! its length at the end.
//!
//! Where the file system refuses direct I/O (tmpfs, some network file systems), or with
//! `MERGESCOPE_WRITE=buffered` in the environment, the writer uses positioned buffered writes.

use crate::error::{EngineError, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Alignment of direct writes: offsets, lengths and buffer addresses are multiples of it
/// (4 KiB covers the logical block size of the disks and file systems in use).
const BLOCK: usize = 4096;

/// Outputs smaller than this are written through the page cache (nothing to gain).
pub(crate) const MIN_DIRECT_BYTES: u64 = 16 << 20;

/// A byte buffer whose usable part starts on a [`BLOCK`] boundary, reused between writes.
#[derive(Default)]
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Makes the buffer `len` bytes long (keeping its old bytes where it had room).
    fn resize(&mut self, len: usize) {
        if self.raw.len() < len + BLOCK {
            self.raw = vec![0; (len + BLOCK).next_power_of_two()];
        }
        let addr = self.raw.as_ptr() as usize;
        self.start = (BLOCK - addr % BLOCK) % BLOCK;
        self.len = len;
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

thread_local! {
    /// Each worker's staging buffer: as large as its largest write, allocated once.
    static STAGING: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::default());
}

/// A block that only some writes have reached so far.
struct Partial {
    buf: AlignedBuf,
    filled: usize,
}

/// One output file open for direct writes.
#[derive(Debug)]
pub(crate) struct DirectFile {
    file: File,
    path: PathBuf,
    len: u64,
    partial: Mutex<HashMap<u64, Partial>>,
}

impl std::fmt::Debug for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Partial({} bytes)", self.filled)
    }
}

/// Whether direct writes are allowed (unless `MERGESCOPE_WRITE=buffered`), read once.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MERGESCOPE_WRITE").map_or(true, |v| v != "buffered"))
}

impl DirectFile {
    /// Opens `path` (already created and sized to `len` bytes) for direct writes, or `None`
    /// where they are off, not available on this platform or refused by its file system (a
    /// first aligned write at offset 0 is tried; the header's block is written again later).
    pub(crate) fn open(path: &Path, len: u64) -> Option<DirectFile> {
        if !enabled() || len < MIN_DIRECT_BYTES {
            return None;
        }
        Self::open_any(path, len)
    }

    #[cfg(target_os = "linux")]
    fn open_any(path: &Path, len: u64) -> Option<DirectFile> {
        use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        let mut probe = AlignedBuf::default();
        probe.resize(BLOCK);
        match file.write_at(probe.bytes(), 0) {
            Ok(n) if n == BLOCK => Some(DirectFile {
                file,
                path: path.to_path_buf(),
                len,
                partial: Mutex::new(HashMap::new()),
            }),
            _ => None,
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn open_any(_path: &Path, _len: u64) -> Option<DirectFile> {
        None
    }

    /// Writes `len` bytes at `offset`, which `fill` produces in place (every byte of the slice
    /// it gets). The blocks the range covers whole are on the disk when this returns; the bytes
    /// of its edge blocks are once their blocks are complete.
    pub(crate) fn write_with(&self, offset: u64, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len as u64;
        if end > self.len {
            return Err(EngineError::Bug(format!(
                "'{}': a write of bytes {offset}..{end} past the end of the file ({} bytes)",
                self.path.display(),
                self.len
            )));
        }
        STAGING.with(|cell| {
            let mut staging = cell.borrow_mut();
            let block = BLOCK as u64;
            let lead = (offset % block) as usize;
            staging.resize((lead + len).next_multiple_of(BLOCK));
            fill(&mut staging.bytes_mut()[lead..lead + len]);
            let first = offset / block;
            let last = end.div_ceil(block);
            // The blocks covered whole (counting the file's last block whole when the write
            // reaches the file's end): from the first block that starts at or after `offset`
            // to the last that ends at or before `end`.
            let whole_from = offset.div_ceil(block);
            let whole_to = if end == self.len { last } else { end / block };
            if whole_to > whole_from {
                let at = ((whole_from - first) * block) as usize;
                let n = ((whole_to - whole_from) * block) as usize;
                self.write_blocks(&staging.bytes()[at..at + n], whole_from * block)?;
            }
            for b in (first..last).filter(|b| *b < whole_from || *b >= whole_to.max(whole_from)) {
                let lo = offset.max(b * block);
                let hi = end.min((b + 1) * block);
                let at = (lo - first * block) as usize;
                let piece = &staging.bytes()[at..at + (hi - lo) as usize];
                self.add_partial(b, (lo - b * block) as usize, piece)?;
            }
            Ok(())
        })
    }

    /// Adds `piece` at byte `at` of block `b`; writes the block once all of it has come.
    fn add_partial(&self, b: u64, at: usize, piece: &[u8]) -> Result<()> {
        let block = BLOCK as u64;
        let need = (self.len - b * block).min(block) as usize;
        let complete = {
            let mut map = self.partial.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let p = map.entry(b).or_insert_with(|| {
                let mut buf = AlignedBuf::default();
                buf.resize(BLOCK);
                buf.bytes_mut().fill(0);
                Partial { buf, filled: 0 }
            });
            p.buf.bytes_mut()[at..at + piece.len()].copy_from_slice(piece);
            p.filled += piece.len();
            if p.filled >= need { map.remove(&b) } else { None }
        };
        match complete {
            Some(p) => self.write_blocks(p.buf.bytes(), b * block),
            None => Ok(()),
        }
    }

    /// One positioned write of whole blocks from aligned memory.
    #[cfg(unix)]
    fn write_blocks(&self, bytes: &[u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt as _;
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| EngineError::io("cannot write", &self.path, e))
    }

    #[cfg(not(unix))]
    fn write_blocks(&self, _bytes: &[u8], _offset: u64) -> Result<()> {
        Err(EngineError::Bug("direct writes on a platform without them".to_owned()))
    }

    /// Writes the blocks still incomplete (bytes never written stay zero) and cuts the file
    /// back to its length (its last block may have run past it).
    pub(crate) fn finish(&self) -> Result<()> {
        let left: Vec<(u64, Partial)> = self
            .partial
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .collect();
        for (b, p) in left {
            self.write_blocks(p.buf.bytes(), b * BLOCK as u64)?;
        }
        self.file
            .set_len(self.len)
            .map_err(|e| EngineError::io("cannot size", &self.path, e))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A direct file on a real disk (the crate's folder: /tmp may be a tmpfs without direct
    /// I/O), or `None` where the file system refuses direct writes.
    fn direct_file(dir: &Path, len: u64) -> Option<(PathBuf, DirectFile)> {
        let path = dir.join("out.bin");
        File::create(&path).and_then(|f| f.set_len(len)).ok()?;
        DirectFile::open_any(&path, len).map(|d| (path, d))
    }

    #[test]
    fn writes_at_any_offset_in_any_order_from_threads_give_the_bytes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        // A length that is not a block multiple, and writes cut at odd places.
        let len: u64 = 3 * BLOCK as u64 * 7 + 1234;
        let Some((path, d)) = direct_file(dir.path(), len) else {
            eprintln!("skipped: the file system refuses O_DIRECT");
            return;
        };
        let expected: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut cuts = vec![0u64, 1, 17, 4095, 4096, 4097, 10_000, 20_480, 40_000, 61_000, len];
        cuts.sort_unstable();
        let mut pieces: Vec<(u64, u64)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        pieces.reverse();
        pieces.swap(1, 4);
        std::thread::scope(|s| {
            for half in pieces.chunks(pieces.len().div_ceil(2)) {
                let (d, expected) = (&d, &expected);
                s.spawn(move || {
                    for &(a, b) in half {
                        d.write_with(a, (b - a) as usize, |buf| {
                            buf.copy_from_slice(&expected[a as usize..b as usize])
                        })
                        .unwrap();
                    }
                });
            }
        });
        d.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn bytes_never_written_read_zero_and_writes_past_the_end_are_refused() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let len = 2 * BLOCK as u64 + 10;
        let Some((path, d)) = direct_file(dir.path(), len) else {
            eprintln!("skipped: the file system refuses O_DIRECT");
            return;
        };
        d.write_with(5, 3, |b| b.copy_from_slice(&[1, 2, 3])).unwrap();
        let e = d.write_with(len - 2, 4, |b| b.fill(9)).unwrap_err().to_string();
        assert!(e.contains("past the end"), "{e}");
        d.finish().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len() as u64, len);
        assert_eq!(&got[..9], &[0, 0, 0, 0, 0, 1, 2, 3, 0]);
        assert!(got[9..].iter().all(|&x| x == 0));
    }
}

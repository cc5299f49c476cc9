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
//! The writes themselves happen behind the merge ([`WriteBehind`]): a worker fills a staging
//! buffer and queues it, and a few writer threads hand the queued buffers to the disk, so the
//! workers keep merging while the disk writes (a direct write waits for the disk; done by the
//! workers, it idled a third of the cores' time). At most [`IN_FLIGHT_BYTES`] wait in the queue:
//! when the disk falls further behind, a worker waits for it.
//!
//! Where the file system refuses direct I/O (tmpfs, some network file systems), or with
//! `MERGESCOPE_WRITE=buffered` in the environment, the writer uses positioned buffered writes.

use crate::error::{EngineError, Result};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Alignment of direct writes: offsets, lengths and buffer addresses are multiples of it
/// (4 KiB covers the logical block size of the disks and file systems in use).
const BLOCK: usize = 4096;

/// Outputs smaller than this are written through the page cache (nothing to gain).
pub(crate) const MIN_DIRECT_BYTES: u64 = 16 << 20;

/// Most bytes of staging buffers queued for the disk or being written at once; a worker that
/// would go over waits until the disk has caught up (a write larger than this goes alone).
const IN_FLIGHT_BYTES: usize = 64 << 20;

/// Threads writing queued buffers: eight, so that the disk always has several writes queued
/// (each thread waits on one direct write at a time). On the 2-core VM's virtio disk, a
/// 1.5 GB output's linear merge took 0.67–1.08 s with eight against 0.89–1.82 s with two (five
/// alternating rounds; task arithmetic 0.63–0.93 s against 0.93–2.13 s); the bytes in flight
/// stay capped by [`IN_FLIGHT_BYTES`] either way.
const WRITE_THREADS: usize = 8;

/// Staging buffers kept for reuse once written (a new one is allocated and cleared: 4 % of a
/// task-arithmetic merge's samples when the spares ran short).
const SPARE_BUFFERS: usize = 32;

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

    /// Whether [`AlignedBuf::resize`] to `len` needs no new allocation.
    fn holds(&self, len: usize) -> bool {
        self.raw.len() >= len + BLOCK
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// A block that only some writes have reached so far.
struct Partial {
    buf: AlignedBuf,
    filled: usize,
}

impl std::fmt::Debug for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Partial({} bytes)", self.filled)
    }
}

/// An output file open with `O_DIRECT`, as the writer threads use it.
#[derive(Debug)]
struct Target {
    file: File,
    path: PathBuf,
}

impl Target {
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
}

/// One queued write: `buf.bytes()[at..at + len]` (whole blocks) to byte `offset` of `target`;
/// `reserved` bytes of [`IN_FLIGHT_BYTES`] are freed when it is done.
struct Job {
    target: Arc<Target>,
    buf: AlignedBuf,
    at: usize,
    len: usize,
    offset: u64,
    reserved: usize,
}

impl Job {
    fn run(&self) -> Result<()> {
        self.target
            .write_blocks(&self.buf.bytes()[self.at..self.at + self.len], self.offset)
    }
}

/// What the writer threads and the workers share.
#[derive(Default)]
struct Flight {
    /// Bytes reserved by queued or running writes.
    bytes: usize,
    /// Writes queued or running.
    jobs: usize,
    /// Written buffers, for reuse.
    spare: Vec<AlignedBuf>,
    /// The first write that failed, until a worker or [`WriteBehind::flush`] reports it.
    error: Option<EngineError>,
    /// Whether a write has failed (reported or not).
    failed: bool,
}

impl Flight {
    /// The first failure (once), then a note that a write failed.
    fn failure(&mut self) -> Option<EngineError> {
        if let Some(e) = self.error.take() {
            return Some(e);
        }
        self.failed.then(|| {
            EngineError::Invalid("an earlier write of the output failed (see the first error); nothing was kept".into())
        })
    }

    /// Frees the `reserved` bytes of a write and keeps its buffer for reuse when it is a
    /// staging buffer (`reserved > 0`), not a completed edge block's: those are one block each
    /// and would fill the spares with buffers too small for a chunk.
    fn release(&mut self, buf: AlignedBuf, reserved: usize) {
        self.bytes = self.bytes.saturating_sub(reserved);
        if reserved > 0 && self.spare.len() < SPARE_BUFFERS {
            self.spare.push(buf);
        }
    }

    /// Marks `job` done, recording its failure.
    fn complete(&mut self, job: Job, result: Result<()>) {
        self.jobs = self.jobs.saturating_sub(1);
        if let Err(e) = result {
            self.failed = true;
            self.error.get_or_insert(e);
        }
        self.release(job.buf, job.reserved);
    }
}

type Shared = Arc<(Mutex<Flight>, Condvar)>;

fn lock(shared: &Shared) -> MutexGuard<'_, Flight> {
    shared.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `job` and marks it done, waking the workers and `flush` that wait for room or for the
/// queue to empty.
fn run_job(shared: &Shared, job: Job) {
    let result = job.run();
    lock(shared).complete(job, result);
    shared.1.notify_all();
}

/// Direct writes done behind the merge by [`WRITE_THREADS`] threads, for every direct file of
/// one output (see the module's documentation).
pub(crate) struct WriteBehind {
    /// Most bytes in flight ([`IN_FLIGHT_BYTES`]; smaller in tests).
    limit: usize,
    queue: Option<crossbeam_channel::Sender<Job>>,
    shared: Shared,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteBehind({} threads)", self.threads.len())
    }
}

impl WriteBehind {
    /// Starts the writer threads; `None` where no thread could be started.
    fn start() -> Option<Arc<WriteBehind>> {
        Self::start_with(IN_FLIGHT_BYTES)
    }

    /// [`WriteBehind::start`] with at most `limit` bytes in flight.
    fn start_with(limit: usize) -> Option<Arc<WriteBehind>> {
        let (queue, jobs) = crossbeam_channel::unbounded::<Job>();
        let shared: Shared = Arc::default();
        let threads: Vec<JoinHandle<()>> = (0..WRITE_THREADS)
            .filter_map(|i| {
                let (jobs, shared) = (jobs.clone(), Arc::clone(&shared));
                std::thread::Builder::new()
                    .name(format!("mergescope-write-{i}"))
                    .spawn(move || jobs.into_iter().for_each(|job| run_job(&shared, job)))
                    .ok()
            })
            .collect();
        (!threads.is_empty()).then(|| {
            Arc::new(WriteBehind {
                limit,
                queue: Some(queue),
                shared,
                threads,
            })
        })
    }

    /// A staging buffer of `len` bytes, once `len` more bytes fit in flight (or nothing is in
    /// flight); the first write failure instead, where one happened.
    fn reserve(&self, len: usize) -> Result<AlignedBuf> {
        let mut flight = self
            .shared
            .1
            .wait_while(lock(&self.shared), |f| {
                !f.failed && f.bytes != 0 && f.bytes + len > self.limit
            })
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = flight.failure() {
            return Err(e);
        }
        flight.bytes += len;
        let fits = flight.spare.iter().position(|b| b.holds(len));
        let mut buf = fits.map(|i| flight.spare.swap_remove(i)).unwrap_or_default();
        drop(flight);
        buf.resize(len);
        Ok(buf)
    }

    /// Queues `job` for the writer threads (or writes it here, should they be gone).
    fn submit(&self, job: Job) {
        lock(&self.shared).jobs += 1;
        let unsent = match &self.queue {
            Some(queue) => queue.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = unsent {
            run_job(&self.shared, job);
        }
    }

    /// Returns a buffer that `reserve` lent and no write took.
    fn give_back(&self, buf: AlignedBuf, reserved: usize) {
        lock(&self.shared).release(buf, reserved);
        self.shared.1.notify_all();
    }

    /// Waits until every queued write is on the disk; the first failure, where one happened.
    fn flush(&self) -> Result<()> {
        let mut flight = self
            .shared
            .1
            .wait_while(lock(&self.shared), |f| f.jobs > 0)
            .unwrap_or_else(PoisonError::into_inner);
        flight.failure().map_or(Ok(()), Err)
    }
}

impl Drop for WriteBehind {
    /// Closes the queue and waits for the writer threads to finish what is in it.
    fn drop(&mut self) {
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ignored = t.join();
        }
    }
}

/// One output file open for direct writes.
#[derive(Debug)]
pub(crate) struct DirectFile {
    target: Arc<Target>,
    len: u64,
    partial: Mutex<HashMap<u64, Partial>>,
    behind: Arc<WriteBehind>,
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
    /// The files of one output share `behind`'s writer threads (started with the first).
    pub(crate) fn open(path: &Path, len: u64, behind: &mut Option<Arc<WriteBehind>>) -> Option<DirectFile> {
        if !enabled() || len < MIN_DIRECT_BYTES {
            return None;
        }
        Self::open_any(path, len, behind)
    }

    #[cfg(target_os = "linux")]
    fn open_any(path: &Path, len: u64, behind: &mut Option<Arc<WriteBehind>>) -> Option<DirectFile> {
        use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        let mut probe = AlignedBuf::default();
        probe.resize(BLOCK);
        if file.write_at(probe.bytes(), 0).ok()? != BLOCK {
            return None;
        }
        if behind.is_none() {
            *behind = WriteBehind::start();
        }
        Some(DirectFile {
            target: Arc::new(Target {
                file,
                path: path.to_path_buf(),
            }),
            len,
            partial: Mutex::new(HashMap::new()),
            behind: Arc::clone(behind.as_ref()?),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn open_any(_path: &Path, _len: u64, _behind: &mut Option<Arc<WriteBehind>>) -> Option<DirectFile> {
        None
    }

    /// Writes `len` bytes at `offset`, which `fill` produces in place (every byte of the slice
    /// it gets), unless `fill` returns `false` (then nothing is written). The blocks the range
    /// covers whole are queued for the disk when this returns; the bytes of its edge blocks are
    /// queued once their blocks are complete. A write that failed earlier is reported here (or
    /// by [`DirectFile::finish`]).
    pub(crate) fn write_with(&self, offset: u64, len: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len as u64;
        if end > self.len {
            return Err(EngineError::Bug(format!(
                "'{}': a write of bytes {offset}..{end} past the end of the file ({} bytes)",
                self.target.path.display(),
                self.len
            )));
        }
        let block = BLOCK as u64;
        let lead = (offset % block) as usize;
        let reserved = (lead + len).next_multiple_of(BLOCK);
        let mut staging = self.behind.reserve(reserved)?;
        if !fill(&mut staging.bytes_mut()[lead..lead + len]) {
            self.behind.give_back(staging, reserved);
            return Ok(());
        }
        let first = offset / block;
        let last = end.div_ceil(block);
        // The blocks covered whole (counting the file's last block whole when the write
        // reaches the file's end): from the first block that starts at or after `offset`
        // to the last that ends at or before `end`.
        let whole_from = offset.div_ceil(block);
        let whole_to = if end == self.len { last } else { end / block };
        for b in (first..last).filter(|b| *b < whole_from || *b >= whole_to.max(whole_from)) {
            let lo = offset.max(b * block);
            let hi = end.min((b + 1) * block);
            let at = (lo - first * block) as usize;
            let piece = &staging.bytes()[at..at + (hi - lo) as usize];
            self.add_partial(b, (lo - b * block) as usize, piece);
        }
        if whole_to > whole_from {
            self.behind.submit(Job {
                target: Arc::clone(&self.target),
                buf: staging,
                at: ((whole_from - first) * block) as usize,
                len: ((whole_to - whole_from) * block) as usize,
                offset: whole_from * block,
                reserved,
            });
        } else {
            self.behind.give_back(staging, reserved);
        }
        Ok(())
    }

    /// Adds `piece` at byte `at` of block `b`; queues the block once all of it has come.
    fn add_partial(&self, b: u64, at: usize, piece: &[u8]) {
        let block = BLOCK as u64;
        let need = (self.len - b * block).min(block) as usize;
        let complete = {
            let mut map = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
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
        if let Some(p) = complete {
            self.behind.submit(Job {
                target: Arc::clone(&self.target),
                buf: p.buf,
                at: 0,
                len: BLOCK,
                offset: b * block,
                reserved: 0,
            });
        }
    }

    /// Waits for the queued writes, writes the blocks still incomplete (bytes never written
    /// stay zero) and cuts the file back to its length (its last block may have run past it).
    pub(crate) fn finish(&self) -> Result<()> {
        self.behind.flush()?;
        let left: Vec<(u64, Partial)> = self
            .partial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (b, p) in left {
            self.target.write_blocks(p.buf.bytes(), b * BLOCK as u64)?;
        }
        self.target
            .file
            .set_len(self.len)
            .map_err(|e| EngineError::io("cannot size", &self.target.path, e))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A direct file on a real disk (the crate's folder: /tmp may be a tmpfs without direct
    /// I/O), or `None` where the file system refuses direct writes.
    fn direct_file(dir: &Path, len: u64) -> Option<(PathBuf, DirectFile)> {
        direct_file_with(dir, len, &mut None)
    }

    /// Writes byte ranges `[a, b)` of `expected` to `d`, one thread per part, each part in order.
    #[allow(clippy::unwrap_used)]
    fn write_from_threads(d: &DirectFile, parts: &[Vec<(u64, u64)>], expected: &[u8]) {
        std::thread::scope(|s| {
            for part in parts {
                s.spawn(move || {
                    for &(a, b) in part {
                        d.write_with(a, (b - a) as usize, |buf| {
                            buf.copy_from_slice(&expected[a as usize..b as usize]);
                            true
                        })
                        .unwrap();
                    }
                });
            }
        });
    }

    /// [`direct_file`] sharing `behind`'s writer threads (started when `None`).
    fn direct_file_with(dir: &Path, len: u64, behind: &mut Option<Arc<WriteBehind>>) -> Option<(PathBuf, DirectFile)> {
        let path = dir.join("out.bin");
        File::create(&path).and_then(|f| f.set_len(len)).ok()?;
        DirectFile::open_any(&path, len, behind).map(|d| (path, d))
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
        let halves: Vec<Vec<(u64, u64)>> = pieces.chunks(pieces.len().div_ceil(2)).map(<[_]>::to_vec).collect();
        write_from_threads(&d, &halves, &expected);
        d.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn writes_past_a_small_in_flight_limit_wait_for_the_disk_and_give_the_bytes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let len: u64 = 200 * BLOCK as u64 + 77;
        // Two blocks in flight at most: nearly every write waits for earlier ones, and a write
        // larger than the limit goes alone.
        let mut behind = WriteBehind::start_with(2 * BLOCK);
        let Some((path, d)) = direct_file_with(dir.path(), len, &mut behind) else {
            eprintln!("skipped: the file system refuses O_DIRECT");
            return;
        };
        let expected: Vec<u8> = (0..len).map(|i| (i * 13 % 241) as u8).collect();
        // Pieces of 3001 bytes, and one of about six blocks (no cut between blocks 10 and 16).
        let big = 10 * BLOCK as u64..16 * BLOCK as u64;
        let mut cuts: Vec<u64> = (0..len)
            .step_by(3001)
            .filter(|c| !big.contains(c))
            .chain([5 * BLOCK as u64 + 1, len])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let pieces: Vec<(u64, u64)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        // Three threads, each writing its part from the end.
        let parts: Vec<Vec<(u64, u64)>> = pieces
            .chunks(pieces.len().div_ceil(3))
            .map(|part| part.iter().rev().copied().collect())
            .collect();
        write_from_threads(&d, &parts, &expected);
        d.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn a_failed_write_behind_the_merge_is_reported_with_the_file() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let len = 64 * BLOCK as u64;
        let Some((path, good)) = direct_file(dir.path(), len) else {
            eprintln!("skipped: the file system refuses O_DIRECT");
            return;
        };
        // The same file opened read-only: the writer threads' writes fail (EBADF).
        let d = DirectFile {
            target: Arc::new(Target {
                file: File::open(&path).unwrap(),
                path: path.clone(),
            }),
            len,
            partial: Mutex::new(HashMap::new()),
            behind: Arc::clone(&good.behind),
        };
        d.write_with(0, 8 * BLOCK, |b| {
            b.fill(1);
            true
        })
        .unwrap();
        // The failure comes back by the next write (once the queue has run) or by finish, once,
        // naming the file; later calls still fail.
        let first = d
            .write_with(8 * BLOCK as u64, BLOCK, |b| {
                b.fill(2);
                true
            })
            .and_then(|()| d.finish())
            .unwrap_err()
            .to_string();
        assert!(first.contains("cannot write") && first.contains("out.bin"), "{first}");
        let again = d.finish().unwrap_err().to_string();
        assert!(again.contains("an earlier write"), "{again}");
    }

    #[test]
    fn bytes_never_written_or_refused_read_zero_and_writes_past_the_end_are_refused() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let len = 2 * BLOCK as u64 + 10;
        let Some((path, d)) = direct_file(dir.path(), len) else {
            eprintln!("skipped: the file system refuses O_DIRECT");
            return;
        };
        d.write_with(5, 3, |b| {
            b.copy_from_slice(&[1, 2, 3]);
            true
        })
        .unwrap();
        let e = d
            .write_with(len - 2, 4, |b| {
                b.fill(9);
                true
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("past the end"), "{e}");
        // A fill that refuses its bytes writes none of them, whole blocks or edges.
        d.write_with(BLOCK as u64 - 3, BLOCK + 6, |b| {
            b.fill(7);
            false
        })
        .unwrap();
        d.finish().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len() as u64, len);
        assert_eq!(&got[..9], &[0, 0, 0, 0, 0, 1, 2, 3, 0]);
        assert!(got[9..].iter().all(|&x| x == 0));
    }
}

//! Reading a byte range of an input through a short-lived read-only memory map, so that a
//! tensor stored in bf16 or f16 is decoded straight from the page cache: a positioned read
//! would first copy every byte into a buffer (the kernel's copy was 30 % of a TIES merge's
//! samples). The map covers one read range and is unmapped right after, so the process never
//! holds more of its inputs mapped than the chunks in flight (resident-set figures stay those
//! of the merge, not of the input files).
//!
//! `MERGESCOPE_READ=pread` in the environment turns maps off (every range is read by position),
//! for filesystems where maps are slow and for measuring one against the other.
//!
//! A memory map dies with SIGBUS where a file shrinks under it. The caller checks the file's
//! current size before mapping and reports a shrunk input as an error; what is left is a file
//! cut shorter during the microseconds a range is decoded.

//!
//! A caller that reads the same range several times over (a tensor's statistics passes, then
//! its merge) holds it with [`hold`]: the range stays mapped, on this thread, until the returned
//! guard drops, and [`with_mapped`] reads within it from that map.

use std::fs::File;

/// A range of a file mapped by [`hold`] on this thread.
#[cfg(unix)]
struct Held {
    fd: std::os::fd::RawFd,
    at: u64,
    /// The held bytes: `len` of them from `data`, inside `map`.
    data: *const u8,
    len: usize,
    map: (*mut libc::c_void, usize),
}

#[cfg(unix)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Held>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps bytes `[at, at + len)` of `file` mapped on this thread until the guard drops (reads
/// within it then use this map); `None` where mapping is not available.
#[cfg(unix)]
pub fn hold(file: &File, at: u64, len: usize) -> Option<HoldGuard> {
    use std::os::fd::AsRawFd as _;
    let (ptr, map_len, lead) = map(file, at, len)?;
    let fd = file.as_raw_fd();
    HELD.with(|h| {
        h.borrow_mut().push(Held {
            fd,
            at,
            // SAFETY: `lead` < `map_len`: inside the mapping.
            data: unsafe { ptr.cast::<u8>().add(lead) },
            len,
            map: (ptr, map_len),
        });
    });
    Some(HoldGuard { fd, at })
}

/// Unmaps a range held by [`hold`] when dropped.
#[cfg(unix)]
pub struct HoldGuard {
    fd: std::os::fd::RawFd,
    at: u64,
}

#[cfg(unix)]
impl Drop for HoldGuard {
    fn drop(&mut self) {
        let held = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let i = h.iter().rposition(|x| x.fd == self.fd && x.at == self.at)?;
            Some(h.swap_remove(i))
        });
        if let Some(held) = held {
            // SAFETY: exactly the mapping `hold` made; its entry is gone, so no read uses it.
            unsafe {
                libc::munmap(held.map.0, held.map.1);
            }
        }
    }
}

/// Maps bytes `[at, at + len)` of `file` read-only: (mapping, its length, offset of `at` in it).
#[cfg(unix)]
fn map(file: &File, at: u64, len: usize) -> Option<(*mut libc::c_void, usize, usize)> {
    use std::os::fd::AsRawFd as _;
    if len == 0 || !maps_enabled() {
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?.max(1);
    let start = at - at % page;
    let lead = usize::try_from(at - start).ok()?;
    let map_len = lead.checked_add(len)?;
    let offset = libc::off_t::try_from(start).ok()?;
    // SAFETY: a fresh read-only shared mapping of an open file descriptor; its address is the
    // kernel's choice, so it aliases nothing of ours. Failure is MAP_FAILED, checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    Some((ptr, map_len, lead))
}

/// Where [`hold`] keeps bytes `[at, at + len)` of `file` mapped on this thread, the address of
/// byte `at` in that map.
#[cfg(unix)]
fn held_at(file: &File, at: u64, len: usize) -> Option<*const u8> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    HELD.with(|h| {
        h.borrow().iter().find_map(|x| {
            let from = usize::try_from(at.checked_sub(x.at)?).ok()?;
            // SAFETY: `from` + `len` ≤ the held length: inside the mapping.
            (x.fd == fd && len > 0 && from.checked_add(len)? <= x.len).then(|| unsafe { x.data.add(from) })
        })
    })
}

/// Whether [`hold`] keeps bytes `[at, at + len)` of `file` mapped on this thread (so a read of
/// them maps nothing, and the file's size was checked when the hold began).
#[cfg(unix)]
pub fn is_held(file: &File, at: u64, len: usize) -> bool {
    held_at(file, at, len).is_some()
}

/// Calls `f` on bytes `[at, at + len)` of `file` through a memory map (the held one where
/// [`hold`] covers the range on this thread), or returns `None` where mapping is not available
/// (another platform, a zero length, or the kernel refused), for the caller to read by
/// position instead.
#[cfg(unix)]
pub fn with_mapped<R>(file: &File, at: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    if let Some(data) = held_at(file, at, len) {
        // SAFETY: `len` bytes of a held mapping, which stays mapped until its guard drops; the
        // guard lives in a caller's frame on this thread, so not before `f` returns.
        return Some(f(unsafe { std::slice::from_raw_parts(data, len) }));
    }
    let (ptr, map_len, lead) = map(file, at, len)?;
    // SAFETY: the mapping is `map_len` readable bytes starting at `ptr`, alive until the munmap
    // below; the slice does not outlive `f`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>().add(lead), len) };
    let out = f(bytes);
    // SAFETY: `ptr`/`map_len` are exactly the mapping made above, and nothing refers to it now.
    unsafe {
        libc::munmap(ptr, map_len);
    }
    Some(out)
}

/// Whether ranges are mapped (unless `MERGESCOPE_READ=pread`), read once.
#[cfg(unix)]
fn maps_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("MERGESCOPE_READ").map_or(true, |v| v != "pread"))
}

/// Holds a range mapped; this platform has no maps here, so always `None`.
#[cfg(not(unix))]
pub fn hold(_file: &File, _at: u64, _len: usize) -> Option<HoldGuard> {
    None
}

/// A held range (none on this platform).
#[cfg(not(unix))]
pub struct HoldGuard;

/// Whether [`hold`] keeps a range mapped: never, on this platform.
#[cfg(not(unix))]
pub fn is_held(_file: &File, _at: u64, _len: usize) -> bool {
    false
}

/// Calls `f` on bytes `[at, at + len)` of `file` through a memory map; this platform has none
/// here, so always `None` (the caller reads by position).
#[cfg(not(unix))]
pub fn with_mapped<R>(_file: &File, _at: u64, _len: usize, _f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn mapped_ranges_are_the_files_bytes_at_any_alignment() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        tmp.write_all(&data).unwrap();
        let file = tmp.reopen().unwrap();
        for (at, len) in [
            (0usize, 1usize),
            (1, 4095),
            (4095, 2),
            (4096, 4096),
            (123, 19_000),
            (19_999, 1),
        ] {
            let got = with_mapped(&file, at as u64, len, <[u8]>::to_vec);
            if cfg!(unix) {
                assert_eq!(got.as_deref(), Some(&data[at..at + len]), "range {at}+{len}");
            } else {
                assert_eq!(got, None);
            }
        }
        assert_eq!(with_mapped(&file, 5, 0, <[u8]>::to_vec), None);
    }
}

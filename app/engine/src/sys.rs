//! Process-level tuning for long streaming jobs.

/// Keeps freed chunk and tensor buffers (MBs to hundreds of MBs) inside the allocator for reuse
/// instead of returning them to the OS after every chunk; on glibc that return costs a page
/// fault per 4 KiB page on the next allocation, which dominated merge time (docs/performance.md:
/// 1.9 M faults and 15 s of kernel time for a linear merge before, 50 k and 4 s after). Call
/// once at start-up, before threads.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; it is called before worker threads start.
    unsafe {
        // Allocations up to 32 MiB (the largest glibc allows) come from the heap, not mmap.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        // Keep up to 1 GiB of free heap instead of trimming it back after each chunk.
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        // Larger blocks (whole embedding matrices, hundreds of MB) from the heap too: an mmap'd
        // block is unmapped when freed and faulted in again, page by page, for the next tensor.
        libc::mallopt(libc::M_MMAP_MAX, 0);
        // One heap for every thread: worker threads' own arenas are capped at 64 MiB each, so a
        // chunk's buffers spilled into fresh heaps that were unmapped again after every chunk
        // (a merge allocates a few large blocks per chunk; one lock costs nothing measurable).
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Makes candle's CPU kernels single-threaded unless the user set `CANDLE_NUM_THREADS` or
/// `RAYON_NUM_THREADS`: the executor already runs one worker per core, and candle's own
/// thread pool on top of that only adds contention. Call at start-up, before any thread.
pub fn single_threaded_tensor_ops() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // SAFETY: called at the start of `main`, before any other thread exists.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}

/// Restores the default action of SIGPIPE, so that `mergescope inspect … | head` ends quietly
/// when the reader goes away, as other command-line tools do, instead of panicking on a failed
/// write to stdout (Rust ignores SIGPIPE by default). Call once at start-up.
pub fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: resets one signal's disposition to its default; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The number of cores this process may use, found once and remembered: on Linux
/// `std::thread::available_parallelism` reads the cgroup's CPU quota from several files on
/// every call (about 30 system calls), and the executor asks for every chunk it hands to a
/// plugin (docs/performance.md).
pub fn available_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

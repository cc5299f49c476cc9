//! Host extension `mergescope.host.parallel.v1`: lends the plugin the host's worker threads
//! (as many as the merge's `--threads`, see [`CallCtx::with_threads`]) for plain computation on
//! its own data, so no plugin keeps a thread pool of its own.

use crate::plugin::call::with_ctx;
use mergescope_plugin_api::abi::{self, HostParallelV1, ParallelJob, Status};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The extension's static table.
pub(crate) static TABLE: HostParallelV1 = HostParallelV1 {
    struct_size: std::mem::size_of::<HostParallelV1>(),
    threads: h_threads,
    parallel_for: h_parallel_for,
};

unsafe extern "C" fn h_threads(ctx: *mut c_void) -> usize {
    let mut n = 1;
    with_ctx(ctx, |c| {
        n = c.threads();
        Ok(())
    });
    n
}

/// The plugin's job pointer and data, shared by the worker threads. The plugin promises that its
/// job may run on several threads at once (that is what it asked for).
struct Job {
    job: ParallelJob,
    user: *mut c_void,
}

// SAFETY: the plugin hands `user` to `parallel_for` for exactly this: concurrent jobs on it.
unsafe impl Sync for Job {}

/// Runs `job(user, i)` for i in `0..n` on `threads` threads pulling indices from one counter;
/// after the first failure or a cancel, jobs not yet started are skipped. Returns the first
/// failing status, `STATUS_CANCELLED`, or `STATUS_OK`.
fn run_jobs(job: &Job, n: usize, threads: usize, cancel: &AtomicBool) -> Status {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_status = std::sync::Mutex::new(abi::STATUS_OK);
    let work = || {
        loop {
            if failed.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                return;
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            // SAFETY: the plugin's job, with the data it passed for it.
            let status = unsafe { (job.job)(job.user, i) };
            if status != abi::STATUS_OK {
                if !failed.swap(true, Ordering::Relaxed)
                    && let Ok(mut s) = first_status.lock()
                {
                    *s = status;
                }
                return;
            }
        }
    };
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(work);
            }
            work();
        });
    }
    let status = first_status.lock().map_or(abi::STATUS_ERROR, |s| *s);
    if status == abi::STATUS_OK && cancel.load(Ordering::Relaxed) {
        abi::STATUS_CANCELLED
    } else {
        status
    }
}

unsafe extern "C" fn h_parallel_for(ctx: *mut c_void, n: usize, job: ParallelJob, user: *mut c_void) -> Status {
    let mut status = abi::STATUS_OK;
    let outer = with_ctx(ctx, |c| {
        status = run_jobs(&Job { job, user }, n, c.threads(), c.cancel_flag());
        Ok(())
    });
    // A failing job's plugin keeps its own message; the host adds none.
    if outer == abi::STATUS_OK { status } else { outer }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    unsafe extern "C" fn add_index(user: *mut c_void, i: usize) -> Status {
        // SAFETY: the tests pass an AtomicU64.
        let sum = unsafe { &*user.cast::<AtomicU64>() };
        sum.fetch_add(i as u64 + 1, Ordering::Relaxed);
        abi::STATUS_OK
    }

    unsafe extern "C" fn fail_at_three(_user: *mut c_void, i: usize) -> Status {
        if i == 3 { abi::STATUS_ERROR } else { abi::STATUS_OK }
    }

    #[test]
    fn every_index_runs_once_on_any_thread_count() {
        for threads in [1, 2, 3, 8] {
            let sum = AtomicU64::new(0);
            let job = Job {
                job: add_index,
                user: std::ptr::from_ref(&sum).cast_mut().cast(),
            };
            let status = run_jobs(&job, 1000, threads, &AtomicBool::new(false));
            assert_eq!(status, abi::STATUS_OK);
            // Σ_{i=1}^{1000} i = 500500: each index exactly once.
            assert_eq!(sum.load(Ordering::Relaxed), 500_500, "{threads} threads");
        }
    }

    #[test]
    fn a_failing_job_and_a_cancel_are_reported() {
        let job = Job {
            job: fail_at_three,
            user: std::ptr::null_mut(),
        };
        assert_eq!(run_jobs(&job, 10, 2, &AtomicBool::new(false)), abi::STATUS_ERROR);
        let sum = AtomicU64::new(0);
        let job = Job {
            job: add_index,
            user: std::ptr::from_ref(&sum).cast_mut().cast(),
        };
        assert_eq!(run_jobs(&job, 10, 2, &AtomicBool::new(true)), abi::STATUS_CANCELLED);
        assert_eq!(sum.load(Ordering::Relaxed), 0, "a cancelled run starts no job");
    }
}

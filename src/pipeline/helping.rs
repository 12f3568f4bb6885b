//! Jobs run in parallel on the blocking pool by a caller that is itself
//! one of the pool's threads (a stream's worker), without ever waiting
//! for a job no thread has started.
//!
//! A caller that hands its jobs to the pool and waits for them can wait
//! forever once every pool thread is such a caller (a thousand streams
//! reopening blocks at once). Here the caller runs, on its own thread,
//! every job the pool has not taken by the time it gets to it, and then
//! waits only for those a pool thread is already running.

use crate::sync::{Arc, Mutex, lock};

/// One job, taken by whichever thread gets to it first.
type Slot<T> = Arc<Mutex<Option<Box<dyn FnOnce() -> T + Send>>>>;

/// Runs `jobs`, as many at once as the pool lends threads for; returns
/// each job's result with its index. A job that panicked on a pool
/// thread has no result (the caller treats it as failed); one that
/// panics on the caller's thread panics the caller, as it would have run
/// there anyway.
pub(crate) fn run_all<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    jobs: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<(usize, T)> {
    run_all_beside(rt, jobs, || ()).1
}

/// [`run_all`], with `here` run on the caller's thread first, while the
/// pool starts on the jobs.
pub(crate) fn run_all_beside<T: Send + 'static, R>(
    rt: &tokio::runtime::Handle,
    jobs: Vec<Box<dyn FnOnce() -> T + Send>>,
    here: impl FnOnce() -> R,
) -> (R, Vec<(usize, T)>) {
    let slots: Vec<Slot<T>> = jobs
        .into_iter()
        .map(|j| Arc::new(Mutex::new(Some(j))))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    // The last one is the caller's from the start.
    for (i, slot) in slots.iter().enumerate().take(slots.len().saturating_sub(1)) {
        let (slot, tx) = (slot.clone(), tx.clone());
        rt.spawn_blocking(move || {
            let job = lock(&slot).take();
            if let Some(job) = job {
                let _ = tx.send((i, job()));
            }
        });
    }
    drop(tx);
    let mine = here();
    let mut out = Vec::with_capacity(slots.len());
    for (i, slot) in slots.iter().enumerate().rev() {
        let job = lock(slot).take();
        if let Some(job) = job {
            out.push((i, job()));
        }
    }
    // Every job left is running on a pool thread, which reports it (or
    // drops its sender by panicking).
    let running = slots.len() - out.len();
    out.extend(rx.iter().take(running));
    out.sort_by_key(|(i, _)| *i);
    (mine, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The caller is the pool's only thread: handed to the pool, its
    /// jobs would never start.
    #[test]
    fn a_caller_that_is_the_pools_only_thread_runs_every_job_itself() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .build()
            .expect("runtime");
        let h = rt.handle().clone();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn_blocking(move || {
            let jobs: Vec<Box<dyn FnOnce() -> usize + Send>> =
                (0..4usize).map(|i| Box::new(move || i * 10) as _).collect();
            let _ = tx.send(run_all(&h, jobs));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the caller waited for jobs no thread could start");
        assert_eq!(got, [(0, 0), (1, 10), (2, 20), (3, 30)]);
    }

    /// With threads to spare, the jobs run at once: each waits until all
    /// four have started.
    #[test]
    fn jobs_run_at_once_where_the_pool_has_threads() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("runtime");
        let all = Arc::new(std::sync::Barrier::new(4));
        let jobs: Vec<Box<dyn FnOnce() -> bool + Send>> = (0..4)
            .map(|_| {
                let all = all.clone();
                Box::new(move || {
                    all.wait();
                    true
                }) as _
            })
            .collect();
        let got = run_all(rt.handle(), jobs);
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|(_, ok)| *ok));
    }
}

//! One `syncfs` at a time per datanode filesystem, shared by every fsync
//! that arrives while one runs (group commit, as the metadata store's WAL
//! syncs are grouped), and a filesystem that reported a writeback error
//! synced file by file from then on.
//!
//! Why both. A `syncfs` error is reported once per descriptor and may be
//! anybody's on that filesystem. Run concurrently, one fsync's `syncfs`
//! could take the error that belongs to another's pages, whose own
//! `syncfs` then succeeds: a dropped sync error. Serialized, each error
//! goes to exactly the fsyncs whose sync it was, and they all fall back to
//! their replicas' own syncs. An error may also belong to pages whose
//! fsync comes later (written back, and failed, in between), so the
//! filesystem stays marked: every later fsync there syncs file by file,
//! where each error is the file's own, until the daemon restarts.
//! Grouping is also what makes concurrent writers' fsyncs cheap: four
//! fsyncs that meet cost one `syncfs`, not four behind each other.

use std::collections::HashMap;

use crate::error::{FsError, FsResult};
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering, lock};

#[derive(Default, Debug)]
struct State {
    /// Syncs started, and the number of the last one that ended.
    started: u64,
    finished: u64,
    running: bool,
    /// Callers waiting for a sync under way.
    waiting: usize,
    /// The first error: the filesystem is synced file by file from then on.
    error: Option<FsError>,
}

/// The group commit of one filesystem's `syncfs`.
#[derive(Default, Debug)]
pub struct FsSync {
    state: Mutex<State>,
    done: Condvar,
    /// `syncfs` calls made, and fsyncs that another's call covered.
    runs: AtomicU64,
    joined: AtomicU64,
}

/// Ends the sync numbered `.1` with `.2` (an error if it panicked) and
/// wakes the waiters.
struct Ending<'a>(&'a FsSync, u64, Option<FsResult<()>>);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.running = false;
        st.finished = self.1;
        let r = self
            .2
            .take()
            .unwrap_or_else(|| Err(FsError::Io("syncfs panicked".into())));
        if let Err(e) = r
            && st.error.is_none()
        {
            st.error = Some(e);
        }
        self.0.done.notify_all();
    }
}

impl FsSync {
    /// Returns once a `syncfs` that started after this call has ended,
    /// running `sync` if no other does so first (`Ok(true)`: another's
    /// covered it); its error, or the filesystem's earlier one, is every
    /// covered caller's (which then syncs its replicas file by file).
    pub fn run(&self, sync: impl FnOnce() -> FsResult<()>) -> FsResult<bool> {
        let mut st = lock(&self.state);
        // A sync under way started before this fsync's request: only the
        // next one covers it.
        let need = st.started + 1;
        loop {
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            if st.finished >= need {
                self.joined.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
            if !st.running {
                break;
            }
            st.waiting += 1;
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting -= 1;
        }
        st.running = true;
        st.started += 1;
        let mut ending = Ending(self, st.started, None);
        drop(st);
        self.runs.fetch_add(1, Ordering::Relaxed);
        let r = sync();
        ending.2 = Some(r.clone());
        drop(ending);
        r.map(|()| false)
    }

    /// Whether a `syncfs` here has failed: fsyncs then skip it.
    pub fn failed(&self) -> bool {
        lock(&self.state).error.is_some()
    }

    /// (`syncfs` calls made, fsyncs covered by another's call).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.runs.load(Ordering::Relaxed),
            self.joined.load(Ordering::Relaxed),
        )
    }
}

/// The group commits of every datanode filesystem, by `Storage::fs_id`.
#[derive(Default, Debug)]
pub struct FsSyncs(Mutex<HashMap<u64, Arc<FsSync>>>);

impl FsSyncs {
    pub fn of(&self, fs_id: u64) -> Arc<FsSync> {
        lock(&self.0).entry(fs_id).or_default().clone()
    }

    /// Totals over every filesystem, as [`FsSync::counts`].
    pub fn counts(&self) -> (u64, u64) {
        lock(&self.0)
            .values()
            .map(|s| s.counts())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicBool;
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// A sync under way on `g` (started before anyone else asks) that
    /// ends with `result` once `release` is set.
    fn under_way(
        g: &Arc<FsSync>,
        result: FsResult<()>,
    ) -> (JoinHandle<FsResult<bool>>, Arc<AtomicBool>) {
        let first_in = Arc::new(Barrier::new(2));
        let release = Arc::new(AtomicBool::new(false));
        let h = {
            let (g, first_in, release) = (g.clone(), first_in.clone(), release.clone());
            std::thread::spawn(move || {
                g.run(|| {
                    first_in.wait();
                    while !release.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    result
                })
            })
        };
        first_in.wait();
        (h, release)
    }

    /// `n` callers of `g`, each counting its own sync in `syncs`; returns
    /// once all of them wait for the sync under way.
    fn waiters(
        g: &Arc<FsSync>,
        n: usize,
        syncs: &Arc<AtomicU64>,
    ) -> Vec<JoinHandle<FsResult<bool>>> {
        let hs = (0..n)
            .map(|_| {
                let (g, syncs) = (g.clone(), syncs.clone());
                std::thread::spawn(move || {
                    g.run(|| {
                        syncs.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(20));
                        Ok(())
                    })
                })
            })
            .collect();
        while lock(&g.state).waiting < n {
            std::thread::sleep(Duration::from_millis(1));
        }
        hs
    }

    #[test]
    fn fsyncs_that_meet_share_one_syncfs_started_after_they_asked() {
        let g = Arc::new(FsSync::default());
        let (h, release) = under_way(&g, Ok(()));
        let syncs = Arc::new(AtomicU64::new(0));
        let ws = waiters(&g, 6, &syncs);
        release.store(true, Ordering::Relaxed);
        assert!(h.join().unwrap().is_ok());
        for w in ws {
            assert!(w.join().unwrap().is_ok());
        }
        // Not covered by the sync that was running when they asked, so
        // one more ran; all six met behind it: one.
        assert_eq!(syncs.load(Ordering::Relaxed), 1);
        assert_eq!(g.counts(), (2, 5));
    }

    #[test]
    fn an_error_goes_to_every_fsync_it_covered_and_marks_the_filesystem() {
        let g = Arc::new(FsSync::default());
        let (h, release) = under_way(&g, Err(FsError::Io("EIO".into())));
        let syncs = Arc::new(AtomicU64::new(0));
        let ws = waiters(&g, 3, &syncs);
        release.store(true, Ordering::Relaxed);
        assert!(h.join().unwrap().is_err());
        // The waiters asked while the failing sync ran: it did not cover
        // them, but its error may be theirs; each gets it, none syncs.
        for w in ws {
            assert!(w.join().unwrap().is_err());
        }
        assert_eq!(syncs.load(Ordering::Relaxed), 0);
        assert!(g.failed());
        // Later fsyncs too, without a syncfs.
        let mut ran = false;
        assert!(
            g.run(|| {
                ran = true;
                Ok(())
            })
            .is_err()
        );
        assert!(!ran);
        assert_eq!(g.counts().0, 1);
    }
}

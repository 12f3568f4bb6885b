//! Group commit of WAL syncs, as a journal groups its commits: fsyncs that
//! arrive while a sync of the WAL is under way wait for it, and the first
//! of them whose commits it did not cover then syncs once for all of
//! them, instead of each running an `fdatasync` of its own behind the
//! other. Concurrent writers' durable commits thus cost one sync per
//! round, however many writers there are.

use crate::error::FsResult;
use crate::sync::{Condvar, Mutex, lock};

#[derive(Default)]
pub(super) struct GroupSync {
    /// A sync is under way.
    running: Mutex<bool>,
    done: Condvar,
}

/// Marks the sync over, even if it panicked, and wakes the waiters.
struct Running<'a>(&'a GroupSync);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *lock(&self.0.running) = false;
        self.0.done.notify_all();
    }
}

impl GroupSync {
    /// Returns once `covered` holds, waiting for the sync under way if
    /// there is one; otherwise runs `sync` (which must make `covered` true
    /// when it succeeds), with no other sync running. A failed sync covers
    /// nobody: each waiter then runs its own and gets its own error.
    pub(super) fn run(
        &self,
        covered: impl Fn() -> bool,
        sync: impl FnOnce() -> FsResult<()>,
    ) -> FsResult<()> {
        let mut running = lock(&self.running);
        loop {
            if covered() {
                return Ok(());
            }
            if !*running {
                break;
            }
            running = self.done.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running = true;
        drop(running);
        let _over = Running(self);
        sync()
    }
}

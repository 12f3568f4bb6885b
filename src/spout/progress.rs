//! Counters of a running spout, readable from another thread (the CLI's
//! progress line) while the run goes on.

use crate::sync::{AtomicU64, Ordering};

/// Live counters; [`Progress::snapshot`] gives a consistent-enough copy.
#[derive(Debug, Default)]
pub struct Progress {
    files_done: AtomicU64,
    files_bad: AtomicU64,
    files_abandoned: AtomicU64,
    takeovers: AtomicU64,
    records: AtomicU64,
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Files consumed to the end and moved to the done directory.
    pub files_done: u64,
    /// Files moved to the bad directory.
    pub files_bad: u64,
    /// Files given up because another instance took their lock over, or
    /// left locked for a later takeover because the spout was stopped.
    pub files_abandoned: u64,
    /// Idle lock files this instance took over.
    pub takeovers: u64,
    /// Records emitted (re-emitted ones after a takeover included).
    pub records: u64,
}

impl Progress {
    pub(crate) fn done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn bad(&self) {
        self.files_bad.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn abandoned(&self) {
        self.files_abandoned.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn took_over(&self) {
        self.takeovers.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn records(&self, n: u64) {
        self.records.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            files_done: self.files_done.load(Ordering::Relaxed),
            files_bad: self.files_bad.load(Ordering::Relaxed),
            files_abandoned: self.files_abandoned.load(Ordering::Relaxed),
            takeovers: self.takeovers.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files done, {} bad, {} taken over, {} abandoned, {} records",
            self.files_done, self.files_bad, self.takeovers, self.files_abandoned, self.records
        )
    }
}

//! [`FileRecord`]: how the filesystem records what a file's output stream
//! did to it (a [`FileOutcome`]), one metadata commit per outcome: the
//! file under construction from its first block on, its blocks, its
//! length, and its close.

use crate::error::{FsError, FsResult};
use crate::lease::LeaseError;
use crate::meta::{BlockRow, Change, JournalRow, Meta, UnderConstruction};
use crate::metrics::Metrics;
use crate::pipeline::{FileLog, FileOutcome};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock};

/// The record of one file written through one stream.
pub(super) struct FileRecord {
    meta: Arc<dyn Meta>,
    /// The file's under-construction entry: its holder, recorded with the
    /// first change to the file.
    uc: UnderConstruction,
    /// The entry is in the store (until the file is recorded closed).
    under_construction: AtomicBool,
    /// Over a shared namespace: every commit is made under the cluster
    /// claim the writer's grant (`uc.epoch`) came from, and `fenced` is
    /// told when the store says that claim is gone.
    claimed: Option<Box<dyn Fn(u64) + Send + Sync>>,
    /// The length and time the last commit recorded, when it was a whole
    /// fsync's (a `Finished` with a time): a close at the same length and
    /// time then has only the end of the file's time under construction
    /// to record, which the store may commit with its next commit
    /// ([`crate::meta::BlockMap::close_lazily`]).
    settled: Mutex<Option<(u64, i64)>>,
    metrics: Arc<Metrics>,
}

impl FileRecord {
    pub(super) fn new(
        meta: Arc<dyn Meta>,
        uc: UnderConstruction,
        metrics: Arc<Metrics>,
    ) -> FileRecord {
        FileRecord {
            meta,
            uc,
            under_construction: AtomicBool::new(false),
            claimed: None,
            settled: Mutex::new(None),
            metrics,
        }
    }

    /// As [`FileRecord::new`], each commit conditional on the writer's
    /// cluster claim (see [`Change::Claimed`]); `fenced(ino)` runs when a
    /// commit finds the claim gone.
    pub(super) fn claimed(
        meta: Arc<dyn Meta>,
        uc: UnderConstruction,
        metrics: Arc<Metrics>,
        fenced: Box<dyn Fn(u64) + Send + Sync>,
    ) -> FileRecord {
        FileRecord {
            claimed: Some(fenced),
            ..FileRecord::new(meta, uc, metrics)
        }
    }

    /// The file's under-construction entry, unless it is recorded.
    fn uc_unless_recorded(&self) -> Option<Change> {
        (!self.under_construction.load(Ordering::Acquire)).then(|| Change::PutUc(self.uc.clone()))
    }

    /// Whether `what` is a close with nothing to record but the end of the
    /// file's time under construction: nothing written, cut or stamped
    /// since a whole fsync recorded this length and time. Only for one
    /// daemon's store: over etcd a close ends the grant, under its claim.
    fn closes_settled(&self, what: &FileOutcome<'_>, durable: bool) -> bool {
        let FileOutcome::Closed {
            last: None,
            size,
            mtime: Some(mtime),
            journal: None,
        } = *what
        else {
            return false;
        };
        // `settled` is only set by a whole fsync's commit, which recorded
        // the file under construction: nothing else to check.
        !durable && self.claimed.is_none() && *lock(&self.settled) == Some((size, mtime))
    }
}

/// The commit that records `what` of file `ino`; `uc` is the file's
/// under-construction entry when it is not recorded yet.
fn changes(ino: u64, what: FileOutcome<'_>, uc: impl FnOnce() -> Option<Change>) -> Vec<Change> {
    let put = |row: &BlockRow| Change::PutBlock(row.clone());
    let size = |size: u64, touch: Option<i64>| Change::SetSize { ino, size, touch };
    match what {
        FileOutcome::Opened(row) => uc().into_iter().chain([put(row)]).collect(),
        FileOutcome::Changed(rows) => rows.iter().map(put).collect(),
        FileOutcome::Finished {
            row,
            size: n,
            mtime,
            journal,
        } => {
            let kept = journal.map(|data| Change::Journal(JournalRow::of(row, data)));
            uc().into_iter()
                .chain([put(row), size(n, mtime)])
                .chain(kept)
                .collect()
        }
        FileOutcome::Closed {
            last,
            size: n,
            mtime,
            journal,
        } => {
            let kept = last
                .zip(journal)
                .map(|(row, data)| Change::Journal(JournalRow::of(row, data)));
            last.map(put)
                .into_iter()
                .chain([size(n, mtime), Change::DelUc(ino)])
                .chain(kept)
                .collect()
        }
        FileOutcome::Truncating => uc().into_iter().collect(),
        FileOutcome::Shrunk {
            size: n,
            mtime,
            drop_from,
            cut,
        } => [
            Change::DropBlocksFrom {
                ino,
                from: drop_from,
            },
            size(n, Some(mtime)),
        ]
        .into_iter()
        .chain(cut.map(put))
        .collect(),
        FileOutcome::Grown {
            open,
            size: n,
            mtime,
        } => open
            .map(put)
            .into_iter()
            .chain([size(n, Some(mtime))])
            .collect(),
        FileOutcome::Length { size: n, mtime } => vec![size(n, mtime)],
    }
}

impl FileLog for FileRecord {
    fn record(&self, what: FileOutcome<'_>, durable: bool) -> FsResult<Vec<BlockRow>> {
        if self.closes_settled(&what, durable) {
            self.meta.close_lazily(self.uc.ino)?;
            self.under_construction.store(false, Ordering::Release);
            *lock(&self.settled) = None;
            self.metrics.closed_without_commit();
            return Ok(Vec::new());
        }
        *lock(&self.settled) = None;
        let mut ch = changes(self.uc.ino, what, || self.uc_unless_recorded());
        if ch.is_empty() {
            return Ok(Vec::new());
        }
        if self.claimed.is_some() {
            ch.push(Change::Claimed {
                ino: self.uc.ino,
                epoch: self.uc.epoch,
            });
        }
        let gone = match self.meta.commit(&ch, durable) {
            Err(e @ FsError::Lease(LeaseError::Fenced { .. })) => {
                if let Some(fenced) = &self.claimed {
                    fenced(self.uc.ino);
                }
                return Err(e);
            }
            r => r?,
        };
        *lock(&self.settled) = match what {
            FileOutcome::Finished {
                size,
                mtime: Some(t),
                ..
            } => Some((size, t)),
            _ => None,
        };
        match what {
            FileOutcome::Closed { .. } => self.under_construction.store(false, Ordering::Release),
            _ if ch.iter().any(|c| matches!(c, Change::PutUc(_))) => {
                self.under_construction.store(true, Ordering::Release)
            }
            _ => {}
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(idx: u64) -> BlockRow {
        BlockRow {
            ino: 7,
            idx,
            block_id: 100 + idx,
            gs: 1,
            len: 10,
            finalized: false,
            replicas: Vec::new(),
        }
    }

    #[test]
    fn each_outcome_is_one_commit_of_the_changes_it_stands_for() {
        let uc = || Some(Change::DelUc(0));
        let none = || None;
        let r = row(0);
        assert_eq!(
            changes(7, FileOutcome::Opened(&r), uc),
            vec![Change::DelUc(0), Change::PutBlock(r.clone())]
        );
        assert_eq!(
            changes(7, FileOutcome::Opened(&r), none),
            vec![Change::PutBlock(r.clone())]
        );
        let closed = FileOutcome::Closed {
            last: Some(&r),
            size: 10,
            mtime: Some(5),
            journal: None,
        };
        assert_eq!(
            changes(7, closed, none),
            vec![
                Change::PutBlock(r.clone()),
                Change::SetSize {
                    ino: 7,
                    size: 10,
                    touch: Some(5)
                },
                Change::DelUc(7),
            ]
        );
        assert!(changes(7, FileOutcome::Truncating, none).is_empty());
        let shrunk = FileOutcome::Shrunk {
            size: 3,
            mtime: 9,
            drop_from: 1,
            cut: Some(&r),
        };
        assert_eq!(
            changes(7, shrunk, none),
            vec![
                Change::DropBlocksFrom { ino: 7, from: 1 },
                Change::SetSize {
                    ino: 7,
                    size: 3,
                    touch: Some(9)
                },
                Change::PutBlock(r.clone()),
            ]
        );
    }
}

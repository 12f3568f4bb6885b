//! What a stream's worker did to its file, as [`FileOutcome`]s handed to a
//! [`FileLog`] that the filesystem implements: the worker writes replicas
//! and keeps the block's own ordering rules; recording the file (its
//! blocks, its length, its time under construction) is the filesystem's.
//!
//! The worker reports each outcome at the moment the ordering rules of
//! docs/SEMANTICS.md "Durability" put it, and waits for it to be recorded
//! before it touches a replica again: a new generation stamp is recorded
//! (durably) before any replica carries it, a truncation before any
//! replica is cut, and replicas of dropped blocks are deleted only after
//! the record that drops them is durable. `durable` says which records
//! must be on stable storage when [`FileLog::record`] returns.

use crate::error::FsResult;
use crate::meta::BlockRow;

/// One thing the worker did to the file.
#[derive(Debug, Clone, Copy)]
pub enum FileOutcome<'a> {
    /// A block was opened for writing: a new one, or the last one
    /// reopened for append under a new stamp (or the reopened one lost
    /// replicas that could not be reopened). The file is under
    /// construction from the first such outcome on.
    Opened(&'a BlockRow),
    /// Blocks' stamps or replicas changed (pipeline recovery, a sync that
    /// dropped a replica): their rows.
    Changed(&'a [BlockRow]),
    /// A block was finalised: a full one, or the only one of a small file
    /// written whole by its fsync. Its row, and the length of the file,
    /// which ends with it. The file is under construction from then on
    /// (until it is closed), as from an `Opened`. `journal`: the block's
    /// bytes, kept with the record until its replicas are synced (see
    /// `journal`); its fsync then syncs only the record. `mtime`: the
    /// file's modification time, recorded with a whole fsync (so that the
    /// close behind it, with nothing written since, has nothing left to
    /// record but the end of the file's time under construction).
    Finished {
        row: &'a BlockRow,
        size: u64,
        mtime: Option<i64>,
        journal: Option<&'a [u8]>,
    },
    /// The file was closed: its last block finalised (if one was open),
    /// its length and modification time. It is no longer under
    /// construction. `journal`: the last block's bytes, when its close
    /// wrote it whole and the journal keeps them until its replicas are
    /// synced (see `journal`): they were held, not written.
    Closed {
        last: Option<&'a BlockRow>,
        size: u64,
        mtime: Option<i64>,
        journal: Option<&'a [u8]>,
    },
    /// A truncation starts: the file is under construction from now on.
    Truncating,
    /// The file was cut to `size`: its blocks from index `drop_from` go
    /// (the record returns them, for their replicas to be deleted), and
    /// `cut`, the block that holds the new end, is shorter under a new
    /// stamp.
    Shrunk {
        size: u64,
        mtime: i64,
        drop_from: u64,
        cut: Option<&'a BlockRow>,
    },
    /// The file was grown with zeros to `size`; `open` is the block the
    /// zeros went into, if one is open.
    Grown {
        open: Option<&'a BlockRow>,
        size: u64,
        mtime: i64,
    },
    /// The visible length, for readers on other daemons (published only
    /// when the namespace is shared).
    Length { size: u64, mtime: Option<i64> },
}

/// Where a stream's outcomes are recorded. Called from the stream's worker
/// (one call at a time per stream), sometimes under the stream's lock: an
/// implementation records and returns, and never calls back into the
/// stream.
pub trait FileLog: Send + Sync {
    /// Records `what` in one atomic step (with `durable`: on stable
    /// storage, with every earlier record, when this returns). Returns the
    /// rows of blocks the record dropped.
    fn record(&self, what: FileOutcome<'_>, durable: bool) -> FsResult<Vec<BlockRow>>;
}

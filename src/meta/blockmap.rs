//! [`BlockMap`]: which blocks each file has and where their replicas
//! are, the files under construction, and the write path's commits of
//! [`Change`]s with their durability.

use super::types::{BlockRow, JournalRow, UnderConstruction};
use crate::error::FsResult;

/// One change of a write-path commit; see [`BlockMap::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Inserts or replaces the block row (`ino`, `idx`).
    PutBlock(BlockRow),
    /// Replaces the block row (`row.ino`, `row.idx`) only if it is still
    /// `expect`; otherwise the whole commit fails with
    /// [`crate::error::FsError::Moved`]. Housekeeping, the balancer and
    /// datanode removal change replica lists of finished blocks this way,
    /// so none of them writes back a row another one changed meanwhile.
    PutBlockIf {
        expect: BlockRow,
        row: BlockRow,
    },
    /// Removes the file's blocks with index >= `from`; they are returned by
    /// `commit` so their replicas can be deleted.
    DropBlocksFrom {
        ino: u64,
        from: u64,
    },
    /// Records the file's length (and mtime = ctime = `touch` if given).
    SetSize {
        ino: u64,
        size: u64,
        touch: Option<i64>,
    },
    /// Records (or replaces) the file's under-construction entry; also
    /// raises the inode's last epoch to the entry's epoch.
    PutUc(UnderConstruction),
    DelUc(u64),
    /// Raises the inode's last grant epoch (never lowers it).
    SetLastEpoch {
        ino: u64,
        epoch: u64,
    },
    /// Changes nothing; the whole commit applies only while the file's
    /// cluster claim is still the one `epoch` was granted under (over
    /// etcd: the claim key `lease/<ino>` exists and was created at the
    /// revision `epoch >> EPOCH_SEQ_BITS`), else it fails with
    /// [`crate::lease::LeaseError::Fenced`]. The check and the changes are
    /// one etcd transaction, so a daemon that lost a claim records nothing
    /// more of the file, however late it learns. A lone daemon's store has
    /// no claims: its lease manager fences its writers, and it ignores
    /// this.
    Claimed {
        ino: u64,
        epoch: u64,
    },
    /// Keeps a small block's bytes in the store until its replicas are
    /// synced (see [`BlockMap::journals`]): with a durable commit, the
    /// block is durable however little of its replicas reached the disk.
    Journal(JournalRow),
    /// Forgets the journal row of a block whose replicas were synced (or
    /// that changed since: see `pipeline::journal`).
    Unjournal(u64),
}

/// Block lists and files under construction. The write path's multi-row
/// updates are one [`BlockMap::commit`] of [`Change`]s, so they commit as
/// one unit on either backend (one SQLite transaction, one etcd Txn).
pub trait BlockMap: Send + Sync {
    /// Applies `changes` atomically; with `durable`, the commit (and every
    /// earlier one) is on stable storage when this returns. Returns the
    /// blocks removed by `DropBlocksFrom`.
    fn commit(&self, changes: &[Change], durable: bool) -> FsResult<Vec<BlockRow>>;
    /// Makes every commit so far durable, cheaply when nothing changed.
    fn sync_if_needed(&self) -> FsResult<()>;
    /// Whether [`Self::sync_if_needed`] has anything to do: an fsync that
    /// changed no metadata then asks no thread to make it durable.
    fn sync_pending(&self) -> bool {
        true
    }
    /// The filesystem (`st_dev`) where one `syncfs` makes every commit so
    /// far durable, and how many commits that is now. An fsync that runs
    /// that `syncfs` for its replicas anyway then needs no sync of the
    /// store of its own: one flush of the device where there were two.
    /// `None` where no such filesystem is (etcd) or the store's own syncs
    /// must tell (one failed).
    fn commits_on_fs(&self) -> Option<(u64, u64)> {
        None
    }
    /// A `syncfs` of that filesystem that started after
    /// [`Self::commits_on_fs`] counted `commits` succeeded: they are
    /// durable.
    fn synced_by_fs(&self, _commits: u64) {}
    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>>;
    /// Every block of every file, ordered by (ino, idx).
    fn all_blocks(&self) -> FsResult<Vec<BlockRow>>;
    /// The row of block `block_id`, if a file still has it (a point read:
    /// the orphan sweep asks it again before deleting anything).
    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>>;
    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>>;
    /// Ends file `ino`'s time under construction, where nothing else of
    /// the file is left to record (a small file closed after its whole
    /// fsync: block, length and time recorded by the fsync). Seen at once
    /// by every reader of this store (`uc`, `list_uc`); the store may
    /// commit it later, with another commit or [`Self::settle_closes`].
    /// A crash before then leaves the entry to the next mount's recovery,
    /// which closes the file at its recorded length: a close promises no
    /// durability (docs/SEMANTICS.md "Durability").
    fn close_lazily(&self, ino: u64) -> FsResult<()>;
    /// Commits what [`Self::close_lazily`] left waiting.
    fn settle_closes(&self) -> FsResult<()>;
    /// Whether [`Change::Journal`] is kept (one daemon's store, where a
    /// durable commit is one `fdatasync` of a local log). A store that
    /// does not refuses the change.
    fn journals(&self) -> bool {
        false
    }
    /// Every journal row, for the replay at mount.
    fn journal_rows(&self) -> FsResult<Vec<JournalRow>> {
        Ok(Vec::new())
    }
    /// One file's under-construction entry (a point read: write-opens over
    /// etcd ask this for every file they claim).
    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>>;
}

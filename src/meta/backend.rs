//! The interface between the filesystem and a metadata backend.
//!
//! Every method is one atomic step: a backend may run it as one SQLite
//! transaction or as one etcd transaction (retried on conflict), and a
//! concurrent step of another daemon sees all of it or nothing. The write
//! path's multi-row updates are expressed as a list of [`Change`]s so they
//! too commit as one unit on either backend.

use std::path::Path;

use super::types::{
    AdminState, AttrChange, AuditEvent, BlockRow, DatanodeRecord, DecideXattrs, DirEntry, DnId,
    FenceRecord, Inode, NewNode, StoreSpace, UnderConstruction, XattrEdit, XattrLimits,
};
use crate::error::FsResult;

/// One change of a write-path commit; see [`Meta::commit`].
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
}

/// The metadata operations of leasefs. Errors use the filesystem's own
/// [`crate::error::FsError`] (NotFound, Exists, NotEmpty, ...), so both
/// backends give the same errno for the same refusal.
pub trait Meta: Send + Sync {
    /// A short name for logs and `leases`: "sqlite" or "etcd".
    fn backend(&self) -> &'static str;

    // ---- namespace ---------------------------------------------------
    fn get(&self, ino: u64) -> FsResult<Inode>;
    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// The parent of a directory (`..`); the root is its own parent.
    fn parent_of(&self, dir: u64) -> FsResult<u64>;
    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode>;
    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>>;
    /// A hard link: another name for `ino`.
    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// Removes a non-directory entry; returns the inode after the change
    /// (nlink 0 means the last name is gone).
    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// Removes an empty directory; returns its inode number.
    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64>;
    /// Renames; returns the replaced inode (after its nlink drop), if any.
    /// `exchange` swaps the two entries (RENAME_EXCHANGE).
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>>;
    /// The entries of `dir` whose cookie is above `after`, in cookie
    /// order, at most `limit` of them. A page costs O(`limit`), whatever
    /// the size of the directory.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>>;
    fn set_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode>;
    /// Path of an inode, for logs and listings (first name found).
    fn path_of(&self, ino: u64) -> String;
    /// Inodes with no name left (unlinked while open when a daemon died).
    fn orphans(&self) -> FsResult<Vec<u64>>;
    /// Deletes an inode whose last name and last open handle are gone;
    /// returns its blocks for replica deletion.
    fn delete_inode(&self, ino: u64) -> FsResult<Vec<BlockRow>>;
    /// Totals for statfs: (files, bytes).
    fn usage(&self) -> FsResult<(u64, u64)>;
    /// The filesystem the store keeps its data on, when it is local.
    fn space(&self) -> FsResult<Option<StoreSpace>>;

    // ---- xattrs --------------------------------------------------------
    fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>>;
    /// The inode and whether it has the attribute `name`, in one read:
    /// a write open needs both, and each read of the store is a
    /// transaction that showed in the open's latency.
    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, bool)>;
    fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>>;
    /// One read-modify-write of an inode's attributes: reads the inode and
    /// the values of `names`, lets `decide` say what changes, and commits
    /// that (ctime stamped) unless it is empty, refusing with
    /// `XattrSpace` what `limits` do not allow. `decide` may run more than
    /// once (a retried etcd step) and must have no other effect.
    fn update_xattrs(
        &self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode>;

    /// `create` / `replace`: XATTR_CREATE / XATTR_REPLACE semantics.
    fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| match (
            &cur[0], create, replace,
        ) {
            (Some(_), true, _) => Err(crate::error::FsError::Exists),
            (None, _, true) => Err(crate::error::FsError::NoXattr),
            _ => Ok(XattrEdit {
                set: vec![(name.to_vec(), Some(value.to_vec()))],
                attrs: None,
            }),
        })
        .map(drop)
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
            if cur[0].is_none() {
                return Err(crate::error::FsError::NoXattr);
            }
            Ok(XattrEdit {
                set: vec![(name.to_vec(), None)],
                attrs: None,
            })
        })
        .map(drop)
    }

    // ---- blocks and files under construction ---------------------------
    /// Applies `changes` atomically; with `durable`, the commit (and every
    /// earlier one) is on stable storage when this returns. Returns the
    /// blocks removed by `DropBlocksFrom`.
    fn commit(&self, changes: &[Change], durable: bool) -> FsResult<Vec<BlockRow>>;
    /// Makes every commit so far durable, cheaply when nothing changed.
    fn sync_if_needed(&self) -> FsResult<()>;
    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>>;
    /// Every block of every file, ordered by (ino, idx).
    fn all_blocks(&self) -> FsResult<Vec<BlockRow>>;
    /// The row of block `block_id`, if a file still has it (a point read:
    /// the orphan sweep asks it again before deleting anything).
    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>>;
    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>>;
    /// One file's under-construction entry (a point read: write-opens over
    /// etcd ask this for every file they claim).
    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>>;

    // ---- counters --------------------------------------------------------
    /// A fresh id of `counter` (`next_block`, `next_gs`), unique across
    /// restarts and across every daemon sharing the backend.
    fn alloc(&self, counter: &'static str) -> FsResult<u64>;
    /// Reserves `n` epochs above the persisted high-water mark and returns
    /// the first; epochs stay strictly increasing across restarts.
    fn reserve_epochs(&self, n: u64) -> FsResult<u64>;

    // ---- datanode registry -------------------------------------------------
    /// The filesystem's ID, created with it: every datanode's identity file
    /// names it, so a directory of another filesystem is recognised.
    fn filesystem_id(&self) -> FsResult<String>;
    /// Every datanode the filesystem has recorded, by id.
    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>>;
    /// Records that storage `storage_id`, whose identity file is on disk,
    /// was attached at `path`; returns its id, a new one for a storage not
    /// seen before. An `upgrading` record of it becomes `normal`. Durable.
    fn register_datanode(&self, storage_id: &str, path: &Path) -> FsResult<DnId>;
    /// Gives the positional-layout datanode `id` the storage ID
    /// `storage_id`, unless it has one already (another daemon's, or an
    /// interrupted upgrade's); returns the one it has afterwards. Durable:
    /// the identity file is written only after this.
    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String>;
    /// Moves datanode `id` to admin state `to` if it is in one of `from`
    /// (durably); returns the state it was in, changed or not, so the
    /// caller sees whether it won (`NotFound` if it is not recorded).
    fn set_datanode_state(
        &self,
        id: DnId,
        from: &[AdminState],
        to: AdminState,
    ) -> FsResult<AdminState>;
    /// Removes datanode `id`: its record becomes a `removed` tombstone and
    /// no block row lists it afterwards. The tombstone is one durable
    /// step, after which a row that still lists the datanode means
    /// nothing; the rows are rewritten in the same transaction (SQLite) or
    /// right after it in pages (etcd, whose transactions are bounded), and
    /// calling it again finishes an interrupted rewrite.
    fn remove_datanode(&self, id: DnId) -> FsResult<()>;

    // ---- mount configuration and audit ---------------------------------
    /// Records the replication factor of this mount, for offline tools.
    fn set_replication(&self, replication: usize) -> FsResult<()>;
    /// The replication factor of the last mount, if recorded.
    fn replication(&self) -> FsResult<Option<usize>>;
    /// Appends one election event durably, unless it is redundant with
    /// the election's events ([`AuditEvent::is_redundant`], judged in the
    /// same atomic step); returns its sequence number, or `None` when it
    /// was left out.
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>>;
    /// The events of one election, oldest first.
    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>>;

    // ---- election fences -------------------------------------------------
    /// Records (or replaces) the fence of `f.owner` for process group
    /// `f.pgid`, durably.
    fn put_fence(&self, f: &FenceRecord) -> FsResult<()>;
    /// Forgets a fence; forgetting one that is not there is not an error.
    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()>;
    /// Every fence `owner` recorded.
    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>>;
}

/// Every entry of `dir`, page by page, in cookie order.
pub fn list_all(m: &dyn Meta, dir: u64) -> FsResult<Vec<DirEntry>> {
    const PAGE: usize = 1024;
    let mut all: Vec<DirEntry> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.cookie);
        let page = m.readdir(dir, after, PAGE)?;
        let done = page.len() < PAGE;
        all.extend(page);
        if done {
            return Ok(all);
        }
    }
}

//! [`DatanodeRegistry`]: the datanodes the filesystem has recorded (by
//! id and storage ID), their admin states, the filesystem ID their
//! identity files name, and the replication factor of the last mount.

use std::path::Path;

use super::types::{AdminState, DatanodeRecord, DnId};
use crate::error::FsResult;

/// The datanode registry (docs/SEMANTICS.md, "Datanode administration").
pub trait DatanodeRegistry: Send + Sync {
    /// The filesystem's ID, created with it: every datanode's identity file
    /// names it, so a directory of another filesystem is recognised.
    fn filesystem_id(&self) -> FsResult<String>;
    /// Every datanode the filesystem has recorded, by id.
    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>>;
    /// Records that storage `storage_id`, whose identity file is on disk,
    /// was attached at `path`; returns its id, a new one for a storage not
    /// seen before. An `upgrading` record of it becomes `normal`. `host`:
    /// it holds the host-local copies of that host (`-o local_copy`), or
    /// is shared (`None`); recorded with the path, in the same step, so
    /// that no other daemon ever takes a host's copy for a shared
    /// datanode. Durable.
    fn register_datanode(
        &self,
        storage_id: &str,
        path: &Path,
        host: Option<&str>,
    ) -> FsResult<DnId>;
    /// Gives the positional-layout datanode `id` the storage ID
    /// `storage_id`, unless it has one already (another daemon's, or an
    /// interrupted upgrade's); returns the one it has afterwards. Durable:
    /// the identity file is written only after this.
    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String>;
    /// The storage ID the new datanode at `path` (an object-store prefix
    /// without an identity object yet) is to carry: the one claimed for
    /// `path` before, unless a registered datanode carries it already
    /// (then it was that datanode's, whose prefix has been emptied since),
    /// else `storage_id`, claimed now. Durable: the identity object is
    /// written only after this, so daemons sharing the namespace that
    /// attach one prefix at once write one identity (a store's PUT cannot
    /// be made conditional everywhere: docs/SEMANTICS.md, "Object-store
    /// datanodes", *Identity*).
    fn claim_storage_id(&self, path: &Path, storage_id: &str) -> FsResult<String>;
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
    /// Records the replication factor of this mount, for offline tools.
    fn set_replication(&self, replication: usize) -> FsResult<()>;
    /// The replication factor of the last mount, if recorded.
    fn replication(&self) -> FsResult<Option<usize>>;
}

//! [`Datanode`]: one storage directory on a local filesystem, opened with
//! its identity, and the real implementation of [`Storage`]. What it does
//! to replicas lives by concern in the sibling modules (the lifecycle in
//! [`super::replica`], reads in [`super::reader`], listing, deletion,
//! copies and the heartbeat in [`super::maintenance`]); this module holds
//! what is the datanode's own: its directory, its identity, the filesystem
//! it lives on and how that is synced.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::OFlag;

use super::api::{ReplicaWrite, Storage};
use super::at::Sub;
use super::deferred::Deferred;
use super::error::StorageError;
use super::identity::Identity;
use super::layout::{DnId, Layout, ReplicaInfo, ReplicaStat, ReplicaState};
use super::quarantine::{self, Quarantined};
use super::reader::{self, ReplicaReader};
use super::{flushed, locate, maintenance, replica};
use crate::metrics::IoCounters;
use crate::sync::Arc;

/// One storage directory.
#[derive(Debug)]
pub struct Datanode {
    layout: Layout,
    /// The identity file the directory had when it was opened; heartbeats
    /// check that it still does.
    identity: Option<Identity>,
    /// The root, held open for `syncfs`: its error cursor starts when the
    /// datanode is opened, so each writeback error there is reported once.
    root_fd: File,
    /// The root opened again, for [`Storage::sync_for_mark`]: an error
    /// cursor apart from the writers'.
    mark_fd: File,
    /// Device of the root: datanodes that share it share one `syncfs`.
    dev: u64,
    /// Replica bytes written and read here, and failures (`leasefs stats`).
    io: Arc<IoCounters>,
    /// Whether `syncfs(2)` makes this datanode's writes durable. Not on
    /// FUSE (sshfs, a FUSE-backed disk, leasefs's own power-cut test
    /// filesystem): the kernel sends FUSE_SYNCFS to virtiofs only, so on
    /// any other FUSE mount syncfs returns at once having asked the
    /// daemon nothing.
    syncfs_barrier: bool,
    /// See [`Storage::ranged_sync`].
    ranged: bool,
    /// Replicas kept in memory ([`Storage::write_deferred`]): every call
    /// on a block writes it out first, so no other code sees the
    /// difference.
    deferred: Deferred,
}

impl Datanode {
    /// Opens the datanode `id` at `root`, creating `rbw/`, `finalized/` and
    /// `tmp/` as needed, and holds its directories open (see
    /// [`super::at`]); a directory another user could change is refused
    /// (see [`super::trust`]). `identity` is what its identity file says
    /// (`None` only for directories used without one, as in unit tests).
    pub fn open(id: DnId, root: &Path, identity: Option<Identity>) -> Result<Self, StorageError> {
        let layout = Layout::open(id, root)?;
        let root_fd = layout.fds().dir(Sub::Root).try_clone_file()?;
        let mark_fd = layout
            .fds()
            .dir(Sub::Root)
            .open_file(".", OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(|e| StorageError::io(root, io::Error::from(e)))?;
        let dev = root_fd
            .metadata()
            .map_err(|e| StorageError::io(root, e))?
            .dev();
        let fs_type = nix::sys::statfs::fstatfs(&root_fd)
            .map_err(|e| StorageError::io(root, io::Error::from(e)))?
            .filesystem_type();
        let syncfs_barrier = fs_type != nix::sys::statfs::FUSE_SUPER_MAGIC;
        let ranged = [
            nix::sys::statfs::EXT4_SUPER_MAGIC,
            nix::sys::statfs::XFS_SUPER_MAGIC,
            nix::sys::statfs::TMPFS_MAGIC,
        ]
        .contains(&fs_type);
        if !syncfs_barrier {
            tracing::info!(
                datanode = %id,
                root = %root.display(),
                "datanode on a FUSE filesystem, where syncfs does not reach the daemon: its replicas are synced file by file"
            );
        }
        Ok(Datanode {
            layout,
            identity,
            root_fd,
            mark_fd,
            dev,
            io: Arc::default(),
            syncfs_barrier,
            ranged,
            deferred: Deferred::default(),
        })
    }

    /// The paths of its directory.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The directory of replicas in `state`.
    pub fn dir(&self, state: ReplicaState) -> &Path {
        self.layout.dir(state)
    }

    /// Whether `block` is held in memory, not yet written.
    #[cfg(test)]
    pub fn holds(&self, block: u64) -> bool {
        self.deferred.holds(block)
    }

    /// Drops the replicas held in memory, unwritten: what a crash does.
    #[cfg(test)]
    pub fn lose_held(&self) {
        self.deferred.lose();
    }

    /// `block` on disk if it is held: called first by every call on it.
    fn out(&self, block: u64) -> Result<(), StorageError> {
        self.deferred.write_out(block, |gs, data, crcs| {
            self.write_now(block, gs, data, crcs)
        })
    }

    fn write_now(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        let r = replica::write_finalized(&self.layout, block, gs, data, crcs);
        match &r {
            Ok(()) => self.io.wrote(data.len() as u64),
            Err(_) => self.io.error(),
        }
        r
    }
}

impl Storage for Datanode {
    fn id(&self) -> DnId {
        self.layout.id
    }

    fn root(&self) -> &Path {
        self.layout.root()
    }

    fn storage_id(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.storage_id.as_str())
    }

    fn io(&self) -> &Arc<IoCounters> {
        &self.io
    }

    fn create_rbw(&self, block: u64, gs: u64) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        Ok(Box::new(replica::create_rbw(
            &self.layout,
            &self.io,
            block,
            gs,
        )?))
    }

    fn reopen_rbw(
        &self,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        self.out(block)?;
        Ok(Box::new(replica::reopen_rbw(
            &self.layout,
            &self.io,
            block,
            gs,
            len,
        )?))
    }

    fn bump_gs(&self, block: u64, old_gs: u64, new_gs: u64) -> Result<(), StorageError> {
        self.out(block)?;
        replica::bump_gs(&self.layout, block, old_gs, new_gs)
    }

    fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        self.out(block)?;
        replica::finalize(&self.layout, block, gs, len)
    }

    fn finalize_written(
        &self,
        w: Box<dyn ReplicaWrite>,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        let written = w.finish()?;
        replica::finalize_written(&self.layout, written, block, gs, len)
    }

    fn write_finalized(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        self.deferred.forget(block);
        self.write_now(block, gs, data, crcs)
    }

    fn write_deferred(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<bool, StorageError> {
        if self.deferred.hold(block, gs, data, crcs) {
            return Ok(true);
        }
        self.write_now(block, gs, data, crcs).map(|()| false)
    }

    fn write_out(&self, block: u64) -> Result<(), StorageError> {
        self.out(block)
    }

    fn truncate(&self, block: u64, gs: u64, new_gs: u64, len: u64) -> Result<(), StorageError> {
        self.out(block)?;
        replica::truncate(&self.layout, block, gs, new_gs, len)
    }

    fn open_reader(&self, block: u64, gs: u64) -> Result<ReplicaReader, StorageError> {
        self.out(block)?;
        reader::open(&self.layout, &self.io, block, gs)
    }

    fn lookup(&self, block: u64) -> Result<Option<ReplicaInfo>, StorageError> {
        self.out(block)?;
        locate::lookup(&self.layout, block)
    }

    fn stat_replica(&self, block: u64, gs: u64) -> Result<ReplicaStat, StorageError> {
        self.out(block)?;
        locate::stat_replica(&self.layout, block, gs)
    }

    fn list(&self) -> Result<Vec<ReplicaInfo>, StorageError> {
        self.deferred
            .write_all(|block, gs, data, crcs| self.write_now(block, gs, data, crcs))?;
        maintenance::list(&self.layout)
    }

    fn delete(&self, block: u64) -> Result<(), StorageError> {
        self.deferred.forget(block);
        locate::delete(&self.layout, block)
    }

    fn quarantine(&self, block: u64) -> Result<PathBuf, StorageError> {
        self.out(block)?;
        quarantine::quarantine(&self.layout, block)
    }

    fn keep_copy(&self, block: u64, gs: u64) -> Result<PathBuf, StorageError> {
        let state = self.stat_replica(block, gs)?.state;
        quarantine::keep_copy(&self.layout, state, block, gs)
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, StorageError> {
        quarantine::list(&self.layout)
    }

    fn expire_quarantine(&self, keep: Duration) -> Result<usize, StorageError> {
        quarantine::expire(&self.layout, keep)
    }

    fn delete_recorded(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        self.out(block)?;
        maintenance::delete_recorded(&self.layout, block, gs)
    }

    fn copy_replica_from(
        &self,
        src: &dyn Storage,
        block: u64,
        gs: u64,
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.out(block)?;
        maintenance::copy_replica_from(&self.layout, src, block, gs, len, state)
    }

    fn copy_replica_as(
        &self,
        src: &dyn Storage,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.out(to.0)?;
        maintenance::copy_replica_as(&self.layout, src, from, to, len, state)
    }

    fn clean_tmp(&self) -> Result<usize, StorageError> {
        maintenance::clean_tmp(&self.layout)
    }

    /// Data, checksums and both directory entries (for blocks finalised
    /// before an `fsync` of their file).
    fn sync_replica(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        self.out(block)?;
        let l = &self.layout;
        let loc = locate::locate(l, block, gs)?;
        for at in [l.data(loc.data_in, block), l.meta(loc.meta_in, block, gs)] {
            at.open_read()?
                .sync_all()
                .map_err(|e| StorageError::io(&at.path, e))?;
        }
        l.fsync_dir(ReplicaState::Finalized)?;
        l.fsync_dir(ReplicaState::Rbw)
    }

    /// Data, inodes and directory entries of every replica on the
    /// datanode's filesystem, for one cache flush (and journal commit)
    /// where `fdatasync` per file pays one each. An error means some
    /// writeback on that filesystem failed since the last call, not
    /// necessarily ours: the caller finds out which file with per-file
    /// syncs. Replicas held in memory are not written out here: a caller syncs
    /// named replicas and writes those out first (see
    /// `pipeline::durable::sync_replicas`), so that a failed write is
    /// that replica's failure, not the filesystem's.
    fn sync_fs(&self) -> Result<(), StorageError> {
        nix::unistd::syncfs(&self.root_fd)
            .map_err(|e| StorageError::io(self.layout.root(), io::Error::from(e)))
    }

    fn fs_id(&self) -> u64 {
        self.dev
    }

    fn syncfs_is_barrier(&self) -> bool {
        self.syncfs_barrier
    }

    fn ranged_sync(&self) -> bool {
        self.ranged
    }

    fn heartbeat(&self) -> Result<u64, StorageError> {
        maintenance::heartbeat(&self.layout, self.identity.as_ref())
    }

    fn flushed_mark(&self) -> Result<Option<u64>, StorageError> {
        flushed::read(&self.layout)
    }

    fn set_flushed_mark(&self, gs: u64) -> Result<(), StorageError> {
        flushed::write(&self.layout, gs)
    }

    fn sync_for_mark(&self) -> Result<(), StorageError> {
        nix::unistd::syncfs(&self.mark_fd)
            .map_err(|e| StorageError::io(self.layout.root(), io::Error::from(e)))
    }
}

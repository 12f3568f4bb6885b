//! [`Storage`]: what the write pipeline, the read path, lease recovery,
//! fsck and housekeeping need of a datanode, and [`ReplicaWrite`], the
//! open replica a pipeline streams packets into. [`super::Datanode`] is
//! the real implementation (a directory on a local filesystem); unit tests
//! wrap it in one that injects delays and failures at chosen operations.
//!
//! Every operation names a replica by block id and generation stamp, the
//! way block rows record it; which files hold it is the implementation's
//! business.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::checksum::CHUNK_SIZE;
use super::error::StorageError;
use super::layout::{DnId, ReplicaInfo, ReplicaStat, ReplicaState};
use super::quarantine::Quarantined;
use super::reader::ReplicaReader;
use crate::metrics::IoCounters;
use crate::sync::Arc;

/// One independent piece of a replica's sync (see [`SyncPlan::Full`]),
/// and which step of it it is (so that fault injection can strike each
/// step on its own).
pub struct SyncTask {
    pub step: SyncStep,
    pub run: Box<dyn FnOnce() -> Result<(), StorageError> + Send>,
}

impl SyncTask {
    pub fn new(
        step: SyncStep,
        run: impl FnOnce() -> Result<(), StorageError> + Send + 'static,
    ) -> SyncTask {
        SyncTask {
            step,
            run: Box::new(run),
        }
    }

    /// Runs it.
    pub fn run(self) -> Result<(), StorageError> {
        (self.run)()
    }
}

/// The steps of a full sync of a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncStep {
    /// `fdatasync` (or `fsync`) of a data or checksum file.
    File,
    /// `fsync` of the directory holding the replica (its names).
    Dir,
}

/// How a replica being written becomes durable at an fsync (see
/// [`ReplicaWrite::begin_sync`]).
pub enum SyncPlan {
    /// Nothing was written since its last sync.
    Clean,
    /// Its files' sizes and blocks are durable already (they were
    /// zero-filled ahead of the writer, see [`ReplicaWrite::extend_zeroed`]),
    /// so only the pages written since the last sync must reach the disk:
    /// their writeback has started. [`ReplicaWrite::end_ranged`] waits for
    /// it, and one cache flush of the device (a [`ReplicaWrite::flush`] of
    /// any replica there, after every wait) makes them durable: one flush
    /// for every replica on a disk, and no inode, bitmap or directory write.
    Ranged,
    /// Data and metadata must be synced (and the directory, the first
    /// time): these tasks, which the caller may run in parallel with each
    /// other and with other replicas' syncs.
    Full(Vec<SyncTask>),
}

/// A replica being written (rbw), open for appends.
pub trait ReplicaWrite: Send + fmt::Debug {
    /// Bytes written so far; the next packet must start here.
    fn len(&self) -> u64;

    /// True when nothing has been written.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `data` at `offset` (which must equal [`Self::len`]), with
    /// `crcs` the CRCs of the chunks from `offset / 512` to the end (the
    /// first of the whole chunk when `offset` is mid-chunk). On error the
    /// length is unchanged.
    fn write_packet(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError>;

    /// Appends `len` zero bytes at `offset` as [`Self::write_packet`]
    /// would, `crcs` theirs, without writing them: the data file grows by
    /// a hole (truncate growth costs the checksums only). A sync makes
    /// its size durable as it does for data; a hole reads as zeros after
    /// any crash.
    fn write_zeros(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError>;

    /// Starts making everything written so far durable (see [`SyncPlan`]);
    /// [`Self::synced`] once it succeeded. `ranged`: the datanode's
    /// filesystem overwrites allocated blocks in place (ext4, xfs), so a
    /// ranged sync suffices where the files are zero-filled ahead.
    fn begin_sync(&mut self, ranged: bool) -> Result<SyncPlan, StorageError>;

    /// Waits for the writeback a [`SyncPlan::Ranged`] started.
    fn end_ranged(&self) -> Result<(), StorageError>;

    /// A cache flush of the replica's device: an `fdatasync` of its data
    /// file, which after [`Self::end_ranged`] has nothing else to write.
    fn flush(&self) -> Result<(), StorageError>;

    /// The sync [`Self::begin_sync`] planned succeeded.
    fn synced(&mut self);

    /// Makes everything written durable, one task after the other.
    fn sync(&mut self) -> Result<(), StorageError> {
        match self.begin_sync(false)? {
            SyncPlan::Clean => {}
            SyncPlan::Ranged => {
                self.end_ranged()?;
                self.flush()?;
            }
            SyncPlan::Full(tasks) => tasks.into_iter().try_for_each(SyncTask::run)?,
        }
        self.synced();
        Ok(())
    }

    /// Bytes of data the files are durably allocated for (written with
    /// data or zeros, and sized, on stable storage): syncs of appends
    /// that stay below it can be ranged.
    fn zeroed(&self) -> u64;

    /// Zero-fills both files ahead of the writer, for `to` bytes of data
    /// and their checksums, and makes that durable (their size and blocks
    /// included), so that later syncs of appends below `to` are ranged.
    fn extend_zeroed(&mut self, to: u64) -> Result<(), StorageError>;

    /// Closes the writer, cutting the files back to the data written if
    /// they were zero-filled past it; returns its length.
    fn finish(self: Box<Self>) -> Result<u64, StorageError>;

    /// The bytes after the last 512-byte boundary when the replica was
    /// reopened for append (empty for a new replica), for
    /// [`super::checksum::ChunkAccumulator::resume`].
    fn take_resume_tail(&mut self) -> Vec<u8>;
}

/// A datanode's replicas. Methods that change a replica are safe to retry
/// after success, so that recovery and repairs can simply run again.
pub trait Storage: Send + Sync + fmt::Debug {
    // ---- which datanode ------------------------------------------------

    /// The registry's id of this storage: what block rows record.
    fn id(&self) -> DnId;
    /// Its directory.
    fn root(&self) -> &Path;
    /// The storage ID of its identity file, if it has one.
    fn storage_id(&self) -> Option<&str>;
    /// Replica bytes written and read here, and failures (`leasefs stats`).
    fn io(&self) -> &Arc<IoCounters>;

    // ---- the write lifecycle (write pipeline, truncation, recovery) ------

    /// A new, empty replica in `rbw/` (leftovers of the block go first).
    fn create_rbw(&self, block: u64, gs: u64) -> Result<Box<dyn ReplicaWrite>, StorageError>;
    /// Continues a replica at length `len`: an rbw one (pipeline recovery)
    /// or a finalized one moved back to `rbw/` (append), cut to `len`.
    fn reopen_rbw(
        &self,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<Box<dyn ReplicaWrite>, StorageError>;
    /// Gives the replica a new generation stamp, so that replicas left out
    /// of a rebuilt pipeline are recognisably stale.
    fn bump_gs(&self, block: u64, old_gs: u64, new_gs: u64) -> Result<(), StorageError>;
    /// Moves a replica to `finalized/`, cut to `len` if longer.
    fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError>;
    /// Finalizes the replica `w` has just written (cheaper than
    /// [`Self::finalize`] when it holds exactly `len` bytes).
    fn finalize_written(
        &self,
        w: Box<dyn ReplicaWrite>,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<(), StorageError>;
    /// A whole replica written at once straight into `finalized/`: the
    /// only packet of a new block, at the close of a file that fit in it
    /// (no rbw file, no renames). `crcs` are the CRCs of `data`'s chunks.
    /// Leftovers of the block go first; nothing is synced (closing
    /// promises no durability).
    fn write_finalized(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError>;
    /// As [`Self::write_finalized`], for a replica whose bytes are
    /// durable elsewhere until its next sync (the block journal's): the
    /// datanode may keep it in memory until [`Self::write_out`] or any
    /// other call on the block needs it on disk. Whether it was kept:
    /// `Ok(false)` means written at once.
    fn write_deferred(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<bool, StorageError> {
        self.write_finalized(block, gs, data, crcs).map(|()| false)
    }
    /// Writes a replica [`Self::write_deferred`] kept (unsynced); nothing
    /// if there is none.
    fn write_out(&self, _block: u64) -> Result<(), StorageError> {
        Ok(())
    }
    /// Cuts a replica to `len` under the new stamp `new_gs`, durably.
    fn truncate(&self, block: u64, gs: u64, new_gs: u64, len: u64) -> Result<(), StorageError>;

    /// Brings a replica whose stamp `found` lags the recorded `gs` (the
    /// metadata recorded a bump, truncation or recovery before a crash
    /// kept it from reaching this replica) to the recorded state: cut to
    /// `len`, restamped, finalized.
    fn settle(&self, block: u64, found: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        self.truncate(block, found, gs, len)?;
        self.finalize(block, gs, len)
    }

    // ---- reading ----------------------------------------------------------

    /// Opens replica `block`@`gs` for verified reads:
    /// [`StorageError::StaleGenStamp`] when the replica has another stamp,
    /// [`StorageError::Missing`] when there is none.
    fn open_reader(&self, block: u64, gs: u64) -> Result<ReplicaReader, StorageError>;

    /// Reads up to `buf.len()` bytes at `offset` of replica `block`@`gs`,
    /// verifying every chunk touched (see [`ReplicaReader::read`]).
    fn read(
        &self,
        block: u64,
        gs: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError> {
        self.open_reader(block, gs)?.read(offset, buf)
    }

    /// The longest prefix of replica `block`@`gs` whose checksums match
    /// (see [`ReplicaReader::valid_prefix`]); lease recovery takes the
    /// minimum over the replicas.
    fn valid_prefix(&self, block: u64, gs: u64) -> Result<u64, StorageError> {
        self.open_reader(block, gs)?.valid_prefix()
    }

    /// How much of replica `block`@`gs` survives as a clean prefix: its
    /// valid length when every chunk it holds checks out but perhaps the
    /// last, or the first one past its last sync inside a chunk (what a
    /// power cut leaves of data that was never synced), `None` when a
    /// chunk before that is corrupt (damage, not a lost tail).
    fn clean_prefix(&self, block: u64, gs: u64) -> Result<Option<u64>, StorageError> {
        let r = self.open_reader(block, gs)?;
        let valid = r.valid_prefix()?;
        let present = r.present_len()?;
        // Or the chunk that fails is the one a sync ended in (its note
        // says so): what follows it was never synced.
        let torn = r.note().is_some_and(|n| n.len == valid);
        Ok((valid + CHUNK_SIZE as u64 >= present || torn).then_some(valid))
    }

    /// The replica of `block` here, whatever its stamp, if both of its
    /// files exist.
    fn lookup(&self, block: u64) -> Result<Option<ReplicaInfo>, StorageError>;

    /// [`Self::lookup`], with an I/O error logged and taken for no replica.
    fn find(&self, block: u64) -> Option<ReplicaInfo> {
        self.lookup(block).unwrap_or_else(|e| {
            tracing::warn!(dn = %self.id(), block, error = %e, "replica lookup failed");
            None
        })
    }

    /// Where replica `block`@`gs` is and how long its data is.
    fn stat_replica(&self, block: u64, gs: u64) -> Result<ReplicaStat, StorageError>;

    /// Every replica here (both files present), by block id.
    fn list(&self) -> Result<Vec<ReplicaInfo>, StorageError>;

    /// How long ago replica `info` (as [`Self::list`] gave it) was last
    /// written, if known: fsck leaves a young unreferenced replica alone
    /// (its writer may be about to record it). A directory's is its data
    /// file's mtime.
    fn replica_age(&self, info: &ReplicaInfo) -> Option<Duration> {
        std::fs::symlink_metadata(&info.data_path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
    }

    // ---- removing and copying (fsck, housekeeping, the balancer) --------

    /// Removes every file of `block` (absent: no error).
    fn delete(&self, block: u64) -> Result<(), StorageError>;
    /// Removes the replica of `block` recorded at stamp `gs`.
    fn delete_recorded(&self, block: u64, gs: u64) -> Result<(), StorageError>;
    /// Copies the first `len` bytes of replica `block`@`gs` from `src`
    /// (verified while read), durably, into `state` here; never replaces a
    /// replica with a newer stamp ([`StorageError::NewerReplica`]).
    fn copy_replica_from(
        &self,
        src: &dyn Storage,
        block: u64,
        gs: u64,
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError>;
    /// Copies the first `len` bytes of replica `from` (block, stamp) of
    /// `src` (verified while read), durably, into a replica `to` (another
    /// block id and stamp) here, in `state`; `from` is left as it is.
    fn copy_replica_as(
        &self,
        src: &dyn Storage,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError>;
    /// Removes what interrupted copies left; returns how many files.
    fn clean_tmp(&self) -> Result<usize, StorageError>;
    /// Moves every file of `block` into the quarantine instead of deleting
    /// it (see [`super::quarantine`]); returns where it went.
    fn quarantine(&self, block: u64) -> Result<PathBuf, StorageError>;
    /// Copies replica `block`@`gs` into the quarantine, leaving it here.
    fn keep_copy(&self, block: u64, gs: u64) -> Result<PathBuf, StorageError>;
    /// What the quarantine holds, oldest first.
    fn quarantined(&self) -> Result<Vec<Quarantined>, StorageError>;
    /// Removes quarantine entries older than `keep`; returns how many.
    fn expire_quarantine(&self, keep: Duration) -> Result<usize, StorageError>;

    // ---- durability and health --------------------------------------------

    /// Makes a closed replica durable: data, checksums, directory entries.
    fn sync_replica(&self, block: u64, gs: u64) -> Result<(), StorageError>;
    /// One `syncfs(2)` of the datanode's filesystem.
    fn sync_fs(&self) -> Result<(), StorageError>;
    /// The filesystem this datanode lives on: datanodes sharing it share
    /// one [`Self::sync_fs`].
    fn fs_id(&self) -> u64;
    /// Whether [`Self::sync_fs`] makes this datanode's replicas durable
    /// (else each replica needs its own syncs).
    fn syncfs_is_barrier(&self) -> bool;
    /// Whether the datanode's filesystem overwrites a file's allocated
    /// blocks in place, without changing its metadata (ext2/3/4, xfs, and
    /// tmpfs, which keeps nothing anyway): then the writeback of pages
    /// written over zero-filled ones and a cache flush of the device make
    /// them durable ([`SyncPlan::Ranged`]). Not on copy-on-write
    /// filesystems (btrfs, zfs) nor on FUSE, where neither reaches a disk
    /// the way it must.
    fn ranged_sync(&self) -> bool;
    /// Up to how many bytes of packets queued one behind the other a
    /// stream may write to a replica here as one write. A store that
    /// charges a round trip per request (an object store: one PUT each)
    /// wants them merged, or a stream writes one packet per round trip; a
    /// directory gains nothing (each packet is one write into the page
    /// cache) and keeps them apart (0).
    fn merge_writes(&self) -> usize {
        0
    }
    /// The heartbeat probe: still this datanode, and writable; returns the
    /// bytes free. A full disk gives [`StorageError::NoSpace`].
    fn heartbeat(&self) -> Result<u64, StorageError>;
    /// Whether a crash can leave a replica here torn inside (a local
    /// filesystem writes pages, not whole files); not an object store,
    /// where every object was whole when the store acknowledged it.
    fn may_tear(&self) -> bool {
        true
    }
    /// The flush mark (`storage::flushed`): every replica here of a lower
    /// generation stamp is on the disk. `None` when there is none.
    fn flushed_mark(&self) -> Result<Option<u64>, StorageError>;
    /// Puts `gs` in place as the flush mark, durably.
    fn set_flushed_mark(&self, gs: u64) -> Result<(), StorageError>;
    /// Syncs this datanode's filesystem before its flush mark moves up,
    /// through a descriptor of the mark's own: a descriptor reports each
    /// writeback error once, so an error found here is not taken from the
    /// writers' `syncfs` (whose fsync it must fail), and one they found
    /// first is found here too.
    fn sync_for_mark(&self) -> Result<(), StorageError>;
    /// What `df` counts for this datanode: the filesystem under its
    /// directory (by default), or what an object store is said to hold.
    fn capacity(&self) -> Capacity {
        match nix::sys::statvfs::statvfs(self.root()) {
            Ok(s) => Capacity::Fs {
                total: s.blocks().saturating_mul(s.fragment_size()),
                free: s.blocks_available().saturating_mul(s.fragment_size()),
            },
            Err(_) => Capacity::Unknown,
        }
    }
}

/// How much a datanode can hold, as `df` on the mount shows it
/// (docs/SEMANTICS.md, "Object-store datanodes", *Capacity*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// A directory's filesystem: its size and what an unprivileged user
    /// may still write there, in bytes.
    Fs { total: u64, free: u64 },
    /// An object store, which has no size a client can ask: the bytes
    /// `-o s3_capacity=` allows it, `None` when unbounded. What the prefix
    /// holds is not listed for this (a LIST per thousand objects).
    Store { quota: Option<u64> },
    /// Not known now (the directory cannot be read).
    Unknown,
}

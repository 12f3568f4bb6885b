//! [`Faulty`]: a [`Storage`] that passes every operation to a real
//! datanode but delays or fails the ones a test chooses, so that unit tests
//! of the write pipeline, the read path and recovery meet a slow disk, a
//! full one (`ENOSPC`) or a failing one (`EIO`) at an exact step.
//!
//! A fault is armed for one kind of operation ([`Op`]) and strikes after a
//! number of further calls of that kind have passed; it then strikes every
//! call until [`Faulty::heal`]. Calls are counted per kind, struck or not,
//! so a test can also check what the code under test asked for.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::{ReplicaWrite, Storage, SyncPlan, SyncStep, SyncTask};
use super::datanode::Datanode;
use super::error::StorageError;
use super::layout::{DnId, ReplicaInfo, ReplicaStat, ReplicaState};
use super::quarantine::Quarantined;
use super::reader::ReplicaReader;
use crate::metrics::IoCounters;
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering, lock};

/// The kinds of operations a fault can hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `create_rbw`.
    Create,
    /// `reopen_rbw`.
    Reopen,
    /// A packet written through a replica writer.
    Write,
    /// Any sync step below (counted and struck beside the step's own
    /// kind): a writer's sync, `sync_replica`, `sync_fs`. A struck writer's
    /// sync fails in its task, as an `fsync` of the file would.
    Sync,
    /// The start of a writer's sync ([`ReplicaWrite::begin_sync`], which
    /// starts the writeback of a ranged one): it returns the error.
    SyncBegin,
    /// The wait for a ranged sync's writeback (`sync_file_range`,
    /// [`ReplicaWrite::end_ranged`]).
    Writeback,
    /// The cache flush of a datanode's disk after ranged syncs
    /// ([`ReplicaWrite::flush`]).
    Flush,
    /// `fdatasync`/`fsync` of a replica's data or checksum file (a full
    /// sync's file tasks, and `sync_replica`).
    FileSync,
    /// `fsync` of a replica's directory (the first full sync of a writer,
    /// and `sync_replica`).
    DirSync,
    /// `syncfs(2)` of the datanode's filesystem.
    SyncFs,
    /// Zero-filling a writer's files ahead ([`ReplicaWrite::extend_zeroed`]).
    ZeroFill,
    BumpGs,
    /// `finalize` and `finalize_written`.
    Finalize,
    Truncate,
    /// `open_reader`, and so every read.
    Read,
    /// A copy onto this datanode.
    Copy,
    /// `delete` and `delete_recorded`.
    Delete,
    Heartbeat,
}

/// What a fault does to the call it strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fails with this errno (`ENOSPC` becomes [`StorageError::NoSpace`]).
    Fail(i32),
    /// Sleeps this long, then lets the call through.
    Delay(Duration),
    /// Waits until [`Faulty::heal`], then lets the call through: a disk
    /// that hangs until the test says.
    Hold,
    /// As [`Fault::Hold`], for the one call it strikes: the calls after it
    /// go through, so a test can hold one caller while others go on.
    HoldOne,
}

#[derive(Debug)]
struct Armed {
    op: Op,
    fault: Fault,
    /// Calls still to pass before it strikes.
    pass: u64,
}

#[derive(Debug, Default)]
struct Plan {
    armed: Vec<Armed>,
    calls: HashMap<Op, u64>,
    /// How many times the datanode was healed (held calls wait for more).
    heals: u64,
}

/// The faults of one datanode, shared with the writers it opened.
#[derive(Debug, Default)]
struct Faults {
    plan: Mutex<Plan>,
    healed: Condvar,
}

impl Faults {
    /// Counts a call of `op` on `path` and applies the fault that strikes
    /// it, if any.
    fn check(&self, op: Op, path: &Path) -> Result<(), StorageError> {
        let mut plan = lock(&self.plan);
        *plan.calls.entry(op).or_default() += 1;
        let mut fault = None;
        let mut struck = 0;
        for (i, a) in plan
            .armed
            .iter_mut()
            .enumerate()
            .filter(|(_, a)| a.op == op)
        {
            if a.pass > 0 {
                a.pass -= 1;
            } else if fault.is_none() {
                fault = Some(a.fault);
                struck = i;
            }
        }
        if fault == Some(Fault::HoldOne) {
            plan.armed.remove(struck);
        }
        match fault {
            None => Ok(()),
            Some(Fault::Delay(d)) => {
                drop(plan);
                std::thread::sleep(d);
                Ok(())
            }
            Some(Fault::Hold | Fault::HoldOne) => {
                let heals = plan.heals;
                while plan.heals == heals {
                    plan = self.healed.wait(plan).unwrap_or_else(|e| e.into_inner());
                }
                Ok(())
            }
            Some(Fault::Fail(errno)) => {
                Err(StorageError::io(path, io::Error::from_raw_os_error(errno)))
            }
        }
    }
}

/// A datanode whose operations fail or slow down on request.
#[derive(Debug)]
pub struct Faulty {
    inner: Datanode,
    faults: Arc<Faults>,
    /// The filesystem it says it is on (0: the real one's).
    fs_id: AtomicU64,
    /// What it says of [`Storage::merge_writes`] (0: the real one's), so
    /// that a stream's merged writes are tested without an object store.
    merge: AtomicU64,
}

impl Faulty {
    pub fn new(inner: Datanode) -> Faulty {
        Faulty {
            inner,
            faults: Arc::default(),
            fs_id: AtomicU64::new(0),
            merge: AtomicU64::new(0),
        }
    }

    /// Makes it ask for queued packets merged into writes of up to
    /// `bytes`, as an object store does.
    pub fn merge_writes_up_to(&self, bytes: u64) {
        self.merge.store(bytes, Ordering::Relaxed);
    }

    /// Makes it say it is on a filesystem of its own, so that it gets a
    /// `syncfs` and a cache flush of its own (test directories all share
    /// one filesystem).
    pub fn own_filesystem(&self) {
        let own = u64::MAX - u64::from(self.inner.id().0);
        self.fs_id.store(own, Ordering::Relaxed);
    }

    /// Arms `fault` for calls of `op`, striking once `pass` more of them
    /// went through, and every one after that until [`Self::heal`].
    pub fn arm(&self, op: Op, fault: Fault, pass: u64) {
        lock(&self.faults.plan)
            .armed
            .push(Armed { op, fault, pass });
    }

    /// Disarms every fault and lets held calls go on.
    pub fn heal(&self) {
        let mut plan = lock(&self.faults.plan);
        plan.armed.clear();
        plan.heals += 1;
        self.faults.healed.notify_all();
    }

    /// Whether the datanode holds `block` in memory, not yet written.
    pub fn holds(&self, block: u64) -> bool {
        self.inner.holds(block)
    }

    /// Drops the replicas held in memory: what a crash does.
    pub fn lose_held(&self) {
        self.inner.lose_held();
    }

    /// How many calls of `op` were made, struck or not.
    pub fn calls(&self, op: Op) -> u64 {
        lock(&self.faults.plan).calls.get(&op).copied().unwrap_or(0)
    }

    /// The real datanode behind it.
    pub fn inner(&self) -> &Datanode {
        &self.inner
    }

    fn check(&self, op: Op) -> Result<(), StorageError> {
        self.faults.check(op, self.inner.root())
    }

    fn wrap(&self, w: Box<dyn ReplicaWrite>, block: u64) -> Box<dyn ReplicaWrite> {
        Box::new(FaultyWriter {
            inner: w,
            faults: self.faults.clone(),
            path: self.inner.layout().data_path(ReplicaState::Rbw, block),
        })
    }
}

/// A replica writer of a [`Faulty`] datanode.
#[derive(Debug)]
struct FaultyWriter {
    inner: Box<dyn ReplicaWrite>,
    faults: Arc<Faults>,
    path: PathBuf,
}

impl ReplicaWrite for FaultyWriter {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn write_packet(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        self.faults.check(Op::Write, &self.path)?;
        self.inner.write_packet(offset, data, crcs)
    }

    fn write_zeros(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        self.faults.check(Op::Write, &self.path)?;
        self.inner.write_zeros(offset, len, crcs)
    }

    /// A sync struck by [`Op::Sync`] fails in its task, as an `fsync` of
    /// the file would (it is then always a full one); [`Op::SyncBegin`]
    /// fails the call itself; the tasks of a full sync meet
    /// [`Op::FileSync`] and [`Op::DirSync`] when they run.
    fn begin_sync(&mut self, ranged: bool) -> Result<SyncPlan, StorageError> {
        if let Err(e) = self.faults.check(Op::Sync, &self.path) {
            let failed = SyncTask::new(SyncStep::File, move || Err(e));
            return Ok(SyncPlan::Full(vec![failed]));
        }
        self.faults.check(Op::SyncBegin, &self.path)?;
        Ok(match self.inner.begin_sync(ranged)? {
            SyncPlan::Full(tasks) => SyncPlan::Full(
                tasks
                    .into_iter()
                    .map(|t| {
                        let (faults, path) = (self.faults.clone(), self.path.clone());
                        let op = match t.step {
                            SyncStep::File => Op::FileSync,
                            SyncStep::Dir => Op::DirSync,
                        };
                        SyncTask::new(t.step, move || {
                            faults.check(op, &path)?;
                            t.run()
                        })
                    })
                    .collect(),
            ),
            plan => plan,
        })
    }

    fn end_ranged(&self) -> Result<(), StorageError> {
        self.faults.check(Op::Sync, &self.path)?;
        self.faults.check(Op::Writeback, &self.path)?;
        self.inner.end_ranged()
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.faults.check(Op::Sync, &self.path)?;
        self.faults.check(Op::Flush, &self.path)?;
        self.inner.flush()
    }

    fn synced(&mut self) {
        self.inner.synced()
    }

    fn zeroed(&self) -> u64 {
        self.inner.zeroed()
    }

    fn extend_zeroed(&mut self, to: u64) -> Result<(), StorageError> {
        self.faults.check(Op::ZeroFill, &self.path)?;
        self.inner.extend_zeroed(to)
    }

    fn finish(self: Box<Self>) -> Result<u64, StorageError> {
        self.inner.finish()
    }

    fn take_resume_tail(&mut self) -> Vec<u8> {
        self.inner.take_resume_tail()
    }
}

impl Storage for Faulty {
    fn id(&self) -> DnId {
        self.inner.id()
    }

    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn storage_id(&self) -> Option<&str> {
        self.inner.storage_id()
    }

    fn io(&self) -> &Arc<IoCounters> {
        self.inner.io()
    }

    fn create_rbw(&self, block: u64, gs: u64) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        self.check(Op::Create)?;
        Ok(self.wrap(self.inner.create_rbw(block, gs)?, block))
    }

    fn reopen_rbw(
        &self,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        self.check(Op::Reopen)?;
        Ok(self.wrap(self.inner.reopen_rbw(block, gs, len)?, block))
    }

    fn bump_gs(&self, block: u64, old_gs: u64, new_gs: u64) -> Result<(), StorageError> {
        self.check(Op::BumpGs)?;
        self.inner.bump_gs(block, old_gs, new_gs)
    }

    fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        self.check(Op::Finalize)?;
        self.inner.finalize(block, gs, len)
    }

    fn finalize_written(
        &self,
        w: Box<dyn ReplicaWrite>,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        self.check(Op::Finalize)?;
        self.inner.finalize_written(w, block, gs, len)
    }

    /// A create and a packet write at once: struck by faults on either.
    fn write_finalized(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        self.check(Op::Create)?;
        self.check(Op::Write)?;
        self.inner.write_finalized(block, gs, data, crcs)
    }

    /// Struck as [`Self::write_finalized`]; the replica's later write
    /// (`write_out`) by faults on [`Op::Write`].
    fn write_deferred(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<bool, StorageError> {
        self.check(Op::Create)?;
        self.check(Op::Write)?;
        self.inner.write_deferred(block, gs, data, crcs)
    }

    fn write_out(&self, block: u64) -> Result<(), StorageError> {
        if self.inner.holds(block) {
            self.check(Op::Write)?;
        }
        self.inner.write_out(block)
    }

    fn truncate(&self, block: u64, gs: u64, new_gs: u64, len: u64) -> Result<(), StorageError> {
        self.check(Op::Truncate)?;
        self.inner.truncate(block, gs, new_gs, len)
    }

    fn open_reader(&self, block: u64, gs: u64) -> Result<ReplicaReader, StorageError> {
        self.check(Op::Read)?;
        self.inner.open_reader(block, gs)
    }

    fn lookup(&self, block: u64) -> Result<Option<ReplicaInfo>, StorageError> {
        self.inner.lookup(block)
    }

    fn stat_replica(&self, block: u64, gs: u64) -> Result<ReplicaStat, StorageError> {
        self.inner.stat_replica(block, gs)
    }

    fn list(&self) -> Result<Vec<ReplicaInfo>, StorageError> {
        self.inner.list()
    }

    fn delete(&self, block: u64) -> Result<(), StorageError> {
        self.check(Op::Delete)?;
        self.inner.delete(block)
    }

    fn delete_recorded(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        self.check(Op::Delete)?;
        self.inner.delete_recorded(block, gs)
    }

    fn quarantine(&self, block: u64) -> Result<PathBuf, StorageError> {
        self.check(Op::Delete)?;
        self.inner.quarantine(block)
    }

    fn keep_copy(&self, block: u64, gs: u64) -> Result<PathBuf, StorageError> {
        self.check(Op::Copy)?;
        self.inner.keep_copy(block, gs)
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, StorageError> {
        self.inner.quarantined()
    }

    fn expire_quarantine(&self, keep: Duration) -> Result<usize, StorageError> {
        self.inner.expire_quarantine(keep)
    }

    fn copy_replica_from(
        &self,
        src: &dyn Storage,
        block: u64,
        gs: u64,
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.check(Op::Copy)?;
        self.inner.copy_replica_from(src, block, gs, len, state)
    }

    fn copy_replica_as(
        &self,
        src: &dyn Storage,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.check(Op::Copy)?;
        self.inner.copy_replica_as(src, from, to, len, state)
    }

    fn clean_tmp(&self) -> Result<usize, StorageError> {
        self.inner.clean_tmp()
    }

    fn sync_replica(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        self.check(Op::Sync)?;
        self.check(Op::FileSync)?;
        self.check(Op::DirSync)?;
        self.inner.sync_replica(block, gs)
    }

    fn sync_fs(&self) -> Result<(), StorageError> {
        self.check(Op::Sync)?;
        self.check(Op::SyncFs)?;
        self.inner.sync_fs()
    }

    fn fs_id(&self) -> u64 {
        match self.fs_id.load(Ordering::Relaxed) {
            0 => self.inner.fs_id(),
            own => own,
        }
    }

    fn syncfs_is_barrier(&self) -> bool {
        self.inner.syncfs_is_barrier()
    }

    fn ranged_sync(&self) -> bool {
        self.inner.ranged_sync()
    }

    fn merge_writes(&self) -> usize {
        match self.merge.load(Ordering::Relaxed) {
            0 => self.inner.merge_writes(),
            n => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }

    fn heartbeat(&self) -> Result<u64, StorageError> {
        self.check(Op::Heartbeat)?;
        self.inner.heartbeat()
    }

    fn flushed_mark(&self) -> Result<Option<u64>, StorageError> {
        self.inner.flushed_mark()
    }

    fn set_flushed_mark(&self, gs: u64) -> Result<(), StorageError> {
        self.inner.set_flushed_mark(gs)
    }

    fn sync_for_mark(&self) -> Result<(), StorageError> {
        self.check(Op::Sync)?;
        self.check(Op::SyncFs)?;
        self.inner.sync_for_mark()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::checksum::ChunkAccumulator;
    use crate::storage::testkit::{append, dn, read_all, stream};

    #[test]
    fn a_fault_strikes_after_the_calls_it_lets_pass_until_healed() {
        let dir = tempfile::tempdir().unwrap();
        let f = Faulty::new(dn(&dir, 0));
        f.arm(Op::Write, Fault::Fail(libc::ENOSPC), 2);
        let data = stream(3000, 1);
        let mut w = f.create_rbw(1, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut *w, &mut acc, &data[..1000], &[500]);
        let mut crcs = Vec::new();
        acc.clone().crcs_for(1000, &data[1000..1500], &mut crcs);
        let e = w.write_packet(1000, &data[1000..1500], &crcs).unwrap_err();
        assert!(matches!(e, StorageError::NoSpace { .. }), "{e}");
        assert_eq!(w.len(), 1000);
        f.heal();
        w.write_packet(1000, &data[1000..1500], &crcs).unwrap();
        assert_eq!(f.calls(Op::Write), 4);
        assert_eq!(read_all(&f, 1, 1, 3000), &data[..1500]);
        // EIO is an I/O error, on the operation armed only.
        f.arm(Op::Read, Fault::Fail(libc::EIO), 0);
        assert!(matches!(f.valid_prefix(1, 1), Err(StorageError::Io { .. })));
        f.finalize_written(w, 1, 1, 1500).unwrap();
        assert_eq!(f.inner().find(1).unwrap().state, ReplicaState::Finalized);
    }
}

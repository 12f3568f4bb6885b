//! Live statistics of a mount: the counters the request, write and lease
//! paths bump (plain atomics, so counting costs an uncontended add), the
//! [`Snapshot`] of every counter and gauge that `leasefs stats` prints, and
//! the same snapshot in the Prometheus text format (`-o metrics=HOST:PORT`).
//! README "Live statistics" lists the names.
//!
//! Gauges (leases held, packets in flight, datanode space) are not kept up
//! to date on the hot path: they are read from their owners when a
//! snapshot is taken (`fs::stats`).

mod conns;
pub mod histogram;
pub mod http;
pub mod prometheus;
pub mod snapshot;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use self::histogram::Histogram;
pub use self::histogram::HistogramStats;
pub use self::snapshot::{DatanodeStats, Rates, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// The kinds of FUSE request, counted as each arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Readdir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
    Ioctl,
}

impl Op {
    /// Every kind, in the order of [`Op::name`]'s table.
    pub const ALL: [Op; 29] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Readdir,
        Op::Fsyncdir,
        Op::Statfs,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Access,
        Op::Create,
        Op::Fallocate,
        Op::Ioctl,
    ];

    /// The name in `stats` output and the `op` label of
    /// `leasefs_fuse_ops_total`: the FUSE request's own name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Forget => "forget",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Rename => "rename",
            Op::Link => "link",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Readdir => "readdir",
            Op::Fsyncdir => "fsyncdir",
            Op::Statfs => "statfs",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Access => "access",
            Op::Create => "create",
            Op::Fallocate => "fallocate",
            Op::Ioctl => "ioctl",
        }
    }
}

/// Why a lease recovery ran, as counted (the lease manager's reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    SoftLimit,
    HardLimit,
    HolderGone,
    Manual,
}

impl Recovery {
    pub const ALL: [Recovery; 4] = [
        Recovery::SoftLimit,
        Recovery::HardLimit,
        Recovery::HolderGone,
        Recovery::Manual,
    ];

    /// The `reason` label of `leasefs_lease_recoveries_total`.
    pub fn name(self) -> &'static str {
        match self {
            Recovery::SoftLimit => "soft_limit",
            Recovery::HardLimit => "hard_limit",
            Recovery::HolderGone => "holder_gone",
            Recovery::Manual => "manual",
        }
    }
}

/// The counters of one mount. Every method is a relaxed atomic add: the
/// counts are statistics, read at most once a second, and need no order
/// with anything else.
pub struct Metrics {
    started: Instant,
    /// Where the Prometheus endpoint listens, once it does.
    address: OnceLock<String>,
    ops: [AtomicU64; Op::ALL.len()],
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    fsync: Histogram,
    recoveries: [AtomicU64; Recovery::ALL.len()],
    packets_acked: AtomicU64,
    packets_merged: AtomicU64,
    pipeline_recoveries: AtomicU64,
    closes_on_caller: AtomicU64,
    closes_without_commit: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            address: OnceLock::new(),
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            fsync: Histogram::new(histogram::FSYNC_BUCKETS),
            recoveries: std::array::from_fn(|_| AtomicU64::new(0)),
            packets_acked: AtomicU64::new(0),
            packets_merged: AtomicU64::new(0),
            pipeline_recoveries: AtomicU64::new(0),
            closes_on_caller: AtomicU64::new(0),
            closes_without_commit: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// The Prometheus endpoint listens at `addr`.
    pub fn set_address(&self, addr: String) {
        let _ = self.address.set(addr);
    }

    /// A FUSE request of kind `op` arrived.
    pub fn op(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` bytes were accepted by `write()`.
    pub fn written(&self, n: u64) {
        self.bytes_written.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` bytes were returned by `read()`.
    pub fn read(&self, n: u64) {
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }

    /// An `fsync` of a file being written took `took` (from the request to
    /// its reply).
    pub fn fsync_done(&self, took: Duration) {
        self.fsync.observe(took);
    }

    pub fn recovery(&self, why: Recovery) {
        self.recoveries[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A packet was acknowledged by every replica of its pipeline.
    pub fn packet_acked(&self) {
        self.packets_acked.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` queued packets went to the replicas as one write (an object
    /// store's one PUT): the `n - 1` after the first count.
    pub fn packets_merged(&self, n: u64) {
        self.packets_merged
            .fetch_add(n.saturating_sub(1), Ordering::Relaxed);
    }

    /// A close with nothing to send or finalise was committed on the
    /// caller's thread (see `OutputStream::close`).
    pub fn closed_on_caller(&self) {
        self.closes_on_caller.fetch_add(1, Ordering::Relaxed);
    }

    /// A close had nothing to record but the end of the file's time
    /// under construction, left for the store's next commit (see
    /// `BlockMap::close_lazily`).
    pub fn closed_without_commit(&self) {
        self.closes_without_commit.fetch_add(1, Ordering::Relaxed);
    }

    /// A pipeline was rebuilt around a failed replica.
    pub fn pipeline_recovery(&self) {
        self.pipeline_recoveries.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters into `s` (the gauges are the caller's).
    pub fn fill(&self, s: &mut Snapshot) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.uptime_seconds = self.started.elapsed().as_secs_f64();
        s.metrics_address = self.address.get().cloned();
        s.ops = Op::ALL
            .iter()
            .map(|op| (op.name().to_string(), get(&self.ops[*op as usize])))
            .collect();
        s.bytes_written = get(&self.bytes_written);
        s.bytes_read = get(&self.bytes_read);
        s.fsync = self.fsync.stats();
        s.lease_recoveries = Recovery::ALL
            .iter()
            .map(|r| (r.name().to_string(), get(&self.recoveries[*r as usize])))
            .collect();
        s.packets_acked = get(&self.packets_acked);
        s.packets_merged = get(&self.packets_merged);
        s.pipeline_recoveries = get(&self.pipeline_recoveries);
        s.closes_on_caller = get(&self.closes_on_caller);
        s.closes_without_commit = get(&self.closes_without_commit);
    }
}

/// What a mount did with one datanode directory, kept by the datanode so
/// that every path that writes or reads replicas counts there.
#[derive(Debug, Default)]
pub struct IoCounters {
    written: AtomicU64,
    read: AtomicU64,
    errors: AtomicU64,
    fast: [AtomicU64; Fast::SyncedBehindMark as usize + 1],
}

/// Which way replicas were made durable here: the figures that show a
/// test (the power-cut rounds above all) ran the fast paths it guards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPaths {
    /// Syncs of a replica being written that needed only its new pages
    /// written back (`sync_file_range`) and one cache flush of the disk.
    pub syncs_ranged: u64,
    /// Syncs that `fdatasync`ed (or `fsync`ed) data and checksum files.
    pub syncs_full: u64,
    /// Replica stretches zero-filled ahead of their writer.
    pub zero_fills: u64,
    /// Replicas written whole into `finalized/` by the one-step small-file
    /// path.
    pub one_step_replicas: u64,
    /// Replicas of a small file written whole into `finalized/` by its
    /// fsync, before its close (the close then touches no replica).
    pub one_step_synced: u64,
    /// 512-byte chunks read here whose checksums were verified three at a
    /// time ([`crate::storage::checksum::crc3`]).
    pub chunks_batched: u64,
    /// Reads served through a replica reader kept open by the file handle
    /// from an earlier read (no open, and the kernel's own read-ahead of
    /// the replica follows the reader).
    pub readers_reused: u64,
    /// fsyncs whose replicas here were made durable by a `syncfs` that a
    /// concurrent fsync ran ([`crate::pipeline::fs_sync`]).
    pub syncfs_shared: u64,
    /// fsyncs whose metadata commits a `syncfs` of this datanode's
    /// filesystem made durable (the metadata store's WAL lives there too),
    /// with no sync of the WAL of their own.
    pub wal_by_syncfs: u64,
    /// Reads a request thread served from replica bytes and checksums
    /// already in memory, without the blocking pool (`Core::read_any`).
    pub reads_in_memory: u64,
    /// Reads of a finalized replica that went to its disk with `O_DIRECT`,
    /// past the page cache (`storage::direct`).
    pub reads_direct: u64,
    /// Replicas of small blocks whose fsync (or, at R>1, close) committed
    /// the block's bytes to the metadata store's WAL (`pipeline::journal`).
    pub journaled: u64,
    /// Replicas rewritten from the block journal at mount.
    pub journal_replayed: u64,
    /// Journaled replicas kept in memory at their fsync or close and
    /// written at the checkpoint or when first needed (`storage::deferred`).
    pub deferred: u64,
    /// Replicas written since the datanode's flush mark that a mount gave
    /// housekeeping to check, for what a crash may have torn
    /// (`fs::unflushed`).
    pub unflushed_checked: u64,
    /// Replicas of a block open across a move of the flush marks, synced
    /// before their close recorded them (`pipeline::flush_floor`).
    pub synced_behind_mark: u64,
}

/// Indexes into [`IoCounters::fast`].
#[derive(Clone, Copy)]
pub enum Fast {
    SyncRanged,
    SyncFull,
    ZeroFill,
    OneStep,
    OneStepSynced,
    ChunksBatched,
    ReaderReused,
    SyncfsShared,
    WalBySyncfs,
    ReadInMemory,
    ReadDirect,
    Journaled,
    JournalReplayed,
    Deferred,
    UnflushedChecked,
    SyncedBehindMark,
}

impl IoCounters {
    pub fn wrote(&self, n: u64) {
        self.written.fetch_add(n, Ordering::Relaxed);
    }

    pub fn read(&self, n: u64) {
        self.read.fetch_add(n, Ordering::Relaxed);
    }

    /// A replica write, read or sync failed here.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fast(&self, which: Fast) {
        self.fast_n(which, 1);
    }

    /// `n` more of `which`.
    pub fn fast_n(&self, which: Fast, n: u64) {
        if n > 0 {
            self.fast[which as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn fast_paths(&self) -> FastPaths {
        let get = |w: Fast| self.fast[w as usize].load(Ordering::Relaxed);
        FastPaths {
            syncs_ranged: get(Fast::SyncRanged),
            syncs_full: get(Fast::SyncFull),
            zero_fills: get(Fast::ZeroFill),
            one_step_replicas: get(Fast::OneStep),
            one_step_synced: get(Fast::OneStepSynced),
            chunks_batched: get(Fast::ChunksBatched),
            readers_reused: get(Fast::ReaderReused),
            syncfs_shared: get(Fast::SyncfsShared),
            wal_by_syncfs: get(Fast::WalBySyncfs),
            reads_in_memory: get(Fast::ReadInMemory),
            reads_direct: get(Fast::ReadDirect),
            journaled: get(Fast::Journaled),
            journal_replayed: get(Fast::JournalReplayed),
            deferred: get(Fast::Deferred),
            unflushed_checked: get(Fast::UnflushedChecked),
            synced_behind_mark: get(Fast::SyncedBehindMark),
        }
    }

    /// (bytes written, bytes read, errors).
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.read.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

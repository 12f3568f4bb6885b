//! [`Snapshot`]: every counter and gauge of a mount at one moment, as the
//! control socket sends it (`leasefs stats --json` prints it as is), and
//! [`Rates`]: what happened per second between two snapshots, as `stats`
//! shows it (like `iostat`, from consecutive readings).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::histogram::{HistogramStats, delta, quantile};

/// One datanode directory: how it is doing and what the mount did with it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DatanodeStats {
    /// The datanode's id in this mount.
    pub id: String,
    /// Its storage identity, when it has one.
    pub storage_id: Option<String>,
    pub path: String,
    /// `live`, `full`, `dead`, `decommissioning` or `decommissioned` (see
    /// docs/SEMANTICS.md).
    pub state: String,
    /// Size, space used and space free (for unprivileged use) of the
    /// filesystem that holds the directory, as `df` shows it; absent when
    /// it cannot be read (a directory that is gone).
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Replica bytes written and read there by this mount, all paths
    /// (writes, reads, recovery, re-replication, fsck).
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Failed replica writes, reads and syncs there.
    pub errors: u64,
    /// How replicas there were made durable (ranged or full syncs, zero
    /// fills, one-step small files).
    pub syncs_ranged: u64,
    pub syncs_full: u64,
    pub zero_fills: u64,
    pub one_step_replicas: u64,
    /// Of small files written whole by their fsync, before the close.
    pub one_step_synced: u64,
    /// Reads' fast paths there: chunks verified three at a time, reads
    /// through a replica reader kept open by the handle.
    pub chunks_batched: u64,
    pub readers_reused: u64,
    /// fsyncs whose replicas there were made durable by a `syncfs` that
    /// another fsync ran (grouped, `pipeline::fs_sync`).
    pub syncfs_shared: u64,
    /// fsyncs whose metadata commits a `syncfs` of this datanode's
    /// filesystem made durable (the WAL on the same filesystem).
    pub wal_by_syncfs: u64,
    /// Reads served on a request thread from replica bytes in memory.
    pub reads_in_memory: u64,
    /// Replica reads that went to the disk past its page cache.
    pub reads_direct: u64,
    /// Replicas of small blocks whose fsync (or, at R>1, close) the block
    /// journal kept, and replicas rewritten from it at mount.
    pub journaled: u64,
    pub journal_replayed: u64,
    /// Journaled replicas kept in memory until the checkpoint needed them.
    pub deferred: u64,
    /// Replicas written since the flush mark, checked after a mount.
    pub unflushed_checked: u64,
    /// Replicas of blocks open across a move of the flush marks, synced
    /// at their close.
    pub synced_behind_mark: u64,
}

/// Every counter and gauge of a mount. Counters only grow while the
/// daemon runs; rates come from two snapshots. Fields a daemon of another
/// version lacks read as zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Seconds since the daemon started counting.
    pub uptime_seconds: f64,
    /// Where Prometheus text is served (`-o metrics=`), if anywhere.
    pub metrics_address: Option<String>,
    /// FUSE requests received, by kind.
    pub ops: BTreeMap<String, u64>,
    /// Bytes accepted by `write()` and returned by `read()`.
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Latency of `fsync` on files being written (request to reply).
    pub fsync: HistogramStats,
    /// Write leases held or being recovered, and opens waiting for one.
    pub leases_held: u64,
    pub lease_waiters: u64,
    /// Lease recoveries run, by reason.
    pub lease_recoveries: BTreeMap<String, u64>,
    /// Files with an output stream (open for writing).
    pub streams_open: u64,
    /// Packets sent and not yet acknowledged by every replica, all files.
    pub packets_in_flight: u64,
    pub packets_acked: u64,
    /// Packets written to replicas in one write with the packet before
    /// them (see `Storage::merge_writes`).
    pub packets_merged: u64,
    /// Pipelines rebuilt around a failed replica.
    pub pipeline_recoveries: u64,
    /// Closes with nothing to send or finalise (a small file after its
    /// whole fsync), committed on the request's thread.
    pub closes_on_caller: u64,
    /// Closes with nothing to record but the end of the file's time under
    /// construction (a small file closed after its whole fsync), left for
    /// the metadata store's next commit instead of one of their own.
    pub closes_without_commit: u64,
    /// FUSE ring threads that polled for a reply another thread owed
    /// them and got it without sleeping (a cross-CPU wake-up saved), and
    /// that polled in vain and slept (see `fuse_uring_poll`).
    pub ring_polls_answered: u64,
    pub ring_polls_missed: u64,
    /// READs of 256 KiB or more served by a FUSE ring's helper thread,
    /// beside what its main thread served meanwhile; and other requests
    /// that reached an entry a helper held, forwarded to the main thread.
    pub ring_helper_reads: u64,
    pub ring_helper_forwarded: u64,
    /// One-step fsyncs of small files moved, for the call, to the CPUs
    /// that take the metadata store's disk's completion interrupts
    /// (`sync_cpus`).
    pub syncs_on_completion_cpus: u64,
    pub datanodes: Vec<DatanodeStats>,
}

impl Snapshot {
    pub fn ops_total(&self) -> u64 {
        self.ops.values().sum()
    }

    pub fn recoveries_total(&self) -> u64 {
        self.lease_recoveries.values().sum()
    }
}

/// Per second between two snapshots, plus the fsync quantiles of the
/// fsyncs that completed in between.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    pub seconds: f64,
    /// Requests per second by kind, busiest first; kinds with none left out.
    pub ops: Vec<(String, f64)>,
    pub ops_total: f64,
    pub written: f64,
    pub read: f64,
    pub fsyncs: f64,
    pub fsync_p50: Option<f64>,
    pub fsync_p99: Option<f64>,
    pub recoveries: f64,
    pub packets_acked: f64,
    pub pipeline_recoveries: f64,
    /// (written, read, errors) per second of each datanode of `later`, by
    /// position in its list.
    pub datanodes: Vec<(f64, f64, f64)>,
}

/// What happened per second from `earlier` to `later`. Without `earlier`
/// (one snapshot only) the rates are averages since the mount, as
/// `iostat`'s first report is. A counter that went down (the daemon was
/// restarted in between) counts from zero.
pub fn rates(later: &Snapshot, earlier: Option<&Snapshot>) -> Rates {
    let zero = Snapshot::default();
    let e = earlier
        .filter(|e| e.uptime_seconds <= later.uptime_seconds)
        .unwrap_or(&zero);
    let seconds = (later.uptime_seconds - e.uptime_seconds).max(1e-9);
    let per = |now: u64, before: u64| now.saturating_sub(before) as f64 / seconds;
    let mut ops: Vec<(String, f64)> = later
        .ops
        .iter()
        .map(|(k, n)| (k.clone(), per(*n, e.ops.get(k).copied().unwrap_or(0))))
        .filter(|(_, r)| *r > 0.0)
        .collect();
    ops.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let buckets = delta(&later.fsync.buckets, &e.fsync.buckets);
    let fsyncs = later.fsync.count.saturating_sub(e.fsync.count);
    let datanodes = later
        .datanodes
        .iter()
        .map(|d| {
            let b = e
                .datanodes
                .iter()
                .find(|x| x.id == d.id && x.path == d.path);
            let (w, r, x) = b.map_or((0, 0, 0), |b| (b.bytes_written, b.bytes_read, b.errors));
            (
                per(d.bytes_written, w),
                per(d.bytes_read, r),
                per(d.errors, x),
            )
        })
        .collect();
    Rates {
        seconds,
        ops_total: per(later.ops_total(), e.ops_total()),
        ops,
        written: per(later.bytes_written, e.bytes_written),
        read: per(later.bytes_read, e.bytes_read),
        fsyncs: per(later.fsync.count, e.fsync.count),
        fsync_p50: quantile(0.5, &buckets, fsyncs),
        fsync_p99: quantile(0.99, &buckets, fsyncs),
        recoveries: per(later.recoveries_total(), e.recoveries_total()),
        packets_acked: per(later.packets_acked, e.packets_acked),
        pipeline_recoveries: per(later.pipeline_recoveries, e.pipeline_recoveries),
        datanodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(uptime: f64, writes: u64, written: u64) -> Snapshot {
        let mut s = Snapshot {
            uptime_seconds: uptime,
            bytes_written: written,
            ..Snapshot::default()
        };
        s.ops.insert("write".into(), writes);
        s.ops.insert("getattr".into(), 7);
        s.datanodes.push(DatanodeStats {
            id: "0".into(),
            path: "/dn0".into(),
            bytes_written: written * 2,
            ..DatanodeStats::default()
        });
        s
    }

    #[test]
    fn rates_are_differences_over_the_time_between_snapshots() {
        let a = snap(10.0, 100, 1 << 20);
        let b = snap(12.0, 300, 5 << 20);
        let r = rates(&b, Some(&a));
        assert!((r.seconds - 2.0).abs() < 1e-9);
        // getattr did not move: left out.
        assert_eq!(r.ops, vec![("write".to_string(), 100.0)]);
        assert_eq!(r.ops_total, 100.0);
        assert_eq!(r.written, (2 << 20) as f64);
        assert_eq!(r.datanodes, vec![((4 << 20) as f64, 0.0, 0.0)]);
        assert_eq!(r.fsync_p50, None);
    }

    #[test]
    fn one_snapshot_gives_averages_since_the_mount() {
        let r = rates(&snap(4.0, 100, 4096), None);
        assert_eq!(r.written, 1024.0);
        assert_eq!(r.ops[0], ("write".to_string(), 25.0));
        assert_eq!(r.ops[1], ("getattr".to_string(), 1.75));
    }

    #[test]
    fn a_restarted_daemon_counts_from_zero() {
        let a = snap(100.0, 1000, 1 << 30);
        let b = snap(2.0, 10, 2048);
        let r = rates(&b, Some(&a));
        assert_eq!(r.written, 1024.0);
        assert_eq!(r.ops_total, (10 + 7) as f64 / 2.0);
    }

    #[test]
    fn interval_quantiles_come_from_the_fsyncs_in_between() {
        let mut a = snap(1.0, 0, 0);
        a.fsync = HistogramStats {
            count: 100,
            buckets: vec![(0.001, 100), (0.01, 100), (0.1, 100)],
            ..HistogramStats::default()
        };
        let mut b = a.clone();
        b.uptime_seconds = 2.0;
        b.fsync.count = 104;
        b.fsync.buckets = vec![(0.001, 100), (0.01, 103), (0.1, 104)];
        let r = rates(&b, Some(&a));
        assert_eq!(r.fsyncs, 4.0);
        // 3 of the 4 in (1 ms, 10 ms]: the median is in there.
        let p50 = r.fsync_p50.unwrap();
        assert!(p50 > 0.001 && p50 <= 0.01, "{p50}");
        let p99 = r.fsync_p99.unwrap();
        assert!(p99 > 0.01 && p99 <= 0.1, "{p99}");
    }

    #[test]
    fn a_snapshot_survives_json() {
        let s = snap(3.5, 1, 2);
        let back: Snapshot = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}

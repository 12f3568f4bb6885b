//! A [`Snapshot`] in the Prometheus text format (0.0.4), encoded by the
//! `prometheus-client` crate. Every metric name is in [`NAMES`]; counters
//! get their `_total` suffix from the encoder. The same snapshot is what
//! `leasefs stats --json` prints, so both always agree.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::snapshot::Snapshot;

pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A metric: its name as exposed (less `_total`), its type, and its help
/// text, which says what it is for.
pub struct Name {
    pub name: &'static str,
    pub kind: MetricType,
    pub help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Name {
    Name {
        name,
        kind: MetricType::Counter,
        help,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Name {
    Name {
        name,
        kind: MetricType::Gauge,
        help,
    }
}

/// Seconds the daemon has been counting: a reset of every counter shows
/// as this going down.
pub const UPTIME: Name = gauge(
    "leasefs_uptime_seconds",
    "Seconds since the daemon started counting",
);
/// Load by kind of request: what the mount is asked to do.
pub const FUSE_OPS: Name = counter(
    "leasefs_fuse_ops",
    "FUSE requests received, by kind (label op)",
);
/// Write throughput as applications see it (before replication).
pub const WRITTEN: Name = counter("leasefs_written_bytes", "Bytes accepted by write()");
/// Read throughput as applications see it (page-cache hits never reach
/// the daemon and are not counted).
pub const READ: Name = counter("leasefs_read_bytes", "Bytes returned by read()");
/// fsync waits for every replica's disk: its latency is the cost of
/// durability, and its tail shows a slow datanode.
pub const FSYNC: Name = Name {
    name: "leasefs_fsync_duration_seconds",
    kind: MetricType::Histogram,
    help: "fsync latency of files being written, from request to reply",
};
/// Files with a writer: each holds one lease.
pub const LEASES_HELD: Name = gauge(
    "leasefs_leases_held",
    "Write leases held or being recovered",
);
/// Writers queued for a lease (lease_wait): contention.
pub const LEASE_WAITERS: Name = gauge("leasefs_lease_waiters", "Opens waiting for a write lease");
/// Recoveries mean writers died or stopped renewing (label reason:
/// soft_limit, hard_limit, holder_gone, manual).
pub const LEASE_RECOVERIES: Name = counter(
    "leasefs_lease_recoveries",
    "Lease recoveries run, by reason (label reason)",
);
/// Open output streams, one per file being written.
pub const STREAMS: Name = gauge("leasefs_streams_open", "Files open for writing");
/// How far replicas lag behind writers: at max_packets_in_flight per
/// stream, write() blocks (backpressure).
pub const IN_FLIGHT: Name = gauge(
    "leasefs_packets_in_flight",
    "Packets sent to replicas and not yet acknowledged by all of them",
);
/// Packets through the write pipeline.
pub const PACKETS_ACKED: Name = counter(
    "leasefs_packets_acked",
    "Packets acknowledged by every replica of their pipeline",
);
/// Packets that went to the replicas in one write with the one before
/// them (an object store's one PUT for several queued packets).
pub const PACKETS_MERGED: Name = counter(
    "leasefs_packets_merged",
    "Packets written to replicas together with the packet before them",
);
/// Closes with nothing left to send or finalise, committed on the
/// request's thread.
pub const CLOSES_ON_CALLER: Name = counter(
    "leasefs_closes_on_caller",
    "Closes with nothing to send or finalise, committed on the request's thread",
);
/// Closes left for the metadata store's next commit.
pub const CLOSES_WITHOUT_COMMIT: Name = counter(
    "leasefs_closes_without_commit",
    "Closes with nothing to record but the end of the file's time under construction, left for the metadata store's next commit",
);
/// Polls of a FUSE ring's thread for a reply owed to it, by outcome.
pub const RING_POLLS: Name = counter(
    "leasefs_fuse_ring_polls",
    "Polls of a FUSE ring's thread for a reply another thread owed it, by outcome",
);
/// Small files' fsyncs moved to the CPUs of the disk's completion interrupts.
pub const SYNCS_ON_COMPLETION_CPUS: Name = counter(
    "leasefs_syncs_on_completion_cpus",
    "One-step fsyncs of small files made from the CPUs that take the metadata store's disk's completion interrupts",
);
/// What a FUSE ring's second (helper) thread did.
pub const RING_HELPER: Name = counter(
    "leasefs_fuse_ring_helper_requests",
    "Requests a FUSE ring's helper thread took: large READs it served, others it forwarded",
);
/// A replica failed mid-write and its pipeline was rebuilt without it.
pub const PIPELINE_RECOVERIES: Name = counter(
    "leasefs_pipeline_recoveries",
    "Write pipelines rebuilt around a failed replica",
);
/// Which datanodes take new replicas (live), only serve reads (full) or
/// nothing (dead): 1 for the current state, 0 for the others.
pub const DN_STATE: Name = gauge(
    "leasefs_datanode_state",
    "1 for the datanode's state (label state), 0 for the others",
);
pub const DN_CAPACITY: Name = gauge(
    "leasefs_datanode_capacity_bytes",
    "Size of the filesystem holding the datanode",
);
/// Space left decides placement: a datanode without room is full.
pub const DN_USED: Name = gauge(
    "leasefs_datanode_used_bytes",
    "Bytes used on the filesystem holding the datanode",
);
pub const DN_FREE: Name = gauge(
    "leasefs_datanode_free_bytes",
    "Bytes free for unprivileged use on the filesystem holding the datanode",
);
/// Per-datanode I/O shows an unbalanced or slow directory.
pub const DN_WRITTEN: Name = counter(
    "leasefs_datanode_written_bytes",
    "Replica bytes written to the datanode",
);
pub const DN_READ: Name = counter(
    "leasefs_datanode_read_bytes",
    "Replica bytes read from the datanode",
);
/// Failures that leave a datanode out of pipelines or reads.
pub const DN_ERRORS: Name = counter(
    "leasefs_datanode_errors",
    "Failed replica writes, reads and syncs on the datanode",
);
/// Which durability paths ran: ranged syncs and zero fills only on ext4,
/// XFS and tmpfs datanodes; one-step replicas for small files closed whole.
pub const DN_SYNCS_RANGED: Name = counter(
    "leasefs_datanode_syncs_ranged",
    "Replica syncs made by writeback of the new pages and one disk cache flush",
);
pub const DN_SYNCS_FULL: Name = counter(
    "leasefs_datanode_syncs_full",
    "Replica syncs made by fdatasync or fsync of the replica's files",
);
pub const DN_ZERO_FILLS: Name = counter(
    "leasefs_datanode_zero_fills",
    "Replica stretches zero-filled ahead of their writer",
);
pub const DN_ONE_STEP: Name = counter(
    "leasefs_datanode_one_step_replicas",
    "Replicas of small files written whole into finalized/",
);

pub const DN_ONE_STEP_SYNCED: Name = counter(
    "leasefs_datanode_one_step_synced",
    "Replicas of small files written whole into finalized/ by their fsync, before close",
);

pub const DN_JOURNALED: Name = counter(
    "leasefs_datanode_journaled",
    "Replicas of small blocks whose fsync (or, at R>1, close) kept their bytes in the metadata store's WAL (block journal)",
);

pub const DN_JOURNAL_REPLAYED: Name = counter(
    "leasefs_datanode_journal_replayed",
    "Replicas rewritten from the block journal at mount",
);

pub const DN_DEFERRED: Name = counter(
    "leasefs_datanode_deferred",
    "Journaled replicas kept in memory at their fsync or close and written at the checkpoint or when first needed",
);

pub const DN_UNFLUSHED_CHECKED: Name = counter(
    "leasefs_datanode_unflushed_checked",
    "Replicas written since the datanode's flush mark that a mount had housekeeping check by their checksums (what a crash may have torn)",
);

pub const DN_SYNCED_BEHIND_MARK: Name = counter(
    "leasefs_datanode_synced_behind_mark",
    "Replicas of a block open across a move of the flush marks, synced before their close recorded them",
);

pub const DN_CHUNKS_BATCHED: Name = counter(
    "leasefs_datanode_chunks_batched",
    "Replica chunks read whose checksums were verified three at a time",
);
pub const DN_READERS_REUSED: Name = counter(
    "leasefs_datanode_readers_reused",
    "Replica reads through a reader kept open by the file handle",
);
pub const DN_SYNCFS_SHARED: Name = counter(
    "leasefs_datanode_syncfs_shared",
    "fsyncs whose replicas here a syncfs run by a concurrent fsync made durable",
);
pub const DN_WAL_BY_SYNCFS: Name = counter(
    "leasefs_datanode_wal_by_syncfs",
    "fsyncs whose metadata commits a syncfs of this datanode's filesystem made durable",
);
pub const DN_READS_IN_MEMORY: Name = counter(
    "leasefs_datanode_reads_in_memory",
    "Replica reads a request thread served from bytes in memory, without the blocking pool",
);
pub const DN_READS_DIRECT: Name = counter(
    "leasefs_datanode_reads_direct",
    "Replica reads that went to the disk with O_DIRECT, past the datanode's page cache",
);

/// Every metric, in the order they are exposed.
pub const NAMES: &[&Name] = &[
    &UPTIME,
    &FUSE_OPS,
    &WRITTEN,
    &READ,
    &FSYNC,
    &LEASES_HELD,
    &LEASE_WAITERS,
    &LEASE_RECOVERIES,
    &STREAMS,
    &IN_FLIGHT,
    &PACKETS_ACKED,
    &PACKETS_MERGED,
    &PIPELINE_RECOVERIES,
    &CLOSES_ON_CALLER,
    &CLOSES_WITHOUT_COMMIT,
    &SYNCS_ON_COMPLETION_CPUS,
    &RING_POLLS,
    &RING_HELPER,
    &DN_STATE,
    &DN_CAPACITY,
    &DN_USED,
    &DN_FREE,
    &DN_WRITTEN,
    &DN_READ,
    &DN_ERRORS,
    &DN_SYNCS_RANGED,
    &DN_SYNCS_FULL,
    &DN_ZERO_FILLS,
    &DN_ONE_STEP,
    &DN_ONE_STEP_SYNCED,
    &DN_CHUNKS_BATCHED,
    &DN_READERS_REUSED,
    &DN_SYNCFS_SHARED,
    &DN_WAL_BY_SYNCFS,
    &DN_READS_IN_MEMORY,
    &DN_READS_DIRECT,
    &DN_JOURNALED,
    &DN_JOURNAL_REPLAYED,
];

/// The states `leasefs_datanode_state` always lists.
const DN_STATES: &[&str] = &[
    "live",
    "full",
    "dead",
    "decommissioning",
    "decommissioned",
    "elsewhere",
];

/// The snapshot of one scrape.
#[derive(Debug)]
struct Scrape(Snapshot);

fn metric<'a>(
    enc: &'a mut DescriptorEncoder,
    n: &'a Name,
) -> Result<MetricEncoder<'a>, std::fmt::Error> {
    enc.encode_descriptor(n.name, n.help, None, n.kind)
}

fn one_counter(enc: &mut DescriptorEncoder, n: &Name, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(metric(enc, n)?)
}

fn one_gauge(enc: &mut DescriptorEncoder, n: &Name, v: i64) -> std::fmt::Result {
    ConstGauge::new(v).encode(metric(enc, n)?)
}

fn gauge_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        ConstGauge::new(s.uptime_seconds).encode(metric(&mut enc, &UPTIME)?)?;
        {
            let mut m = metric(&mut enc, &FUSE_OPS)?;
            for (op, n) in &s.ops {
                ConstCounter::new(*n).encode(m.encode_family(&[("op", op.as_str())])?)?;
            }
        }
        one_counter(&mut enc, &WRITTEN, s.bytes_written)?;
        one_counter(&mut enc, &READ, s.bytes_read)?;
        {
            // The encoder wants each bucket's own count, not cumulative.
            let mut below = 0;
            let own: Vec<(f64, u64)> = s
                .fsync
                .buckets
                .iter()
                .map(|&(b, cum)| {
                    let n = cum.saturating_sub(below);
                    below = cum;
                    (b, n)
                })
                .collect();
            metric(&mut enc, &FSYNC)?.encode_histogram::<NoLabelSet>(
                s.fsync.sum_seconds,
                s.fsync.count,
                &own,
                None,
            )?;
        }
        one_gauge(&mut enc, &LEASES_HELD, gauge_of(s.leases_held))?;
        one_gauge(&mut enc, &LEASE_WAITERS, gauge_of(s.lease_waiters))?;
        {
            let mut m = metric(&mut enc, &LEASE_RECOVERIES)?;
            for (why, n) in &s.lease_recoveries {
                ConstCounter::new(*n).encode(m.encode_family(&[("reason", why.as_str())])?)?;
            }
        }
        one_gauge(&mut enc, &STREAMS, gauge_of(s.streams_open))?;
        one_gauge(&mut enc, &IN_FLIGHT, gauge_of(s.packets_in_flight))?;
        one_counter(&mut enc, &PACKETS_ACKED, s.packets_acked)?;
        one_counter(&mut enc, &PACKETS_MERGED, s.packets_merged)?;
        one_counter(&mut enc, &PIPELINE_RECOVERIES, s.pipeline_recoveries)?;
        one_counter(&mut enc, &CLOSES_ON_CALLER, s.closes_on_caller)?;
        one_counter(&mut enc, &CLOSES_WITHOUT_COMMIT, s.closes_without_commit)?;
        one_counter(
            &mut enc,
            &SYNCS_ON_COMPLETION_CPUS,
            s.syncs_on_completion_cpus,
        )?;
        {
            let mut m = metric(&mut enc, &RING_POLLS)?;
            for (outcome, n) in [
                ("answered", s.ring_polls_answered),
                ("missed", s.ring_polls_missed),
            ] {
                ConstCounter::new(n).encode(m.encode_family(&[("outcome", outcome)])?)?;
            }
        }
        {
            let mut m = metric(&mut enc, &RING_HELPER)?;
            for (kind, n) in [
                ("read", s.ring_helper_reads),
                ("forwarded", s.ring_helper_forwarded),
            ] {
                ConstCounter::new(n).encode(m.encode_family(&[("kind", kind)])?)?;
            }
        }
        self.encode_datanodes(&mut enc)
    }
}

impl Scrape {
    fn encode_datanodes(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let dns = &self.0.datanodes;
        let labels = |d: &super::DatanodeStats| {
            vec![
                ("datanode", d.id.clone()),
                ("path", d.path.clone()),
                ("storage_id", d.storage_id.clone().unwrap_or_default()),
            ]
        };
        {
            let mut m = metric(enc, &DN_STATE)?;
            for d in dns {
                let mut states: Vec<&str> = DN_STATES.to_vec();
                if !states.contains(&d.state.as_str()) {
                    states.push(&d.state);
                }
                for st in states {
                    let mut l = labels(d);
                    l.push(("state", st.to_string()));
                    ConstGauge::new(i64::from(st == d.state)).encode(m.encode_family(&l)?)?;
                }
            }
        }
        type Field = fn(&super::DatanodeStats) -> Option<u64>;
        let gauges: [(&Name, Field); 3] = [
            (&DN_CAPACITY, |d| d.capacity_bytes),
            (&DN_USED, |d| d.used_bytes),
            (&DN_FREE, |d| d.free_bytes),
        ];
        for (n, get) in gauges {
            let mut m = metric(enc, n)?;
            for d in dns {
                if let Some(v) = get(d) {
                    ConstGauge::new(gauge_of(v)).encode(m.encode_family(&labels(d))?)?;
                }
            }
        }
        let counters: [(&Name, Field); 19] = [
            (&DN_WRITTEN, |d| Some(d.bytes_written)),
            (&DN_READ, |d| Some(d.bytes_read)),
            (&DN_ERRORS, |d| Some(d.errors)),
            (&DN_SYNCS_RANGED, |d| Some(d.syncs_ranged)),
            (&DN_SYNCS_FULL, |d| Some(d.syncs_full)),
            (&DN_ZERO_FILLS, |d| Some(d.zero_fills)),
            (&DN_ONE_STEP, |d| Some(d.one_step_replicas)),
            (&DN_ONE_STEP_SYNCED, |d| Some(d.one_step_synced)),
            (&DN_CHUNKS_BATCHED, |d| Some(d.chunks_batched)),
            (&DN_READERS_REUSED, |d| Some(d.readers_reused)),
            (&DN_SYNCFS_SHARED, |d| Some(d.syncfs_shared)),
            (&DN_WAL_BY_SYNCFS, |d| Some(d.wal_by_syncfs)),
            (&DN_READS_IN_MEMORY, |d| Some(d.reads_in_memory)),
            (&DN_READS_DIRECT, |d| Some(d.reads_direct)),
            (&DN_JOURNALED, |d| Some(d.journaled)),
            (&DN_JOURNAL_REPLAYED, |d| Some(d.journal_replayed)),
            (&DN_DEFERRED, |d| Some(d.deferred)),
            (&DN_UNFLUSHED_CHECKED, |d| Some(d.unflushed_checked)),
            (&DN_SYNCED_BEHIND_MARK, |d| Some(d.synced_behind_mark)),
        ];
        for (n, get) in counters {
            let mut m = metric(enc, n)?;
            for d in dns {
                let v = get(d).unwrap_or(0);
                ConstCounter::new(v).encode(m.encode_family(&labels(d))?)?;
            }
        }
        Ok(())
    }
}

/// The Prometheus text of `s`.
pub fn encode(s: Snapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(s)));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{DatanodeStats, HistogramStats};

    fn sample() -> Snapshot {
        let mut s = Snapshot {
            uptime_seconds: 2.5,
            bytes_written: 4096,
            leases_held: 1,
            fsync: HistogramStats {
                count: 3,
                sum_seconds: 0.006,
                buckets: vec![(0.001, 1), (0.01, 3)],
                ..HistogramStats::default()
            },
            ..Snapshot::default()
        };
        s.ops.insert("write".into(), 8);
        s.lease_recoveries.insert("manual".into(), 1);
        s.datanodes.push(DatanodeStats {
            id: "0".into(),
            path: "/srv/dn \"a\"".into(),
            state: "full".into(),
            free_bytes: Some(10),
            bytes_written: 8192,
            ..DatanodeStats::default()
        });
        s
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        let text = encode(sample()).unwrap();
        for line in [
            "# TYPE leasefs_fuse_ops_total counter",
            "leasefs_fuse_ops_total{op=\"write\"} 8",
            "leasefs_written_bytes_total 4096",
            "leasefs_leases_held 1",
            "leasefs_lease_recoveries_total{reason=\"manual\"} 1",
            "leasefs_fsync_duration_seconds_bucket{le=\"0.001\"} 1",
            "leasefs_fsync_duration_seconds_bucket{le=\"0.01\"} 3",
            "leasefs_fsync_duration_seconds_bucket{le=\"+Inf\"} 3",
            "leasefs_fsync_duration_seconds_count 3",
            "leasefs_uptime_seconds 2.5",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // Label values are escaped; the state set has one 1.
        let dn = "datanode=\"0\",path=\"/srv/dn \\\"a\\\"\",storage_id=\"\"";
        for line in [
            format!("leasefs_datanode_state{{{dn},state=\"full\"}} 1"),
            format!("leasefs_datanode_state{{{dn},state=\"live\"}} 0"),
            format!("leasefs_datanode_free_bytes{{{dn}}} 10"),
            format!("leasefs_datanode_written_bytes_total{{{dn}}} 8192"),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // A gauge it could not read is left out rather than shown as 0.
        assert!(!text.contains("leasefs_datanode_used_bytes{"));
        for n in NAMES {
            assert!(n.name.starts_with("leasefs_"));
            assert!(!n.name.ends_with("_total"), "{}", n.name);
            assert!(text.contains(&format!("# HELP {}", n.name)), "{}", n.name);
        }
    }
}

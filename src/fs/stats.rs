//! [`Core::stats`]: the mount's counters (kept in `metrics` by the request,
//! write and lease paths) and its gauges, read from their owners at the
//! moment of the snapshot (leases, open streams, datanodes), so that
//! nothing on the hot path maintains a gauge.

use std::path::Path;

use super::core::Core;
use crate::metrics::{DatanodeStats, Snapshot};

impl Core {
    /// Every counter and gauge of the mount now (`leasefs stats`, the
    /// Prometheus endpoint). Costs O(open files + waiters + datanodes) and
    /// a `statvfs` per datanode: call it off the request threads.
    pub fn stats(&self) -> Snapshot {
        let mut s = Snapshot::default();
        self.ctx.metrics.fill(&mut s);
        let polls = fuser::ring_polls();
        s.ring_polls_answered = polls.answered;
        s.ring_polls_missed = polls.missed;
        let helpers = fuser::ring_helpers();
        s.ring_helper_reads = helpers.reads;
        s.ring_helper_forwarded = helpers.forwarded;
        s.syncs_on_completion_cpus = crate::sync_cpus::moved();
        s.leases_held = self.leases.len() as u64;
        s.lease_waiters = self.leases.waiting().len() as u64;
        for stream in self.handles.streams() {
            s.streams_open += 1;
            s.packets_in_flight += stream.stats().in_flight as u64;
        }
        s.datanodes = self
            .dns()
            .statuses()
            .into_iter()
            .map(|d| {
                // A recorded datanode not attached in this mount did no
                // I/O here, and its directory may hold something else.
                let node = self.dns().get(d.id);
                let (written, read, errors) = node.as_ref().map_or((0, 0, 0), |n| n.io().get());
                let fast = node
                    .as_ref()
                    .map(|n| n.io().fast_paths())
                    .unwrap_or_default();
                let space = node.and_then(|n| space(n.root()));
                DatanodeStats {
                    id: d.id.to_string(),
                    state: d.state_name().into(),
                    storage_id: d.storage_id,
                    path: d.path.display().to_string(),
                    capacity_bytes: space.map(|s| s.0),
                    used_bytes: space.map(|s| s.1),
                    free_bytes: space.map(|s| s.2),
                    bytes_written: written,
                    bytes_read: read,
                    errors,
                    syncs_ranged: fast.syncs_ranged,
                    syncs_full: fast.syncs_full,
                    zero_fills: fast.zero_fills,
                    one_step_replicas: fast.one_step_replicas,
                    one_step_synced: fast.one_step_synced,
                    chunks_batched: fast.chunks_batched,
                    readers_reused: fast.readers_reused,
                    syncfs_shared: fast.syncfs_shared,
                    wal_by_syncfs: fast.wal_by_syncfs,
                    reads_in_memory: fast.reads_in_memory,
                    reads_direct: fast.reads_direct,
                    journaled: fast.journaled,
                    journal_replayed: fast.journal_replayed,
                    deferred: fast.deferred,
                    unflushed_checked: fast.unflushed_checked,
                    synced_behind_mark: fast.synced_behind_mark,
                }
            })
            .collect();
        s
    }
}

/// (size, used, free for unprivileged use) of the filesystem holding
/// `dir`, as `df` counts them.
fn space(dir: &Path) -> Option<(u64, u64, u64)> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let unit = st.fragment_size() as u64;
    let size = (st.blocks() as u64).saturating_mul(unit);
    let free = (st.blocks_free() as u64).saturating_mul(unit);
    let avail = (st.blocks_available() as u64).saturating_mul(unit);
    Some((size, size.saturating_sub(free), avail))
}

//! The open block of a stream and its pipeline: one [`ReplicaOut`] per
//! datanode, written in turn for each packet, and pipeline recovery when
//! one of them fails.
//!
//! Replicas are written one after the other by the stream's one streamer
//! thread: on one machine the copies go to the page cache, so a chain of
//! threads would add wake-ups without adding safety.

use super::ctx::StreamFile;
use super::datanodes::FULL_BELOW;
use super::outcome::FileOutcome;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Counter, DnId};
use crate::storage::{ChunkAccumulator, ReplicaState, ReplicaWrite, StorageError};

/// One replica of the open block: its datanode and its open files.
#[derive(Debug)]
pub(crate) struct ReplicaOut {
    pub dn: DnId,
    pub w: Box<dyn ReplicaWrite>,
}

/// The block being written.
pub(crate) struct OpenBlock {
    /// Its row as last recorded (stamp, length so far, replicas).
    pub row: BlockRow,
    /// File offset of the block's first byte.
    pub start: u64,
    pub replicas: Vec<ReplicaOut>,
    /// The checksum state of its last chunk.
    pub acc: ChunkAccumulator,
    /// Every replica synced since the last byte was written.
    pub synced: bool,
}

/// What a packet puts on the replicas.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Data(&'a [u8]),
    /// This many zero bytes, written as a hole.
    Zeros(u64),
}

impl Payload<'_> {
    fn len(&self) -> u64 {
        match self {
            Payload::Data(d) => d.len() as u64,
            Payload::Zeros(n) => *n,
        }
    }
}

/// The datanodes of `replicas`, in pipeline order.
pub(crate) fn datanodes_of(replicas: &[ReplicaOut]) -> Vec<DnId> {
    replicas.iter().map(|r| r.dn).collect()
}

fn all_failed(block: u64) -> FsError {
    FsError::Io(format!("every replica of block {block} failed"))
}

impl OpenBlock {
    /// Writes `data`, at `boff` in the block, to every replica (`crcs` its
    /// checksums). A replica that fails, or whose datanode failed its
    /// heartbeat, leaves the pipeline first, and the packet is written
    /// again to the rebuilt one: the writer sees an error only when no
    /// replica is left.
    pub fn write(&mut self, f: &StreamFile, boff: u64, data: &[u8], crcs: &[u32]) -> FsResult<()> {
        self.put(f, boff, Payload::Data(data), crcs)
    }

    /// [`Self::write`] of `len` zeros as a hole on every replica
    /// ([`ReplicaWrite::write_zeros`]): truncate growth.
    pub fn write_zeros(
        &mut self,
        f: &StreamFile,
        boff: u64,
        len: u64,
        crcs: &[u32],
    ) -> FsResult<()> {
        self.put(f, boff, Payload::Zeros(len), crcs)
    }

    fn put(&mut self, f: &StreamFile, boff: u64, what: Payload<'_>, crcs: &[u32]) -> FsResult<()> {
        let dns = &f.ctx.dns;
        // A datanode that failed its heartbeat (directory gone, disk
        // unwritable) leaves the pipeline before the next packet.
        while let Some(k) = self.replicas.iter().position(|r| !dns.is_alive(r.dn)) {
            tracing::warn!(
                ino = f.ino,
                datanode = %self.replicas[k].dn,
                "dead datanode leaves the pipeline"
            );
            self.rebuild(f, k, boff)?;
        }
        loop {
            let mut failed = None;
            for (k, r) in self.replicas.iter_mut().enumerate() {
                let wrote = match what {
                    Payload::Data(data) => r.w.write_packet(boff, data, crcs),
                    Payload::Zeros(len) => r.w.write_zeros(boff, len, crcs),
                };
                if let Err(e) = wrote {
                    tracing::warn!(ino = f.ino, datanode = %r.dn, "replica write failed: {e}");
                    // ENOSPC: full (still readable), not dead.
                    dns.mark_failed(r.dn, &e);
                    failed = Some(k);
                    break;
                }
            }
            match failed {
                None => break,
                Some(k) => self.rebuild(f, k, boff)?,
            }
        }
        self.row.len = boff + what.len();
        self.synced = false;
        Ok(())
    }

    /// Pipeline recovery: drop the failed replica, bump the generation
    /// stamp on the survivors (so the dropped one is recognisably stale),
    /// add a spare holding the acknowledged prefix where one exists, and
    /// cut every replica back to that prefix (`acked` bytes of the block)
    /// so the packet can be resent.
    fn rebuild(&mut self, f: &StreamFile, failed: usize, acked: u64) -> FsResult<()> {
        let bad_dn = self.replicas.remove(failed).dn;
        f.ctx.metrics.pipeline_recovery();
        let dns = &f.ctx.dns;
        let block = self.row.block_id;
        // A host's copy alone does not carry on a block: it counts toward
        // nothing and no other host can read it.
        if !dns.any_shared(&datanodes_of(&self.replicas)) {
            return Err(all_failed(block));
        }
        // Recorded first, durably: the new stamp, and the survivors as the
        // block's replicas (the failed one leaves it). The survivors'
        // stamps then follow; one that a crash keeps behind lags the
        // record, which recovery accepts from a member of the block.
        let old_gs = self.row.gs;
        let new_gs = f.ctx.meta.alloc(Counter::GenStamp)?;
        self.row.gs = new_gs;
        self.row.replicas = datanodes_of(&self.replicas);
        f.log
            .record(FileOutcome::Changed(std::slice::from_ref(&self.row)), true)?;
        let mut replicas = Vec::new();
        for ReplicaOut { dn, w } in std::mem::take(&mut self.replicas) {
            drop(w);
            let Some(node) = dns.get(dn) else { continue };
            let r = node
                .bump_gs(block, old_gs, new_gs)
                .and_then(|_| node.reopen_rbw(block, new_gs, acked));
            match r {
                Ok(w) => replicas.push(ReplicaOut { dn, w }),
                Err(e) => {
                    tracing::warn!(datanode = %dn, "dropping replica during pipeline recovery: {e}");
                    dns.mark_failed(dn, &e);
                }
            }
        }
        let mut used = datanodes_of(&replicas);
        used.push(bad_dn);
        if let Some(src_dn) = replicas.first().map(|r| r.dn)
            && dns.shared_count(&datanodes_of(&replicas)) < dns.replication
        {
            // Spares with room for the acknowledged prefix and more, tried
            // in turn until the pipeline is whole again (a full datanode is
            // left out, and one that fills during the copy is passed over).
            let room = acked.saturating_add(FULL_BELOW);
            for spare in dns.choose_with_room(dns.len(), &used, room) {
                if dns.shared_count(&datanodes_of(&replicas)) >= dns.replication {
                    break;
                }
                let (Some(src), Some(dst)) = (dns.get(src_dn), dns.get(spare)) else {
                    continue;
                };
                let r = dst
                    .copy_replica_from(&*src, block, new_gs, acked, ReplicaState::Rbw)
                    .and_then(|_| dst.reopen_rbw(block, new_gs, acked));
                match r {
                    Ok(w) => replicas.push(ReplicaOut { dn: spare, w }),
                    Err(e) => {
                        tracing::warn!(datanode = %spare, "spare datanode failed: {e}");
                        if matches!(e, StorageError::NoSpace { .. }) {
                            dns.mark_failed(spare, &e);
                        }
                    }
                }
            }
        }
        if !dns.any_shared(&datanodes_of(&replicas)) {
            return Err(all_failed(block));
        }
        self.row.replicas = datanodes_of(&replicas);
        self.replicas = replicas;
        self.synced = false;
        tracing::warn!(
            ino = f.ino,
            block,
            gs = new_gs,
            replicas = ?self.row.replicas,
            "pipeline rebuilt"
        );
        // (Spares need no sync of this record: one lost leaves an orphan
        // copy, never a block without its data.)
        f.log
            .record(FileOutcome::Changed(std::slice::from_ref(&self.row)), false)
            .map(drop)
    }
}

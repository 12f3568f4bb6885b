//! The read path: bytes come from the first replica whose checksums
//! verify; a corrupt, stale or missing replica is skipped, logged and
//! remembered for `fsck`.

use std::collections::BTreeSet;

use super::datanodes::Datanodes;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, DnId};
use crate::storage::StorageError;
use crate::sync::{Mutex, lock};

/// Replicas that failed a read, as (block id, datanode).
#[derive(Default)]
pub struct BadReplicas {
    set: Mutex<BTreeSet<(u64, DnId)>>,
}

impl BadReplicas {
    pub fn report(&self, block: u64, dn: DnId) {
        lock(&self.set).insert((block, dn));
    }
    pub fn list(&self) -> Vec<(u64, DnId)> {
        lock(&self.set).iter().copied().collect()
    }
    pub fn clear(&self, block: u64, dn: DnId) {
        lock(&self.set).remove(&(block, dn));
    }
}

/// A replica a read passed over because it was missing or had another
/// generation stamp: bad only if the block list still names it afterwards.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub block: u64,
    pub gs: u64,
    pub dn: DnId,
    pub why: String,
}

/// Reads up to `size` bytes at `offset` of a file of `len` visible bytes
/// made of `blocks` of `block_size`; replicas passed over as missing or
/// stale are added to `skipped`.
#[allow(clippy::too_many_arguments)]
pub fn read(
    dns: &Datanodes,
    bad: &BadReplicas,
    blocks: &[BlockRow],
    block_size: u64,
    len: u64,
    offset: u64,
    size: usize,
    skipped: &mut Vec<Skipped>,
) -> FsResult<Vec<u8>> {
    if offset >= len {
        return Ok(Vec::new());
    }
    let end = len.min(offset + size as u64);
    let mut out = vec![0u8; (end - offset) as usize];
    let mut pos = offset;
    while pos < end {
        let idx = pos / block_size;
        let bstart = idx * block_size;
        let n = ((bstart + block_size).min(end) - pos) as usize;
        let dst = &mut out[(pos - offset) as usize..][..n];
        match blocks.iter().find(|b| b.idx == idx) {
            // A hole (grown by truncate before any block existed) reads as zeros.
            None => dst.fill(0),
            Some(b) => read_block(dns, bad, b, pos - bstart, dst, skipped)?,
        }
        pos += n as u64;
    }
    Ok(out)
}

fn read_block(
    dns: &Datanodes,
    bad: &BadReplicas,
    b: &BlockRow,
    off: u64,
    dst: &mut [u8],
    skipped: &mut Vec<Skipped>,
) -> FsResult<()> {
    let mut last_err = None;
    let mut moved = false;
    for &dn in &b.replicas {
        let Some(node) = dns.get(dn) else { continue };
        // An rbw replica may be appended to while we read it: its last
        // chunk's data and checksum are written one after the other, so a
        // mismatch there is retried before the replica is called corrupt.
        let tries = if b.finalized { 1 } else { 3 };
        for attempt in 0..tries {
            match node.read(b.block_id, b.gs, off, dst) {
                Ok(got) if got >= dst.len() => return Ok(()),
                Ok(got) => {
                    last_err = Some(format!("short read ({got} of {} bytes)", dst.len()));
                    if attempt + 1 == tries {
                        report(bad, b, dn, last_err.as_deref().unwrap_or(""));
                    }
                }
                Err(e @ StorageError::Corrupt { .. }) if attempt + 1 < tries => {
                    last_err = Some(e.to_string());
                    std::thread::yield_now();
                }
                // The block moved on (a writer reopened it for append, or
                // pipeline recovery bumped its generation stamp) since the
                // caller read the block list: not a bad replica; the caller
                // retries with a fresh list.
                Err(e @ (StorageError::StaleGenStamp { .. } | StorageError::Missing { .. })) => {
                    last_err = Some(e.to_string());
                    skipped.push(Skipped {
                        block: b.block_id,
                        gs: b.gs,
                        dn,
                        why: e.to_string(),
                    });
                    moved = true;
                    break;
                }
                Err(e) => {
                    last_err = Some(e.to_string());
                    report(bad, b, dn, &e.to_string());
                    break;
                }
            }
        }
    }
    let why = format!(
        "no good replica of block {}: {}",
        b.block_id,
        last_err.unwrap_or_else(|| "no replicas".into())
    );
    if moved {
        return Err(FsError::Moved(why));
    }
    Err(FsError::Io(why))
}

fn report(bad: &BadReplicas, b: &BlockRow, dn: DnId, why: &str) {
    report_replica(bad, b.block_id, dn, why)
}

pub fn report_replica(bad: &BadReplicas, block: u64, dn: DnId, why: &str) {
    tracing::warn!(block, datanode = %dn, "bad replica skipped: {why}");
    bad.report(block, dn);
}

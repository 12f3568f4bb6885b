//! Lease (block) recovery: bring the last, unfinished block of a file to
//! one consistent length on every live replica, finalise it under a new
//! generation stamp and close the file. Run when a lease is preempted,
//! past the hard limit, on `recover-lease`, and at mount for files whose
//! holder died with the previous daemon.
//!
//! The outcome is recorded, durably, before any replica is cut or
//! restamped (and before any is deleted), as HDFS's NameNode records a
//! new generation stamp before datanodes use it: a crash in between leaves
//! replicas whose stamps lag the record. So a replica the block lists
//! counts even with a lagging stamp when no replica reached the record
//! (never one whose stamp leads it; a replica dropped from a pipeline
//! leaves the list: the list is the membership).

use super::datanodes::Datanodes;
use crate::error::{FsError, FsResult};
use crate::meta::{Change, Counter, DnId, Meta, now_ns};

/// A replica recovery found usable: its datanode, the stamp it carries
/// and the length of its valid prefix.
struct Survivor {
    dn: DnId,
    gs: u64,
    valid: u64,
}

/// Recovers file `ino`; returns its final length.
pub fn recover_file(meta: &dyn Meta, dns: &Datanodes, ino: u64) -> FsResult<u64> {
    let inode = meta.get(ino)?;
    let blocks = meta.blocks(ino)?;
    let bs = inode.block_size.max(1);
    let Some(last) = blocks.iter().rev().find(|b| !b.finalized).cloned() else {
        meta.commit(&[Change::DelUc(ino)], false)?;
        return Ok(inode.size);
    };
    // The longest prefix every listed replica holds with valid checksums.
    // (A datanode marked dead may still hold a readable replica: every
    // replica found counts.)
    let mut survivors = Vec::new();
    for &dn in &last.replicas {
        let Some(node) = dns.get(dn) else { continue };
        match node.find(last.block_id) {
            Some(info) if info.gs <= last.gs => match node.valid_prefix(last.block_id, info.gs) {
                Ok(valid) => survivors.push(Survivor {
                    dn,
                    gs: info.gs,
                    valid,
                }),
                Err(e) => tracing::warn!(datanode = %dn, "replica unusable in recovery: {e}"),
            },
            Some(info) => tracing::warn!(
                datanode = %dn,
                found = info.gs,
                recorded = last.gs,
                "replica with a stamp the metadata never recorded ignored in recovery"
            ),
            None => tracing::warn!(
                datanode = %dn,
                block = last.block_id,
                "replica missing in recovery"
            ),
        }
    }
    // Replicas at the recorded stamp, if any reached it; lagging ones only
    // when none did (a crash between the record and every replica).
    if survivors.iter().any(|r| r.gs == last.gs) {
        survivors.retain(|r| {
            let keep = r.gs == last.gs;
            if !keep {
                tracing::warn!(
                    datanode = %r.dn,
                    found = r.gs,
                    "lagging replica left out of recovery"
                );
            }
            keep
        });
    }
    let start = last.idx * bs;
    // No replica could be read, but some sit on datanodes that are not
    // attached or failing: their bytes may be there. Dropping the block
    // now would be a guess; the file stays under construction until they
    // come back (or the operator removes them: a removed
    // datanode's replicas are gone for good).
    let unreachable: Vec<_> = last
        .replicas
        .iter()
        .filter(|d| dns.is_recorded(**d) && (dns.get(**d).is_none() || !dns.is_alive(**d)))
        .collect();
    if survivors.is_empty() && !unreachable.is_empty() {
        return Err(FsError::Io(format!(
            "no replica of block {} could be read, and some are on dead datanodes ({}): recovery waits for them",
            last.block_id,
            unreachable
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let len = survivors.iter().map(|r| r.valid).min().unwrap_or(0);
    if len == 0 {
        // Nothing of the block survived, or it never held a byte: the
        // file ends where the block began, and the block goes. (A stream
        // relies on this: no block lies past a closed file's end.)
        let gone = meta.commit(
            &[
                Change::DropBlocksFrom {
                    ino,
                    from: last.idx,
                },
                Change::SetSize {
                    ino,
                    size: start,
                    touch: Some(now_ns()),
                },
                Change::DelUc(ino),
            ],
            true,
        )?;
        dns.delete_blocks(&gone);
        tracing::warn!(
            ino,
            "recovery found no byte of the last block; length {start}"
        );
        return Ok(start);
    }
    let new_gs = meta.alloc(Counter::GenStamp)?;
    let mut row = last.clone();
    row.gs = new_gs;
    row.len = len;
    row.finalized = true;
    row.replicas = survivors.iter().map(|r| r.dn).collect();
    let size = start + len;
    let gone = meta.commit(
        &[
            Change::DropBlocksFrom {
                ino,
                from: last.idx + 1,
            },
            Change::PutBlock(row.clone()),
            Change::SetSize {
                ino,
                size,
                touch: None,
            },
            Change::DelUc(ino),
        ],
        true,
    )?;
    dns.delete_blocks(&gone);
    let mut ok = Vec::new();
    for Survivor { dn, gs: found, .. } in survivors {
        let Some(node) = dns.get(dn) else { continue };
        match node.settle(last.block_id, found, new_gs, len) {
            Ok(()) => ok.push(dn),
            Err(e) => tracing::warn!(datanode = %dn, "replica not recovered: {e}"),
        }
    }
    if ok.is_empty() {
        // Recorded, but no replica reached the record yet: they lag it,
        // and housekeeping (or the next mount) settles them.
        return Err(FsError::Io(format!(
            "no replica of block {} recovered",
            last.block_id
        )));
    }
    if ok.len() < row.replicas.len() {
        row.replicas = ok;
        meta.commit(&[Change::PutBlock(row.clone())], false)?;
    }
    tracing::info!(
        ino,
        block = row.block_id,
        gs = new_gs,
        len = size,
        "lease recovery closed file"
    );
    Ok(size)
}

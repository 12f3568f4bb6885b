//! Lease (block) recovery: bring the last, unfinished block of a file to
//! one consistent length on every live replica, finalise it under a new
//! generation stamp and close the file. Run when a lease is preempted,
//! past the hard limit, on `recover-lease`, and at mount for files whose
//! holder died with the previous daemon.

use crate::error::{FsError, FsResult};
use crate::meta::{Change, Meta, now_ns};
use crate::pipeline::Datanodes;

/// Recovers file `ino`; returns its final length.
pub fn recover_file(meta: &dyn Meta, dns: &Datanodes, ino: u64) -> FsResult<u64> {
    let inode = meta.get(ino)?;
    let blocks = meta.blocks(ino)?;
    let bs = inode.block_size.max(1);
    let mut size = inode.size;
    if let Some(last) = blocks.iter().rev().find(|b| !b.finalized).cloned() {
        // The longest prefix every live replica holds with valid checksums.
        let mut lens = Vec::new();
        for &dn in &last.replicas {
            // A datanode marked dead (full, failing writes) may still hold a
            // readable replica: every replica found counts.
            let Some(node) = dns.get(dn) else { continue };
            match node.find(last.block_id) {
                Some(info) if info.gs == last.gs => match node.valid_prefix(last.block_id, last.gs)
                {
                    Ok(n) => lens.push((dn, n)),
                    Err(e) => tracing::warn!(datanode = %dn, "replica unusable in recovery: {e}"),
                },
                Some(info) => tracing::warn!(
                    datanode = %dn,
                    found = info.gs,
                    wanted = last.gs,
                    "stale replica ignored in recovery"
                ),
                None => tracing::warn!(
                    datanode = %dn,
                    block = last.block_id,
                    "replica missing in recovery"
                ),
            }
        }
        let start = last.idx * bs;
        // No replica could be read, but some sit on datanodes that are not
        // attached or failing: their bytes may be there. Dropping the block
        // now would be a guess; the file stays under construction until
        // they come back (or the operator removes them).
        let unreachable: Vec<_> = last
            .replicas
            .iter()
            .filter(|d| dns.get(**d).is_none() || !dns.is_alive(**d))
            .collect();
        if lens.is_empty() && !unreachable.is_empty() {
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
        let len = lens.iter().map(|(_, n)| *n).min().unwrap_or(0);
        if len == 0 {
            // Nothing of the block survived, or it never held a byte: the
            // file ends where the block began, and the block goes. (A stream
            // relies on this: no block lies past a closed file's end.)
            meta.commit(
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
                false,
            )?;
            dns.delete_blocks(std::slice::from_ref(&last));
            tracing::warn!(
                ino,
                "recovery found no byte of the last block; length {start}"
            );
            return Ok(start);
        }
        let new_gs = meta.alloc("next_gs")?;
        let mut ok = Vec::new();
        for (dn, _) in lens {
            let Some(node) = dns.get(dn) else { continue };
            let r = node
                .truncate(last.block_id, last.gs, new_gs, len)
                .and_then(|_| node.finalize(last.block_id, new_gs, len));
            match r {
                Ok(()) => ok.push(dn),
                Err(e) => tracing::warn!(datanode = %dn, "replica not recovered: {e}"),
            }
        }
        if ok.is_empty() {
            return Err(FsError::Io(format!(
                "no replica of block {} recovered",
                last.block_id
            )));
        }
        let mut row = last.clone();
        row.gs = new_gs;
        row.len = len;
        row.finalized = true;
        row.replicas = ok;
        size = start + len;
        meta.commit(
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
        tracing::info!(
            ino,
            block = row.block_id,
            gs = new_gs,
            len = size,
            "lease recovery closed file"
        );
    } else {
        meta.commit(&[Change::DelUc(ino)], false)?;
    }
    Ok(size)
}

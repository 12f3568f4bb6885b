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
//! counts even with a lagging stamp when no replica reached the record,
//! or when it holds exactly the bytes the up-to-date replicas agree on
//! (never one whose stamp leads it; a replica dropped from a pipeline
//! leaves the list: the list is the membership).
//!
//! Host-local copies follow the shared replicas: the length is the one the
//! shared survivors agree on (a copy shorter than that leaves the block
//! rather than cutting it), and copies alone never close a block whose
//! shared replicas are out of reach. Another host's copy is out of reach
//! here and simply leaves the block (its host's sweep removes it).

use super::datanodes::Datanodes;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Change, Counter, DnId, Meta, now_ns};
use crate::storage::ReplicaState;

/// A replica recovery found usable: its datanode, the stamp it carries
/// and the length of its valid prefix.
struct Survivor {
    dn: DnId,
    gs: u64,
    valid: u64,
}

/// Whether replicas `a` and `b` (datanode, stamp) of `block` hold the same
/// first `len` bytes, each read verified. Only lagging replicas are
/// compared, so this is rare work (at most a block per replica).
fn same_bytes(dns: &Datanodes, block: u64, a: (DnId, u64), b: (DnId, u64), len: u64) -> bool {
    const PIECE: usize = 1 << 20;
    let (Some(na), Some(nb)) = (dns.get(a.0), dns.get(b.0)) else {
        return false;
    };
    let (mut ba, mut bb) = (vec![0u8; PIECE], vec![0u8; PIECE]);
    let mut off = 0;
    while off < len {
        let n = PIECE.min((len - off) as usize);
        let ra = na.read(block, a.1, off, &mut ba[..n]);
        let rb = nb.read(block, b.1, off, &mut bb[..n]);
        match (ra, rb) {
            (Ok(x), Ok(y)) if x == n && y == n && ba[..n] == bb[..n] => off += n as u64,
            _ => return false,
        }
    }
    true
}

/// How a recovery records and where it leaves the recovered block.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recovery {
    /// Over a shared namespace: the epoch of the claim the recovering
    /// daemon holds; every commit is made under it
    /// ([`Change::Claimed`]).
    pub claim: Option<u64>,
    /// The last writer may still be running elsewhere (another daemon,
    /// stopped or cut off, that has not yet learnt its claim is gone):
    /// the recovered block gets a new id, its replicas copies of the
    /// agreed prefix, so that the next writer shares no replica file with
    /// the old one, whatever the old one still writes into the files it
    /// has open or renames by name. The old replicas are deleted once the
    /// new block is recorded.
    pub fresh_block: bool,
}

impl Recovery {
    /// `changes` made under the recovering daemon's claim, if any.
    fn changes(&self, ino: u64, mut changes: Vec<Change>) -> Vec<Change> {
        if let Some(epoch) = self.claim {
            changes.push(Change::Claimed { ino, epoch });
        }
        changes
    }
}

/// Recovers file `ino`; returns its final length.
pub fn recover_file(meta: &dyn Meta, dns: &Datanodes, ino: u64, how: Recovery) -> FsResult<u64> {
    let inode = meta.get(ino)?;
    let blocks = meta.blocks(ino)?;
    let bs = inode.block_size.max(1);
    let Some(last) = blocks.iter().rev().find(|b| !b.finalized).cloned() else {
        meta.commit(&how.changes(ino, vec![Change::DelUc(ino)]), false)?;
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
    // when none did (a crash between the record and every replica), or
    // when they hold the very bytes the up-to-date ones agree on (a crash
    // between the record and their own restamp): those are settled with
    // the others, and the block keeps its replication.
    if let Some(reference) = survivors
        .iter()
        .find(|r| r.gs == last.gs)
        .map(|r| (r.dn, r.gs))
    {
        let agreed = survivors
            .iter()
            .filter(|r| r.gs == last.gs)
            .map(|r| r.valid)
            .min()
            .unwrap_or(0);
        survivors.retain(|r| {
            if r.gs == last.gs {
                return true;
            }
            let same = r.valid >= agreed
                && same_bytes(dns, last.block_id, reference, (r.dn, r.gs), agreed);
            if same {
                tracing::info!(
                    datanode = %r.dn,
                    found = r.gs,
                    "lagging replica holds the agreed bytes: recovered with the others"
                );
            } else {
                tracing::warn!(
                    datanode = %r.dn,
                    found = r.gs,
                    "lagging replica left out of recovery"
                );
            }
            same
        });
    }
    // The length recorded below must be durable on the replicas that keep
    // it: after a daemon crash their bytes may be in the page cache only
    // (a power cut would then leave a record longer than the replicas,
    // or, over a zero-filled stretch, zeros inside it). A replica that
    // cannot be synced is left out; none left, nothing is recorded.
    let found = survivors.len();
    survivors.retain(|r| {
        let synced = dns
            .get(r.dn)
            .map(|node| node.sync_replica(last.block_id, r.gs));
        match synced {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                tracing::warn!(datanode = %r.dn, "replica left out of recovery: cannot sync it: {e}");
                false
            }
            None => false,
        }
    });
    if found > 0 && survivors.is_empty() {
        return Err(FsError::Io(format!(
            "no replica of block {} could be synced for recovery",
            last.block_id
        )));
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
    // Copies alone (the shared replicas out of reach) are no survivors
    // either: the store may hold more than this host's copy.
    let shared_out_of_reach = !survivors.iter().any(|r| !dns.is_copy(r.dn))
        && unreachable.iter().any(|d| !dns.is_copy(**d));
    if (survivors.is_empty() && !unreachable.is_empty()) || shared_out_of_reach {
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
    // The shared replicas decide the length: a copy that holds less (its
    // host lost unsynced bytes) leaves the block instead of cutting it.
    if let Some(shared) = survivors
        .iter()
        .filter(|r| !dns.is_copy(r.dn))
        .map(|r| r.valid)
        .min()
    {
        survivors.retain(|r| {
            let keep = !dns.is_copy(r.dn) || r.valid >= shared;
            if !keep {
                tracing::warn!(datanode = %r.dn, valid = r.valid, agreed = shared, "host copy shorter than the shared replicas left out of recovery");
            }
            keep
        });
    }
    let len = survivors.iter().map(|r| r.valid).min().unwrap_or(0);
    if len == 0 {
        // Nothing of the block survived, or it never held a byte: the
        // file ends where the block began, and the block goes. (A stream
        // relies on this: no block lies past a closed file's end.)
        let gone = meta.commit(
            &how.changes(
                ino,
                vec![
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
            ),
            true,
        )?;
        dns.delete_blocks(&gone);
        tracing::warn!(
            ino,
            "recovery found no byte of the last block; length {start}"
        );
        return Ok(start);
    }
    if how.fresh_block {
        return recover_into_new_block(meta, dns, ino, how, last, survivors, len, start);
    }
    let new_gs = meta.alloc(Counter::GenStamp)?;
    let mut row = last.clone();
    row.gs = new_gs;
    row.len = len;
    row.finalized = true;
    row.replicas = survivors.iter().map(|r| r.dn).collect();
    let size = start + len;
    let gone = meta.commit(&how.changes(ino, closing(ino, &row, size)), true)?;
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
        meta.commit(
            &how.changes(ino, vec![Change::PutBlock(row.clone())]),
            false,
        )?;
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

/// The commit that closes file `ino` with `row` its recovered last block
/// and `size` its length.
fn closing(ino: u64, row: &BlockRow, size: u64) -> Vec<Change> {
    vec![
        Change::DropBlocksFrom {
            ino,
            from: row.idx + 1,
        },
        Change::PutBlock(row.clone()),
        Change::SetSize {
            ino,
            size,
            touch: None,
        },
        Change::DelUc(ino),
    ]
}

/// Recovery for [`Recovery::fresh_block`]: the agreed `len` bytes of each
/// survivor are copied, durably, into a finalized replica of a new block
/// id on the same datanode; the block is recorded under that id and the
/// file closed; only then are the old replicas deleted. A crash before
/// the record leaves copies nothing refers to (the housekeeping sweep
/// removes them); a crash after it leaves old replicas nothing refers to.
#[allow(clippy::too_many_arguments)]
fn recover_into_new_block(
    meta: &dyn Meta,
    dns: &Datanodes,
    ino: u64,
    how: Recovery,
    last: BlockRow,
    survivors: Vec<Survivor>,
    len: u64,
    start: u64,
) -> FsResult<u64> {
    let new_id = meta.alloc(Counter::Block)?;
    let new_gs = meta.alloc(Counter::GenStamp)?;
    // The copies exist before the commit below records the new block.
    let _hold = dns.hold(new_id);
    let mut ok = Vec::new();
    for Survivor { dn, gs: found, .. } in survivors {
        let Some(node) = dns.get(dn) else { continue };
        match node.copy_replica_as(
            &*node,
            (last.block_id, found),
            (new_id, new_gs),
            len,
            ReplicaState::Finalized,
        ) {
            Ok(()) => ok.push(dn),
            Err(e) => tracing::warn!(datanode = %dn, "replica not copied in recovery: {e}"),
        }
    }
    if ok.is_empty() {
        return Err(FsError::Io(format!(
            "no replica of block {} could be copied in recovery",
            last.block_id
        )));
    }
    let row = BlockRow {
        block_id: new_id,
        gs: new_gs,
        len,
        finalized: true,
        replicas: ok,
        ..last.clone()
    };
    let size = start + len;
    let gone = meta.commit(&how.changes(ino, closing(ino, &row, size)), true)?;
    dns.delete_blocks(&gone);
    // Every file of the old block, whatever its stamp: the old writer's
    // (the rbw files it may still write) included.
    for &dn in &last.replicas {
        if let Some(node) = dns.get(dn).filter(|_| dns.is_alive(dn))
            && let Err(e) = node.delete(last.block_id)
        {
            tracing::warn!(datanode = %dn, "old replica not deleted after recovery: {e}");
        }
    }
    tracing::info!(
        ino,
        old = last.block_id,
        block = new_id,
        gs = new_gs,
        len = size,
        "lease recovery closed file (last block copied under a new id)"
    );
    Ok(size)
}

#[cfg(test)]
mod tests {
    //! Recovery over real datanodes in a temporary directory and a SQLite
    //! store: the block's record says stamp 2, and the replicas carry what
    //! a crash left.

    use std::path::PathBuf;

    use super::*;
    use crate::meta::{BlockRow, Kind, MetaStore, NewNode, ROOT_INO, UnderConstruction};
    use crate::storage::ChunkAccumulator;
    use crate::storage::testkit::{append, stream};
    use crate::sync::Arc;

    const BLOCK: u64 = 7;

    struct Setup {
        _dir: tempfile::TempDir,
        meta: Arc<dyn Meta>,
        dns: Datanodes,
        ino: u64,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta: Arc<dyn Meta> =
            Arc::new(MetaStore::open(&dir.path().join("meta.db"), 0, 0).expect("store"));
        let dirs: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("dn{i}"))).collect();
        let dns = Datanodes::unregistered(&dirs, 3).expect("datanodes");
        let ino = meta
            .create(
                ROOT_INO,
                b"f",
                NewNode {
                    kind: Kind::File,
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    target: None,
                    block_size: 64 << 20,
                    xattrs: Vec::new(),
                },
            )
            .expect("create")
            .ino;
        Setup {
            _dir: dir,
            meta,
            dns,
            ino,
        }
    }

    /// Replica `dn` of the block: `data` written at stamp 1, then restamped
    /// to 2 unless `lagging`.
    fn replica(s: &Setup, dn: u32, data: &[u8], lagging: bool) {
        let node = s.dns.get(DnId(dn)).expect("datanode");
        let mut w = node.create_rbw(BLOCK, 1).expect("rbw");
        append(&mut *w, &mut ChunkAccumulator::new(), data, &[4096]);
        drop(w);
        if !lagging {
            node.bump_gs(BLOCK, 1, 2).expect("bump");
        }
    }

    /// The record a crash left: the block at stamp 2 on all three
    /// datanodes, the file under construction.
    fn record(s: &Setup) {
        let row = BlockRow {
            ino: s.ino,
            idx: 0,
            block_id: BLOCK,
            gs: 2,
            len: 0,
            finalized: false,
            replicas: vec![DnId(0), DnId(1), DnId(2)],
        };
        let uc = UnderConstruction {
            ino: s.ino,
            holder: "h:1".into(),
            pid: 1,
            comm: "w".into(),
            epoch: 1,
            mount_id: "gone".into(),
            since_ms: 0,
        };
        s.meta
            .commit(&[Change::PutUc(uc), Change::PutBlock(row)], true)
            .expect("commit");
    }

    fn recovered_row(s: &Setup) -> BlockRow {
        s.meta.blocks(s.ino).expect("blocks").remove(0)
    }

    #[test]
    fn a_lagging_replica_with_the_agreed_bytes_is_recovered_with_the_others() {
        let s = setup();
        let data = stream(10_000, 3);
        replica(&s, 0, &data, false);
        replica(&s, 1, &data, false);
        // A crash between the durable record and this replica's restamp.
        replica(&s, 2, &data, true);
        record(&s);
        assert_eq!(
            recover_file(&*s.meta, &s.dns, s.ino, Recovery::default()).expect("recover"),
            10_000
        );
        let row = recovered_row(&s);
        assert!(row.finalized);
        assert_eq!(
            row.replicas,
            vec![DnId(0), DnId(1), DnId(2)],
            "replication lost"
        );
        for dn in 0..3 {
            let node = s.dns.get(DnId(dn)).expect("datanode");
            let info = node.find(BLOCK).expect("replica");
            assert_eq!(info.gs, row.gs, "datanode {dn} not settled");
            let mut buf = vec![0u8; 10_100];
            let n = node.read(BLOCK, row.gs, 0, &mut buf).expect("read");
            assert_eq!(&buf[..n], &data[..]);
        }
    }

    #[test]
    fn a_lagging_replica_with_other_bytes_or_fewer_is_left_out() {
        for lagging in [stream(10_000, 9), stream(6_000, 3)] {
            let s = setup();
            let data = stream(10_000, 3);
            replica(&s, 0, &data, false);
            replica(&s, 1, &data, false);
            replica(&s, 2, &lagging, true);
            record(&s);
            assert_eq!(
                recover_file(&*s.meta, &s.dns, s.ino, Recovery::default()).expect("recover"),
                10_000
            );
            assert_eq!(recovered_row(&s).replicas, vec![DnId(0), DnId(1)]);
        }
    }

    /// Recovery for a writer that may still run elsewhere: the block gets
    /// a new id, its replicas are copies of the agreed prefix, and every
    /// file of the old block is gone, so nothing the old writer still
    /// writes or renames by name can reach the next writer's replicas.
    #[test]
    fn a_fresh_block_recovery_copies_the_prefix_under_a_new_id() {
        let s = setup();
        let data = stream(10_000, 3);
        replica(&s, 0, &data, false);
        replica(&s, 1, &data, false);
        replica(&s, 2, &stream(12_000, 3), false);
        record(&s);
        let how = Recovery {
            claim: None,
            fresh_block: true,
        };
        assert_eq!(
            recover_file(&*s.meta, &s.dns, s.ino, how).expect("recover"),
            10_000
        );
        let row = recovered_row(&s);
        assert_ne!(row.block_id, BLOCK, "the block kept its id");
        assert!(row.finalized && row.len == 10_000);
        assert_eq!(row.replicas, vec![DnId(0), DnId(1), DnId(2)]);
        assert!(s.meta.uc(s.ino).expect("uc").is_none(), "file left open");
        for dn in 0..3 {
            let node = s.dns.get(DnId(dn)).expect("datanode");
            assert!(
                node.find(BLOCK).is_none(),
                "datanode {dn} kept the old block"
            );
            let mut buf = vec![0u8; 12_100];
            let n = node.read(row.block_id, row.gs, 0, &mut buf).expect("read");
            assert_eq!(&buf[..n], &data[..], "datanode {dn}");
        }
    }
}

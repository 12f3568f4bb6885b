//! The block journal (`pipeline::journal`): what a small file's fsync
//! leaves in the store, and that no replica is changed, forgotten or
//! trusted before its bytes are on disk.

use super::*;
use crate::meta::JournalRow;
use crate::pipeline::journal::{self, Replayed};

/// A small file written and fsynced through the journal, its checkpoints
/// held: returns its stream, log, bytes and block.
fn journaled(rig: &Rig, n: usize) -> (Arc<OutputStream>, Arc<TestLog>, Vec<u8>, BlockRow) {
    rig.ctx.journal.hold_checkpoints();
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(n, 9);
    write(&s, &data).unwrap();
    wait(|d| s.sync(d)).unwrap();
    let row = rig.blocks().remove(0);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    assert_eq!(rig.ctx.journal.pending(), 1);
    (s, log, data, row)
}

/// A small file written and closed without an fsync, the journal's
/// checkpoints held: returns its log, bytes and block.
fn closed_whole(rig: &Rig, n: usize, seed: u8) -> (Arc<TestLog>, Vec<u8>, BlockRow) {
    rig.ctx.journal.hold_checkpoints();
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(n, seed);
    write(&s, &data).unwrap();
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    (log, data, row)
}

/// The replay, each datanode on a filesystem of its own (one `syncfs`
/// each, so that every replica's sync shows).
fn replay_alone(rig: &Rig) -> Replayed {
    for n in &rig.nodes {
        n.own_filesystem();
    }
    journal::replay(&*rig.meta, &rig.dns).unwrap()
}

/// A checkpoint on its own thread, held (by `hold`, until datanode 0 is
/// healed) in its first sync, which is datanode 0's: it has read its rows.
fn checkpoint_held_in_its_first_sync(
    rig: &Rig,
    hold: Fault,
) -> std::thread::JoinHandle<FsResult<usize>> {
    rig.nodes[0].arm(Op::Sync, hold, 0);
    let ctx = rig.ctx.clone();
    let cp = std::thread::spawn(move || journal::checkpoint(&ctx));
    assert!(
        (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            rig.nodes[0].calls(Op::Sync) > 0
        }),
        "the checkpoint never synced"
    );
    cp
}

/// A checkpoint of the journaled block `row` (the file's only one) while
/// datanode `failing`'s syncs fail with `EIO`: it counts the block done,
/// forgets the row and keeps the generation stamp. The replicas left,
/// sorted.
fn checkpoint_failing_sync_on(rig: &Rig, failing: usize, row: &BlockRow) -> Vec<DnId> {
    rig.nodes[failing].arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 1);
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    let block = &rig.blocks()[0];
    assert_eq!(block.gs, row.gs);
    let mut left = block.replicas.clone();
    left.sort();
    left
}

fn data_file(n: &Faulty, block: u64) -> std::path::PathBuf {
    n.root().join("finalized").join(format!("blk_{block}"))
}

#[test]
fn an_append_syncs_a_journaled_block_before_it_reopens_it() {
    let rig = Rig::new(2, 2, 8);
    let (s, log, data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        assert_eq!(n.calls(Op::Sync), 0);
    }
    write(&s, &data[..500]).unwrap();
    wait(|d| s.sync(d)).unwrap();
    for n in &rig.nodes {
        assert!(n.calls(Op::Sync) > 0);
    }
    // Synced and forgotten before the new stamp was recorded.
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert_eq!(rig.ctx.journal.pending(), 0);
    assert!(rig.blocks()[0].gs > row.gs);
    wait(|d| s.close(d)).unwrap();
    let mut want = data.clone();
    want.extend_from_slice(&data[..500]);
    assert_eq!(rig.read(2000), want);
    assert_unbroken(&log);
}

#[test]
fn an_append_fails_rather_than_change_a_block_no_replica_of_which_could_be_synced() {
    let rig = Rig::new(2, 2, 8);
    let (s, _log, data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        n.arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    }
    // The checkpoint forgets nothing: the row keeps the only durable copy.
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 0);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    for n in &rig.nodes {
        n.heal();
    }
    // Nothing may change the block in place now: the append fails, and
    // no replica was reopened.
    write(&s, &data[..100]).unwrap();
    assert!(wait(|d| s.sync(d)).is_err());
    for n in &rig.nodes {
        assert_eq!(n.calls(Op::Reopen), 0);
    }
    assert_eq!(rig.blocks()[0].gs, row.gs);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
}

#[test]
fn an_append_whose_own_settling_finds_no_replica_synced_fails() {
    let rig = Rig::new(2, 2, 8);
    let (s, _log, data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        n.arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    }
    // No checkpoint ran: the append's reopen syncs the block itself.
    write(&s, &data[..100]).unwrap();
    assert!(wait(|d| s.sync(d)).is_err());
    for n in &rig.nodes {
        assert!(n.calls(Op::Sync) > 0);
        assert_eq!(n.calls(Op::Reopen), 0);
    }
    assert_eq!(rig.blocks()[0].gs, row.gs);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
}

#[test]
fn a_checkpoint_drops_a_replica_whose_sync_failed_and_forgets_the_row() {
    let rig = Rig::new(2, 2, 8);
    for n in &rig.nodes {
        n.own_filesystem();
    }
    let (_s, _log, data, row) = journaled(&rig, 1500);
    assert_eq!(checkpoint_failing_sync_on(&rig, 1, &row), [DnId(0)]);
    assert_eq!(rig.read(1500), data);
}

#[test]
fn replay_rewrites_replicas_that_lost_the_journaled_bytes() {
    let rig = Rig::new(3, 3, 8);
    let (_s, _log, data, row) = journaled(&rig, 3000);
    // What a power cut may leave of replicas never synced: none at all
    // (held in memory, or written and lost), an empty file, other bytes.
    for n in &rig.nodes {
        n.lose_held();
    }
    rig.nodes[0].delete(row.block_id).unwrap();
    std::fs::write(data_file(&rig.nodes[1], row.block_id), b"").unwrap();
    std::fs::write(data_file(&rig.nodes[2], row.block_id), vec![7u8; 3000]).unwrap();
    let r = replay_alone(&rig);
    assert_eq!(
        r,
        Replayed {
            rows: 1,
            rewritten: 3,
            kept: Vec::new()
        }
    );
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    for n in &rig.nodes {
        let mut buf = vec![0u8; 3000];
        assert_eq!(n.read(row.block_id, row.gs, 0, &mut buf).unwrap(), 3000);
        assert_eq!(buf, data);
        assert!(n.calls(Op::Sync) > 0, "rewritten replicas are synced");
        assert_eq!(n.io().fast_paths().journal_replayed, 1);
    }
}

#[test]
fn replay_syncs_replicas_that_hold_the_bytes_and_forgets_superseded_rows() {
    let rig = Rig::new(2, 2, 8);
    let (_s, _log, _data, row) = journaled(&rig, 2000);
    // A row whose block another durable change gave a new stamp (as an
    // append or a truncation does, after settling it), and one whose
    // block is gone: forgotten, their replicas untouched.
    let stale = JournalRow {
        block_id: row.block_id + 1000,
        gs: 1,
        data: vec![1; 10],
    };
    let mut moved = rig.meta.journal_rows().unwrap().remove(0);
    moved.gs = row.gs - 1;
    moved.block_id = row.block_id;
    rig.meta.commit(&[Change::Journal(stale)], true).unwrap();
    let r = replay_alone(&rig);
    assert_eq!(
        r,
        Replayed {
            rows: 2,
            rewritten: 0,
            kept: Vec::new()
        }
    );
    for n in &rig.nodes {
        assert!(n.calls(Op::Sync) > 0, "replicas that verified are synced");
    }
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    // Superseded: the block carries another stamp than the row.
    rig.meta.commit(&[Change::Journal(moved)], true).unwrap();
    let r = journal::replay(&*rig.meta, &rig.dns).unwrap();
    assert_eq!((r.rows, r.rewritten), (1, 0));
    assert!(rig.meta.journal_rows().unwrap().is_empty());
}

#[test]
fn a_journaled_fsync_writes_no_replica_file_until_one_is_needed() {
    let rig = Rig::new(2, 2, 8);
    for n in &rig.nodes {
        n.own_filesystem();
    }
    let (_s, _log, data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        assert!(n.holds(row.block_id));
        assert!(!data_file(n, row.block_id).exists());
        assert_eq!(n.io().fast_paths().deferred, 1);
    }
    // A read needs it on disk: written (unsynced), and held no more.
    let mut buf = vec![0u8; 1500];
    assert_eq!(
        rig.nodes[0]
            .read(row.block_id, row.gs, 0, &mut buf)
            .unwrap(),
        1500
    );
    assert_eq!(buf, data);
    assert!(data_file(&rig.nodes[0], row.block_id).exists());
    assert!(!rig.nodes[0].holds(row.block_id));
    assert!(rig.nodes[1].holds(row.block_id));
    // The checkpoint writes the other before it syncs both.
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 1);
    for n in &rig.nodes {
        assert!(!n.holds(row.block_id));
        assert!(data_file(n, row.block_id).exists());
        assert!(n.calls(Op::Sync) > 0);
    }
    assert_eq!(rig.blocks()[0].replicas.len(), 2);
    assert_eq!(rig.read(1500), data);
}

#[test]
fn a_checkpoint_drops_a_replica_that_could_not_be_written() {
    let rig = Rig::new(2, 2, 8);
    let (_s, _log, data, row) = journaled(&rig, 1500);
    rig.nodes[1].arm(Op::Write, Fault::Fail(libc::ENOSPC), 0);
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 1);
    assert_eq!(rig.blocks()[0].replicas, [DnId(0)]);
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert!(!data_file(&rig.nodes[1], row.block_id).exists());
    assert_eq!(rig.read(1500), data);
}

#[test]
fn a_checkpoint_that_can_write_no_replica_keeps_the_row_and_the_bytes() {
    let rig = Rig::new(2, 2, 8);
    let (_s, _log, data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        n.arm(Op::Write, Fault::Fail(libc::EIO), 0);
    }
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 0);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    assert_eq!(rig.blocks()[0].replicas.len(), 2);
    // Still held: a read once the disk takes writes again gets the bytes.
    for n in &rig.nodes {
        assert!(n.holds(row.block_id));
        n.heal();
    }
    assert_eq!(rig.read(1500), data);
}

#[test]
fn a_deleted_block_held_in_memory_is_never_written() {
    let rig = Rig::new(2, 2, 8);
    let (_s, _log, _data, row) = journaled(&rig, 1500);
    for n in &rig.nodes {
        n.delete(row.block_id).unwrap();
        assert!(!n.holds(row.block_id));
        n.write_out(row.block_id).unwrap();
        assert!(!data_file(n, row.block_id).exists());
    }
}

#[test]
fn replay_keeps_a_row_whose_replica_cannot_be_restored() {
    let rig = Rig::new(2, 2, 8);
    let (_s, _log, _data, row) = journaled(&rig, 2000);
    rig.nodes[0].delete(row.block_id).unwrap();
    rig.nodes[0].arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    let r = replay_alone(&rig);
    assert_eq!(r.kept, [row.block_id]);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
}

#[test]
fn a_checkpoint_that_finds_a_block_deleted_under_it_fails_no_datanode() {
    // File by file (as on a FUSE datanode): each sync looks for the
    // replica. The checkpoint has read the row and waits in its first
    // sync while the file is deleted (metadata first, durably, then the
    // replicas); the syncs then find no replica, which is no datanode's
    // failure.
    let rig = Rig::with(2, 2, 8, false);
    let (_s, _log, _data, row) = journaled(&rig, 1500);
    let cp = checkpoint_held_in_its_first_sync(&rig, Fault::Hold);
    let drop = Change::DropBlocksFrom {
        ino: rig.ino,
        from: 0,
    };
    rig.meta.commit(&[drop], true).unwrap();
    for n in &rig.nodes {
        n.delete(row.block_id).unwrap();
    }
    rig.nodes[0].heal();
    assert_eq!(cp.join().unwrap().unwrap(), 1);
    for n in &rig.nodes {
        assert!(rig.dns.is_alive(n.id()), "datanode {} marked dead", n.id());
    }
    assert!(rig.meta.journal_rows().unwrap().is_empty());
}

#[test]
fn an_append_waits_for_a_checkpoint_syncing_its_block() {
    // File by file, as above. The checkpoint has read the row and waits in
    // its first sync; an append to the file then settles the block, which
    // would sync it, forget the row and give it a new stamp while the
    // checkpoint still syncs it under the old one: the checkpoint's syncs
    // would find the new stamp and blame every datanode. The append waits
    // for the checkpoint instead.
    let rig = Rig::with(2, 2, 8, false);
    let (s, _log, data, row) = journaled(&rig, 1500);
    let cp = checkpoint_held_in_its_first_sync(&rig, Fault::HoldOne);
    let more = data[..500].to_vec();
    let appender = {
        let s = s.clone();
        std::thread::spawn(move || {
            write(&s, &more)?;
            wait(|d| s.sync(d))
        })
    };
    // Time for the append to settle the block, were it not held back.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let restamped = rig.blocks()[0].gs != row.gs;
    rig.nodes[0].heal();
    let checkpointed = cp.join().unwrap();
    let appended = appender.join().unwrap();
    for n in &rig.nodes {
        assert!(rig.dns.is_alive(n.id()), "datanode {} marked dead", n.id());
    }
    assert!(!restamped, "the block was restamped under the checkpoint");
    assert_eq!(checkpointed.unwrap(), 1);
    appended.unwrap();
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert!(rig.blocks()[0].gs > row.gs);
    wait(|d| s.close(d)).unwrap();
    let mut want = data.clone();
    want.extend_from_slice(&data[..500]);
    assert_eq!(rig.read(2000), want);
}

/// A small file closed without an fsync: its bytes go into the journal
/// with the close's record, and its replicas are held, not written (the
/// close creates no file). A kill of the daemon before the checkpoint
/// (the held replicas lost) loses nothing a close promises: the replay
/// at mount writes them from the row.
#[test]
fn a_small_file_closed_without_fsync_is_journaled_and_outlives_a_crash() {
    let rig = Rig::new(3, 3, 8);
    let (log, data, row) = closed_whole(&rig, 2000, 5);
    assert!(row.finalized);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    assert_eq!(rig.ctx.journal.pending(), 1);
    for n in &rig.nodes {
        assert!(n.holds(row.block_id));
        assert!(!data_file(n, row.block_id).exists());
        assert_eq!(n.io().fast_paths().deferred, 1);
        assert_eq!(n.calls(Op::Sync), 0, "a close syncs nothing");
        n.lose_held();
    }
    let r = replay_alone(&rig);
    assert_eq!(
        r,
        Replayed {
            rows: 1,
            rewritten: 3,
            kept: Vec::new()
        }
    );
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert_eq!(rig.read(2000), data);
    assert_unbroken(&log);
}

/// At R=1 a close writes its one replica as before (the journal would
/// only move its two files to the checkpoint): no row, the file on disk.
#[test]
fn a_small_file_closed_at_r1_writes_its_replica_and_keeps_no_row() {
    let rig = Rig::new(1, 1, 8);
    let (_log, data, row) = closed_whole(&rig, 2000, 6);
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert!(!rig.nodes[0].holds(row.block_id));
    assert!(data_file(&rig.nodes[0], row.block_id).exists());
    assert_eq!(rig.read(2000), data);
}

/// A failing sync at the checkpoint of a closed file's journaled block
/// is a failed sync as any other: the replica that failed leaves the
/// block, the others are synced and the row forgotten.
#[test]
fn a_closed_files_checkpoint_drops_a_replica_whose_sync_failed() {
    let rig = Rig::new(3, 3, 8);
    for n in &rig.nodes {
        n.own_filesystem();
    }
    let (log, data, row) = closed_whole(&rig, 2500, 7);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    assert_eq!(
        checkpoint_failing_sync_on(&rig, 1, &row),
        [DnId(0), DnId(2)]
    );
    assert_eq!(rig.read(2500), data);
    assert_unbroken(&log);
}

/// When every replica's sync fails, the row stays (the journal keeps the
/// only copy that may be on disk) and the next mount replays it; until
/// then nothing changes the block.
#[test]
fn a_closed_files_row_outlives_a_checkpoint_whose_every_sync_failed() {
    let rig = Rig::new(3, 3, 8);
    let (_log, data, row) = closed_whole(&rig, 2500, 8);
    for n in &rig.nodes {
        n.arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    }
    assert_eq!(journal::checkpoint(&rig.ctx).unwrap(), 0);
    assert_eq!(rig.meta.journal_rows().unwrap().len(), 1);
    for n in &rig.nodes {
        n.heal();
    }
    assert!(journal::settle(&rig.ctx, row.block_id).is_err());
    // What a power cut may leave: the replicas written but not synced,
    // lost. The replay puts them back from the row.
    for n in &rig.nodes {
        n.delete(row.block_id).unwrap();
    }
    let r = replay_alone(&rig);
    assert_eq!((r.rows, r.rewritten, r.kept.len()), (1, 3, 0));
    assert_eq!(rig.read(2500), data);
}

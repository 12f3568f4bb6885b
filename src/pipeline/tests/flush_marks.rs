//! Blocks and the flush marks' moves (`pipeline::flush_floor`): a block
//! opened before a move and finalized after it is synced before its close
//! records it (the mark may already be past its stamp); a block opened
//! after a move is left to the next one, which the floor holds back while
//! its replicas are being finalized.

use super::*;
use crate::meta::Counter;

fn file_syncs(rig: &Rig) -> Vec<u64> {
    rig.nodes.iter().map(|n| n.calls(Op::FileSync)).collect()
}

/// A stream that has written and flushed `data` (its block open, its
/// stamp taken, nothing synced).
fn flushed(rig: &Rig, log: &Arc<TestLog>, data: &[u8]) -> Arc<OutputStream> {
    let s = rig.stream(log);
    write(&s, data).unwrap();
    wait(|d| s.flush(d)).unwrap();
    s
}

#[test]
fn a_block_open_across_a_move_of_the_marks_is_synced_before_its_close_records_it() {
    let rig = Rig::new(3, 3, 8);
    let log = rig.log();
    let data = bytes(20_000, 3);
    let s = flushed(&rig, &log, &data[..9000]);
    let before = file_syncs(&rig);
    let stamp = rig.meta.alloc(Counter::GenStamp).unwrap();
    assert_eq!(rig.ctx.floor.take(stamp), stamp, "nothing being finalized");
    write(&s, &data[9000..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    let rows = rig.blocks();
    assert!(rows[0].gs < stamp, "the block was opened before the move");
    for (n, was) in rig.nodes.iter().zip(&before) {
        assert!(
            n.calls(Op::FileSync) > *was,
            "datanode {}: replica not synced",
            n.id()
        );
    }
    assert_eq!(sorted(&rows[0].replicas), [DnId(0), DnId(1), DnId(2)]);
    for n in &rig.nodes {
        assert_eq!(n.io().fast_paths().synced_behind_mark, 1);
    }
    assert!(!rig.ctx.floor.dirty(), "synced: nothing for the next move");
    assert_eq!(rig.read(20_000), data);
}

#[test]
fn a_block_opened_after_a_move_is_left_to_the_next_one() {
    let rig = Rig::new(3, 3, 8);
    let log = rig.log();
    let stamp = rig.meta.alloc(Counter::GenStamp).unwrap();
    assert_eq!(rig.ctx.floor.take(stamp), stamp);
    let data = bytes(20_000, 5);
    let s = flushed(&rig, &log, &data[..9000]);
    let before = file_syncs(&rig);
    write(&s, &data[9000..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    assert!(rig.blocks()[0].gs > stamp);
    assert_eq!(file_syncs(&rig), before, "a close syncs nothing");
    assert!(rig.ctx.floor.dirty(), "the next move syncs it");
    let next = rig.meta.alloc(Counter::GenStamp).unwrap();
    assert_eq!(rig.ctx.floor.take(next), next, "its finalizing is over");
}

#[test]
fn a_replica_that_cannot_be_synced_behind_a_move_is_not_recorded() {
    let rig = Rig::new(3, 3, 8);
    let log = rig.log();
    let data = bytes(20_000, 7);
    let s = flushed(&rig, &log, &data[..9000]);
    let stamp = rig.meta.alloc(Counter::GenStamp).unwrap();
    let _ = rig.ctx.floor.take(stamp);
    rig.nodes[0].arm(Op::FileSync, Fault::Fail(libc::EIO), 0);
    write(&s, &data[9000..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    rig.nodes[0].heal();
    let rows = rig.blocks();
    assert_eq!(sorted(&rows[0].replicas), [DnId(1), DnId(2)]);
    assert_eq!(rig.read(20_000), data);
}

#[test]
fn a_small_file_written_whole_behind_a_move_is_synced_before_its_close_records_it() {
    let rig = Rig::new(3, 1, 8);
    let log = rig.log();
    // As if a move had taken its stamp between the block's stamp and its
    // write: every stamp handed out from here on is behind it.
    let ahead = rig.meta.alloc(Counter::GenStamp).unwrap() + 1_000_000;
    let _ = rig.ctx.floor.take(ahead);
    let s = rig.stream(&log);
    let before: u64 = file_syncs(&rig).iter().sum();
    let data = bytes(3000, 9);
    write(&s, &data).unwrap();
    wait(|d| s.close(d)).unwrap();
    let rows = rig.blocks();
    assert_eq!((rows.len(), rows[0].replicas.len()), (1, 1));
    assert!(
        file_syncs(&rig).iter().sum::<u64>() > before,
        "the one-step replica was not synced"
    );
    assert_eq!(rig.read(3000), data);
}

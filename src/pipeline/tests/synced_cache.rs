//! What an fsync skips as already durable (the ledger): never a change
//! made after the sync that made it durable began, by this daemon or by
//! another one sharing the namespace.

use super::*;
use crate::pipeline::durable;

/// Replica syncs of closed files on every datanode so far.
fn replica_syncs(rig: &Rig) -> u64 {
    rig.nodes.iter().map(|n| n.calls(Op::FileSync)).sum()
}

fn write_and_close(s: &Arc<OutputStream>, data: &[u8]) {
    write(s, data).unwrap();
    wait(|d| s.close(d)).unwrap();
}

#[test]
fn a_close_during_an_fsync_is_synced_by_the_next_one() {
    let rig = Rig::with(3, 3, 16, false);
    let log = rig.log();
    let s = rig.stream(&log);
    // A full first block, closed without fsync.
    write_and_close(&s, &bytes(BLOCK as usize, 1));
    // An fsync through a descriptor without a stream, held in its syncs.
    for n in &rig.nodes {
        n.arm(Op::FileSync, Fault::Hold, 0);
    }
    let ctx = rig.ctx.clone();
    let ino = rig.ino;
    let held = std::thread::spawn(move || durable::sync_file(&ctx, ino));
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica_syncs(&rig) == 0 {
        assert!(Instant::now() < deadline, "the fsync never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Meanwhile a writer appends a second block and closes.
    let more = rig.stream(&log);
    write_and_close(&more, &bytes(2 * PACKET, 2));
    for n in &rig.nodes {
        n.heal();
    }
    held.join().unwrap().unwrap();
    // The next fsync syncs the second block's replicas.
    let before = replica_syncs(&rig);
    durable::sync_file(&rig.ctx, rig.ino).unwrap();
    assert_eq!(
        replica_syncs(&rig) - before,
        3,
        "the new block was not synced"
    );
    // And the one after that has nothing left to sync.
    let before = replica_syncs(&rig);
    durable::sync_file(&rig.ctx, rig.ino).unwrap();
    assert_eq!(replica_syncs(&rig), before);
}

#[test]
fn an_append_through_another_daemon_is_synced_by_the_next_fsync_here() {
    let rig = Rig::with(3, 3, 16, false);
    let log = rig.log();
    let other_daemon = |rig: &Rig| {
        OutputStream::new(
            rig.other_daemon(),
            rig.ino,
            rig.meta.get(rig.ino).unwrap().size,
            BLOCK,
            log.clone(),
            0,
        )
    };
    let s = rig.stream(&log);
    write_and_close(&s, &bytes(3 * PACKET, 3));
    durable::sync_file(&rig.ctx, rig.ino).unwrap();
    // Another daemon appends to the file (its last block, reopened) and
    // closes it without fsync.
    write_and_close(&other_daemon(&rig), &bytes(PACKET, 4));
    // An fsync here syncs what it wrote.
    let before = replica_syncs(&rig);
    durable::sync_file(&rig.ctx, rig.ino).unwrap();
    assert_eq!(replica_syncs(&rig) - before, 3, "the append was not synced");
    // Another daemon fills the block; a writer here starts the next one:
    // its first fsync syncs the other daemon's bytes too.
    let size = rig.meta.get(rig.ino).unwrap().size;
    write_and_close(&other_daemon(&rig), &bytes((BLOCK - size) as usize, 5));
    let s = rig.stream(&log);
    write(&s, &bytes(2 * PACKET, 6)).unwrap();
    let before = replica_syncs(&rig);
    wait(|d| s.sync(d)).unwrap();
    // The three replicas of the other daemon's block, and data and
    // checksums of the three being written.
    assert_eq!(
        replica_syncs(&rig) - before,
        3 + 2 * 3,
        "the other daemon's append was not synced by a stream's fsync"
    );
}

//! The flush marks' moves on a whole filesystem without a mount: after a
//! round in which a file was closed they move past its stamp; after a
//! move whose sync failed they never move again in this daemon's life.

use crate::config::MountOptions;
use crate::fs::testing::{TestFs, me};
use crate::storage::Storage;
use crate::storage::faulty::{Fault, Op};

fn marks(t: &TestFs) -> Vec<u64> {
    t.faults
        .iter()
        .map(|f| f.flushed_mark().expect("mark").unwrap_or(0))
        .collect()
}

/// Creates, writes and closes `name` without an fsync; its block's stamp.
fn closed(t: &TestFs, name: &str) -> u64 {
    let ino = t.create(name);
    let fh = t.open(ino, libc::O_WRONLY, me()).expect("open");
    t.write(fh, 0, &[7u8; 5000]).expect("write");
    t.close(fh).expect("close");
    t.meta.blocks(ino).expect("blocks")[0].gs
}

#[test]
fn the_marks_move_past_a_closed_file_and_stay_for_good_after_a_failed_sync() {
    let t = TestFs::new(MountOptions::default(), 3);
    t.core.startup_recovery().expect("startup");
    let at_mount = marks(&t);
    assert!(at_mount.iter().all(|&m| m > 0), "{at_mount:?}");
    t.core.advance_flush_marks();
    assert_eq!(marks(&t), at_mount, "nothing written: no move");
    let gs = closed(&t, "a");
    t.core.advance_flush_marks();
    assert!(marks(&t).iter().all(|&m| m > gs), "{:?} vs {gs}", marks(&t));
    let before = marks(&t);
    let gs = closed(&t, "b");
    // The datanodes share one filesystem, synced through one of them.
    for f in &t.faults {
        f.arm(Op::SyncFs, Fault::Fail(libc::EIO), 0);
    }
    t.core.advance_flush_marks();
    for f in &t.faults {
        f.heal();
    }
    assert_eq!(marks(&t), before, "a failed sync moved the marks");
    let _ = closed(&t, "c");
    t.core.advance_flush_marks();
    assert_eq!(
        marks(&t),
        before,
        "a later sync would find the failed pages clean"
    );
    assert!(before.iter().all(|&m| m <= gs));
}

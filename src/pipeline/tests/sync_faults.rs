//! Sync faults, step by step (docs/SEMANTICS.md, "Durability"): for every
//! step an fsync takes (the start of a replica's sync, a ranged sync's
//! writeback, the per-filesystem cache flush, `fdatasync` of a replica's
//! files, the fsync of its directory, `syncfs`, the metadata store's WAL
//! sync), `EIO` and `ENOSPC` injected on one replica take that replica out
//! of its block durably while the fsync succeeds; injected on every
//! replica, the fsync reports the error, and the stream is done. Either
//! way every byte acknowledged reads back, then and after recovery.

use super::*;
use crate::pipeline::durable;
use crate::pipeline::recovery;

/// Where a step is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// A stream's replicas zero-filled ahead: its syncs are ranged.
    Ranged,
    /// A stream's first sync, file by file (`replica_sync=file`).
    FileByFile,
    /// A stream's first sync through `syncfs` (`replica_sync=fs`).
    ByFs,
    /// fsync of a closed file (no stream), file by file.
    Closed,
    /// fsync of a closed file through `syncfs`.
    ClosedByFs,
}

impl Path {
    fn closed(self) -> bool {
        matches!(self, Path::Closed | Path::ClosedByFs)
    }

    /// `replica_sync=fs` (the default) unless the path is file by file.
    fn by_fs(self) -> bool {
        !matches!(self, Path::FileByFile | Path::Closed)
    }
}

/// A stream on `rig` that has written `data` and synced it on `path`,
/// ready for the next sync to take that path again. `Closed`: no stream
/// (the file was closed without fsync).
fn prepare(rig: &Rig, log: &Arc<TestLog>, path: Path, data: &mut Vec<u8>) -> Arc<OutputStream> {
    // Each datanode on a filesystem of its own: one `syncfs` and one cache
    // flush each, so that a fault can strike one replica's.
    for n in &rig.nodes {
        n.own_filesystem();
    }
    let s = rig.stream(log);
    let more = |data: &mut Vec<u8>, s: &Arc<OutputStream>| {
        let chunk = bytes(PACKET, data.len() as u8);
        write(s, &chunk).unwrap();
        data.extend(chunk);
    };
    match path {
        Path::Ranged => {
            // Two small syncs make a stream that syncs often: its replicas
            // are zero-filled ahead, and its next syncs are ranged.
            for _ in 0..3 {
                more(data, &s);
                wait(|d| s.sync(d)).unwrap();
            }
            assert!(
                rig.nodes.iter().all(|n| n.calls(Op::Writeback) > 0),
                "the syncs never went ranged"
            );
        }
        Path::FileByFile | Path::ByFs => more(data, &s),
        Path::Closed | Path::ClosedByFs => {
            more(data, &s);
            more(data, &s);
            wait(|d| s.close(d)).unwrap();
        }
    }
    if !path.closed() {
        more(data, &s);
        wait(|d| s.flush(d)).unwrap();
    }
    s
}

/// The faults that strike `step` on `path`: the step itself, and for a
/// `syncfs` the file-by-file syncs that follow its failure too (a failed
/// `syncfs` alone is anybody's error on that filesystem).
fn arm(node: &Faulty, step: Op, errno: i32) {
    node.arm(step, Fault::Fail(errno), 0);
    if step == Op::SyncFs {
        node.arm(Op::FileSync, Fault::Fail(errno), 0);
    }
}

/// One fsync of the file: through the stream, or (`Closed`) as a
/// descriptor without one does it.
fn fsync(rig: &Rig, s: &Arc<OutputStream>, path: Path) -> FsResult<()> {
    if path.closed() {
        durable::sync_file(&rig.ctx, rig.ino)
    } else {
        wait(|d| s.sync(d))
    }
}

fn step_fault(step: Op, path: Path, errno: i32) {
    one_replica_fails(step, path, errno);
    every_replica_fails(step, path, errno);
}

/// One replica failing `step`: it leaves its block, durably, and the
/// fsync succeeds.
fn one_replica_fails(step: Op, path: Path, errno: i32) {
    let what = format!("{step:?} on the {path:?} path, errno {errno}, one replica");
    let rig = Rig::with(3, 3, 16, path.by_fs());
    let log = rig.log();
    let mut data = Vec::new();
    let s = prepare(&rig, &log, path, &mut data);
    let victim = rig.blocks()[0].replicas[1];
    arm(&rig.nodes[victim.0 as usize], step, errno);
    fsync(&rig, &s, path).unwrap_or_else(|e| panic!("{what}: {e}"));
    let row = rig.blocks().remove(0);
    assert_eq!(row.replicas.len(), 2, "{what}: {row:?}");
    assert!(!row.replicas.contains(&victim), "{what}: {row:?}");
    if !path.closed() {
        assert!(
            seen(&log).contains(&Seen::Changed {
                gs: row.gs,
                replicas: sorted(&row.replicas),
                durable: true
            }),
            "{what}: {:?}",
            seen(&log)
        );
    }
    assert_eq!(rig.dns.health(victim), Health::Dead, "{what}");
    assert_eq!(rig.read(data.len() as u64), data, "{what}");
    // The stream goes on without it.
    if !path.closed() {
        let chunk = bytes(PACKET, 77);
        write(&s, &chunk).unwrap();
        data.extend(chunk);
        wait(|d| s.sync(d)).unwrap_or_else(|e| panic!("{what}: the next fsync: {e}"));
        wait(|d| s.close(d)).unwrap();
    }
    assert_eq!(rig.read(data.len() as u64), data, "{what}");
}

/// Every replica failing `step`: the fsync reports the error, a later
/// one does too, the stream is done, and what was acknowledged stays.
fn every_replica_fails(step: Op, path: Path, errno: i32) {
    let what = format!("{step:?} on the {path:?} path, errno {errno}, every replica");
    let rig = Rig::with(3, 3, 16, path.by_fs());
    let log = rig.log();
    let mut data = Vec::new();
    let s = prepare(&rig, &log, path, &mut data);
    let synced = match path {
        Path::Ranged => data.len() - PACKET,
        _ => 0,
    } as u64;
    for n in &rig.nodes {
        arm(n, step, errno);
    }
    let e = fsync(&rig, &s, path).expect_err(&what);
    assert_eq!(e.errno(), errno, "{what}: {e}");
    // Nothing says otherwise later: a sync error is never forgotten.
    for n in &rig.nodes {
        n.heal();
    }
    assert!(
        fsync(&rig, &s, path).is_err(),
        "{what}: a later fsync succeeded"
    );
    if !path.closed() {
        assert!(write(&s, b"more").is_err(), "{what}: the stream went on");
    }
    // Every acknowledged byte reads back, now and once the file is
    // recovered (as when its descriptor is released).
    assert_eq!(rig.read(data.len() as u64), data, "{what}");
    drop(s);
    let size = if path.closed() {
        rig.meta.get(rig.ino).unwrap().size
    } else {
        recovery::recover_file(&*rig.meta, &rig.dns, rig.ino, Default::default()).unwrap()
    };
    assert!(size >= synced, "{what}: {size} < {synced}");
    assert_eq!(rig.read(size), data[..size as usize], "{what}");
}

#[test]
fn a_failed_ranged_sync_is_never_reported_as_success() {
    for errno in [libc::EIO, libc::ENOSPC] {
        for step in [Op::SyncBegin, Op::Writeback, Op::Flush] {
            step_fault(step, Path::Ranged, errno);
        }
    }
}

#[test]
fn a_failed_full_sync_of_a_replica_is_never_reported_as_success() {
    for errno in [libc::EIO, libc::ENOSPC] {
        for step in [Op::SyncBegin, Op::FileSync, Op::DirSync] {
            step_fault(step, Path::FileByFile, errno);
        }
        step_fault(Op::SyncFs, Path::ByFs, errno);
    }
}

#[test]
fn a_failed_sync_of_a_closed_file_is_never_reported_as_success() {
    for errno in [libc::EIO, libc::ENOSPC] {
        for step in [Op::FileSync, Op::DirSync] {
            step_fault(step, Path::Closed, errno);
        }
        step_fault(Op::SyncFs, Path::ClosedByFs, errno);
    }
}

/// A `syncfs` error of another file costs no replica: the replica's own
/// syncs say it is durable. But it may belong to pages whose fsync comes
/// later (written back, and failed, before it): the filesystem is synced
/// file by file from then on, so the later fsync sees its file's own
/// error. Had it gone through `syncfs` again, that call (its error
/// already reported) would have succeeded: a dropped sync error.
#[test]
fn a_syncfs_error_costs_no_replica_and_later_fsyncs_there_sync_file_by_file() {
    let rig = Rig::with(3, 3, 16, true);
    let log = rig.log();
    let mut data = Vec::new();
    let s = prepare(&rig, &log, Path::ByFs, &mut data);
    rig.nodes[0].arm(Op::SyncFs, Fault::Fail(libc::EIO), 0);
    wait(|d| s.sync(d)).unwrap();
    assert_eq!(rig.blocks()[0].replicas.len(), 3);
    assert!(rig.nodes[0].calls(Op::FileSync) > 0);
    wait(|d| s.close(d)).unwrap();
    let syncfs_before = rig.nodes[0].calls(Op::SyncFs);
    // The replica's pages on datanode 0 failed their writeback since.
    rig.nodes[0].arm(Op::FileSync, Fault::Fail(libc::EIO), 0);
    durable::sync_file(&rig.ctx, rig.ino).unwrap();
    assert_eq!(rig.nodes[0].calls(Op::SyncFs), syncfs_before);
    let row = rig.blocks().remove(0);
    assert!(!row.replicas.contains(&DnId(0)), "{row:?}");
    assert_eq!(row.replicas.len(), 2, "{row:?}");
    assert_eq!(rig.read(data.len() as u64), data);
}

#[test]
fn a_failed_wal_sync_fails_the_fsync_and_every_later_one() {
    for errno in [libc::EIO, libc::ENOSPC] {
        let rig = Rig::with(2, 2, 16, true);
        let log = rig.log();
        let mut data = Vec::new();
        let s = prepare(&rig, &log, Path::FileByFile, &mut data);
        rig.store.fail_syncs(Some(errno));
        let e = wait(|d| s.sync(d)).unwrap_err();
        assert_eq!(e.errno(), errno, "{e}");
        rig.store.fail_syncs(None);
        assert!(wait(|d| s.sync(d)).is_err(), "a later fsync succeeded");
        assert!(
            durable::sync_file(&rig.ctx, rig.ino).is_err(),
            "a later fsync through another descriptor succeeded"
        );
        assert_eq!(rig.read(data.len() as u64), data);
    }
}

/// Lease recovery records a length only once the replicas it keeps hold
/// it durably: after a daemon crash their bytes may be in the page cache
/// alone, and the record would outlive them in a power cut. A replica
/// that cannot be synced is left out; with none left, nothing is recorded
/// and the file stays under construction.
#[test]
fn lease_recovery_records_only_what_its_replicas_made_durable() {
    let rig = Rig::with(2, 2, 16, true);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(3 * PACKET, 9);
    write(&s, &data).unwrap();
    wait(|d| s.flush(d)).unwrap();
    drop(s);
    for n in &rig.nodes {
        n.arm(Op::FileSync, Fault::Fail(libc::EIO), 0);
    }
    assert!(recovery::recover_file(&*rig.meta, &rig.dns, rig.ino, Default::default()).is_err());
    assert!(rig.meta.uc(rig.ino).unwrap().is_some());
    assert!(!rig.blocks()[0].finalized);
    rig.nodes[0].heal();
    let size = recovery::recover_file(&*rig.meta, &rig.dns, rig.ino, Default::default()).unwrap();
    assert_eq!(size, data.len() as u64);
    let row = rig.blocks().remove(0);
    assert!(row.finalized);
    assert_eq!(row.replicas, [DnId(0)]);
    assert_eq!(rig.read(size), data);
}

/// After an fsync that ended inside a checksum chunk and an append into
/// that chunk, a power cut that kept the chunk's new checksum and lost the
/// appended bytes, on every replica: lease recovery still keeps every
/// fsynced byte.
#[test]
fn lease_recovery_keeps_what_was_fsynced_when_appended_checksums_outran_their_bytes() {
    let rig = Rig::with(3, 3, 16, true);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(1100, 10);
    write(&s, &data[..1000]).unwrap();
    wait(|d| s.sync(d)).unwrap();
    write(&s, &data[1000..]).unwrap();
    wait(|d| s.flush(d)).unwrap();
    drop(s);
    let block = rig.blocks()[0].block_id;
    for n in &rig.nodes {
        let path = n.inner().layout().data_path(ReplicaState::Rbw, block);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 100], 1000).unwrap();
    }
    let size = recovery::recover_file(&*rig.meta, &rig.dns, rig.ino, Default::default()).unwrap();
    assert_eq!(size, 1000);
    assert_eq!(rig.read(size), data[..1000]);
}

/// The metadata store's WAL on the filesystem of a datanode that `syncfs`
/// makes durable (one disk for both, as most mounts have it): that `syncfs`
/// makes the store's commits durable too, with no sync of the WAL of its
/// own (one device flush where there were two). When it fails, the error
/// may be anyone's: the store's own sync runs and tells.
#[test]
fn a_syncfs_of_the_wal_s_filesystem_makes_the_metadata_durable_without_a_sync_of_its_own() {
    let rig = Rig::new(1, 1, 8);
    let node = &rig.nodes[0];
    if !node.syncfs_is_barrier() {
        eprintln!("skipped: the test directory is on a filesystem syncfs does not make durable");
        return;
    }
    let log = rig.log();
    let s = rig.stream(&log);
    // A commit the fsync must make durable, made after the stream's block
    // is open (opening it may reserve ids, durably, on its own).
    let commit = |name: &[u8]| {
        rig.meta.create(ROOT_INO, name, file_node()).unwrap();
        assert!(rig.meta.sync_pending());
    };
    write(&s, &bytes(PACKET, 1)).unwrap();
    wait(|d| s.flush(d)).unwrap();
    commit(b"g1");
    let before = rig.store.syncs_run();
    wait(|d| s.sync(d)).unwrap();
    assert!(!rig.meta.sync_pending(), "the store's commits are durable");
    assert_eq!(
        rig.store.syncs_run(),
        before,
        "the WAL was synced on its own"
    );
    assert_eq!(node.io().fast_paths().wal_by_syncfs, 1);

    // The next block's replicas go through `syncfs` too; it fails.
    write(&s, &bytes(BLOCK as usize, 2)).unwrap();
    wait(|d| s.flush(d)).unwrap();
    commit(b"g2");
    let before = rig.store.syncs_run();
    node.arm(Op::SyncFs, Fault::Fail(libc::EIO), 0);
    wait(|d| s.sync(d)).unwrap();
    assert!(!rig.meta.sync_pending());
    assert_eq!(
        rig.store.syncs_run(),
        before + 1,
        "the store's own sync ran"
    );
    assert_eq!(node.io().fast_paths().wal_by_syncfs, 1);
}

/// A small file's one-step fsync, moved to the CPUs of the disk's
/// completions (`sync_cpus`), fails when the WAL's sync fails, and so does
/// every later one: the move changes where the sync runs, never its
/// result. The move counter proves the path ran.
#[test]
fn a_failed_wal_sync_of_a_moved_small_file_fsync_fails_it() {
    let _turn = crate::sync::lock(&crate::sync_cpus::tests::SERIAL);
    let cpus = crate::sync_cpus::allowed_cpus();
    let moves = cpus.len() > 1;
    crate::sync_cpus::set_for_test(Some(vec![*cpus.last().unwrap()]));
    let rig = Rig::with(2, 2, 16, true);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(4096, 5);
    write(&s, &data).unwrap();
    let before = crate::sync_cpus::moved();
    rig.store.fail_syncs(Some(libc::EIO));
    let e = wait(|d| s.sync(d)).unwrap_err();
    let moved = crate::sync_cpus::moved() - before;
    rig.store.fail_syncs(None);
    let later = wait(|d| s.sync(d));
    crate::sync_cpus::set_for_test(None);
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(later.is_err(), "a later fsync succeeded");
    if moves {
        assert!(moved >= 1, "the one-step fsync was not moved");
    }
}

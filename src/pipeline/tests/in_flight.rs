//! Replicas written before the commit that records their block: no repair
//! running in between may delete them (issue 27, defect 2).

use super::*;
use crate::fsck::{self, Check, Report};

/// An online `fsck --repair` as the daemon runs it (`Core::fsck`): orphans
/// and excess copies deleted, finalized ones with no grace.
fn online_repair(rig: &Rig) -> Report {
    repair_as(rig, false)
}

/// The same, on a daemon that shares the namespace with others or not.
fn repair_as(rig: &Rig, shared: bool) -> Report {
    fsck::run(&Check {
        meta: &*rig.meta,
        dns: &rig.dns,
        repair: true,
        live_leases: Default::default(),
        busy_blocks: Default::default(),
        progress: false,
        deep: true,
        suspect: Default::default(),
        orphans: true,
        excess: true,
        orphan_grace: fsck::ORPHAN_GRACE,
        grace_finalized: false,
        shared,
        copy: true,
        pin: &fsck::no_writers,
        recover: &|_| Ok(0),
        cancelled: &fsck::never_cancelled,
    })
    .expect("fsck")
}

/// The blocks a datanode holds files of, and in which state.
fn held(n: &Faulty) -> Vec<(u64, ReplicaState)> {
    n.list()
        .unwrap()
        .into_iter()
        .map(|r| (r.block, r.state))
        .collect()
}

#[test]
fn an_online_repair_between_a_small_files_replicas_and_its_commit_deletes_nothing() {
    let rig = Rig::new(2, 2, 8);
    let log = rig.log();
    let gate = Arc::new(std::sync::Barrier::new(2));
    *lock(&log.gate) = Some(gate.clone());
    let s = rig.stream(&log);
    // Less than a packet: the whole file is the close's only packet.
    let data = bytes(3000, 7);
    write(&s, &data).unwrap();
    let closing = {
        let s = s.clone();
        std::thread::spawn(move || wait(|d| s.close(d)))
    };
    // The close is about to commit: its replicas are written whole, in
    // finalized/ (the one-step path), and no row lists them yet. (Checked
    // after the close is let go: a panic here would leave it waiting.)
    gate.wait();
    let recorded = rig.blocks();
    let before: Vec<_> = rig.nodes.iter().map(|n| held(n)).collect();
    let report = online_repair(&rig);
    let after: Vec<_> = rig.nodes.iter().map(|n| held(n)).collect();
    gate.wait();
    closing.join().unwrap().unwrap();
    assert!(
        recorded.is_empty(),
        "recorded before the close: {recorded:?}"
    );
    for h in &before {
        assert!(
            matches!(h[..], [(_, ReplicaState::Finalized)]),
            "not the one-step path: {before:?}"
        );
    }
    assert_eq!(after, before, "the repair deleted replicas: {report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert_eq!(rig.read(3000), data);
    let r = online_repair(&rig);
    assert!(r.problems.is_empty(), "{r:?}");
}

#[test]
fn a_replica_of_an_unknown_block_is_kept_while_held_and_deleted_after() {
    let rig = Rig::new(1, 1, 8);
    let hold = rig.dns.hold(4242);
    plant_unknown(&rig, 4242, 3);
    let r = online_repair(&rig);
    assert!(r.problems.is_empty(), "{r:?}");
    assert_eq!(held(&rig.nodes[0]), [(4242, ReplicaState::Finalized)]);
    drop(hold);
    removed_as_orphan(&rig, &online_repair(&rig));
}

/// A finalized replica of block `block`, which no file has, on the rig's
/// first datanode.
fn plant_unknown(rig: &Rig, block: u64, seed: u8) {
    let data = bytes(5000, seed);
    let mut crcs = Vec::new();
    crate::storage::checksum::chunk_crcs(&data, &mut crcs);
    rig.nodes[0]
        .write_finalized(block, 9, &data, &crcs)
        .unwrap();
}

/// The repair `r` took the planted replica for an orphan and removed it.
fn removed_as_orphan(rig: &Rig, r: &Report) {
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == fsck::ProblemKind::OrphanReplica && p.repaired),
        "{r:?}"
    );
    assert!(held(&rig.nodes[0]).is_empty());
}

#[test]
fn over_a_shared_namespace_a_young_unknown_replica_waits_for_the_grace() {
    // Another daemon's block in flight is in no registry here: its age is
    // all this daemon can go by.
    let rig = Rig::new(1, 1, 8);
    plant_unknown(&rig, 4343, 4);
    let r = repair_as(&rig, true);
    assert!(r.problems.is_empty(), "{r:?}");
    assert_eq!(held(&rig.nodes[0]), [(4343, ReplicaState::Finalized)]);
    let old = std::time::SystemTime::now() - fsck::ORPHAN_GRACE - Duration::from_secs(60);
    let path = &rig.nodes[0].find(4343).unwrap().data_path;
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    removed_as_orphan(&rig, &repair_as(&rig, true));
}

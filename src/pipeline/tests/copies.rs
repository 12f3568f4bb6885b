//! Host-local copies (`-o local_copy`, issue 30 item 3): a new block gets R
//! replicas on shared datanodes plus one copy on this host's, which reads
//! try first and which counts toward nothing: fsck neither counts nor
//! reports it, a repair keeps it (and may copy from it), pipeline and
//! lease recovery drop it rather than let it decide anything, and this
//! host's sweep removes it once no block needs it. Another host's copy is
//! never attached here.

use std::time::SystemTime;

use super::*;
use crate::fsck::{self, Check, Report};
use crate::pipeline::copies::Role;
use crate::pipeline::recovery::{Recovery, recover_file};
use crate::storage::ChunkAccumulator;
use crate::storage::testkit::append;

/// Two shared datanodes (0, 1), this host's copy (2), another host's (3).
fn mixed(replication: usize) -> Rig {
    Rig::on_hosts(&[None, None, Some(HERE), Some("b")], replication, 8, true)
}

fn check<'a>(rig: &'a Rig, repair: bool) -> Check<'a> {
    Check {
        meta: &*rig.meta,
        dns: &rig.dns,
        repair,
        live_leases: Default::default(),
        busy_blocks: Default::default(),
        progress: false,
        deep: true,
        suspect: Default::default(),
        orphans: true,
        excess: true,
        orphan_grace: fsck::ORPHAN_GRACE,
        grace_finalized: true,
        shared: true,
        copy: repair,
        pin: &fsck::no_writers,
        recover: &|_| Ok(0),
        cancelled: &fsck::never_cancelled,
    }
}

fn fsck_run(rig: &Rig, repair: bool) -> Report {
    fsck::run(&check(rig, repair)).expect("fsck")
}

/// Makes every file of `block` on `n` look `secs` old (orphan grace).
fn age(n: &Faulty, block: u64, secs: u64) {
    let info = n.find(block).expect("replica");
    let t = SystemTime::now() - std::time::Duration::from_secs(secs);
    let f = std::fs::File::options()
        .write(true)
        .open(&info.data_path)
        .expect("open");
    f.set_modified(t).expect("set mtime");
}

fn write_file(rig: &Rig, data: &[u8]) {
    let log = rig.log();
    let s = rig.stream(&log);
    write(&s, data).unwrap();
    wait(|d| s.close(d)).unwrap();
    assert_unbroken(&log);
}

#[test]
fn a_new_block_goes_to_r_shared_datanodes_and_this_hosts_copy_which_reads_try_first() {
    let rig = mixed(1);
    assert_eq!(rig.dns.role(DnId(2)), Role::Here);
    assert_eq!(rig.dns.health(DnId(3)), Health::Elsewhere);
    // Four blocks through the pipeline, then a one-packet file.
    let data = bytes(4 * BLOCK as usize - 100, 3);
    write_file(&rig, &data);
    let rows = rig.blocks();
    assert_eq!(rows.len(), 4);
    for row in &rows {
        assert_eq!(row.replicas.len(), 2, "{row:?}");
        assert_eq!(row.replicas[1], DnId(2), "the copy comes last: {row:?}");
        assert!(row.replicas[0] == DnId(0) || row.replicas[0] == DnId(1));
    }
    let shared_reads = |rig: &Rig| {
        rig.nodes[..2]
            .iter()
            .map(|n| n.calls(Op::Read))
            .sum::<u64>()
    };
    let before = (shared_reads(&rig), rig.nodes[2].calls(Op::Read));
    assert_eq!(rig.read(data.len() as u64), data);
    assert_eq!(shared_reads(&rig), before.0, "read from a shared replica");
    assert!(rig.nodes[2].calls(Op::Read) > before.1);
    // Without this host's copy, reads go to the shared replica.
    for row in &rows {
        rig.nodes[2].delete(row.block_id).unwrap();
    }
    let mut skipped = Vec::new();
    let got = reader::read(
        &rig.dns,
        &rig.ctx.bad,
        None,
        &rows,
        BLOCK,
        data.len() as u64,
        0,
        data.len(),
        &mut skipped,
    )
    .expect("read past a lost copy");
    assert_eq!(got, data);
    // Placement never counts or chooses copies: R is shared replicas.
    for _ in 0..20 {
        let p = rig.dns.choose_pipeline().unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1], DnId(2));
        assert!(!rig.dns.choose(4, &[]).contains(&DnId(2)));
    }
    assert!(!rig.dns.counts(DnId(2)) && !rig.dns.counts(DnId(3)));
    assert!(rig.dns.counts(DnId(0)));
    assert!(!rig.dns.is_alive(DnId(3)));
    assert!(
        rig.dns.get(DnId(3)).is_none(),
        "another host's copy attached"
    );
}

#[test]
fn a_small_file_gets_its_copy_too_and_a_failed_copy_is_not_replaced() {
    let rig = mixed(1);
    write_file(&rig, &bytes(3000, 1));
    let row = rig.blocks().remove(0);
    assert!(row.finalized);
    assert_eq!(row.replicas.len(), 2);
    assert!(row.replicas.contains(&DnId(2)));
    // The copy fails: the file is written to its shared replica alone
    // (no shared spare stands in for a copy).
    let rig = mixed(1);
    rig.nodes[2].arm(Op::Write, Fault::Fail(libc::EIO), 0);
    let data = bytes(3000, 2);
    write_file(&rig, &data);
    let row = rig.blocks().remove(0);
    assert_eq!(row.replicas.len(), 1, "{row:?}");
    assert!(!rig.dns.is_copy(row.replicas[0]));
    assert_eq!(rig.read(3000), data);
}

#[test]
fn a_copy_failing_mid_block_leaves_the_pipeline_and_copies_alone_carry_no_block() {
    let rig = Rig::on_hosts(&[None, Some(HERE)], 1, 16, true);
    let log = rig.log();
    let s = rig.stream(&log);
    rig.nodes[1].arm(Op::Write, Fault::Fail(libc::EIO), 2);
    let data = bytes(10 * PACKET, 2);
    write(&s, &data).unwrap();
    wait(|d| s.flush(d)).unwrap();
    assert_eq!(rig.blocks()[0].replicas, [DnId(0)]);
    wait(|d| s.close(d)).unwrap();
    assert_eq!(rig.read(data.len() as u64), data);
    // The shared replica fails and no shared spare is left: the copy
    // does not carry the block on alone.
    let rig = Rig::on_hosts(&[None, Some(HERE)], 1, 16, true);
    let log = rig.log();
    let s = rig.stream(&log);
    rig.nodes[0].arm(Op::Write, Fault::Fail(libc::EIO), 2);
    write(&s, &data).unwrap();
    let flushed = wait(|d| s.flush(d));
    assert!(matches!(flushed, Err(FsError::Io(_))), "{flushed:?}");
    assert!(
        rig.blocks().iter().all(|b| rig.dns.any_shared(&b.replicas)),
        "{:?}",
        rig.blocks()
    );
}

#[test]
fn fsck_neither_counts_nor_reports_copies_and_a_repair_keeps_them_and_copies_from_them() {
    let rig = mixed(1);
    let data = bytes(20_000, 5);
    write_file(&rig, &data);
    let mut row = rig.blocks().remove(0);
    // Another host wrote its own copy of the block too.
    let before = row.clone();
    row.replicas.push(DnId(3));
    rig.meta
        .commit(
            &[Change::PutBlockIf {
                expect: before,
                row: row.clone(),
            }],
            true,
        )
        .unwrap();
    let r = fsck_run(&rig, false);
    assert_eq!(r.exit_code(), 0, "{}\n{:?}", r.summary(), r.problems);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.summary().contains("1 elsewhere"), "{}", r.summary());
    let st = rig.dns.statuses();
    assert_eq!(st[3].state_name(), "elsewhere");
    assert_eq!(st[3].host.as_deref(), Some("b"));
    // The shared replica is lost: under-replicated (the copies do not
    // count), not missing (this host's copy holds it), and a repair
    // copies it back from the copy, keeping both copies in the row.
    let shared = row.replicas[0];
    rig.nodes[shared.0 as usize].delete(row.block_id).unwrap();
    let r = fsck_run(&rig, false);
    assert_eq!(r.exit_code(), 1);
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == fsck::ProblemKind::UnderReplicated),
        "{:?}",
        r.problems
    );
    assert!(
        !r.problems
            .iter()
            .any(|p| p.kind == fsck::ProblemKind::MissingBlock),
        "{:?}",
        r.problems
    );
    let r = fsck_run(&rig, true);
    assert_eq!(r.exit_code(), 0, "{:?}", r.problems);
    let now = rig.blocks().remove(0);
    assert_eq!(rig.dns.shared_count(&now.replicas), 1, "{now:?}");
    assert!(now.replicas.contains(&DnId(2)) && now.replicas.contains(&DnId(3)));
    // This host's copy lost: nothing to report, nothing to repair.
    rig.nodes[2].delete(row.block_id).unwrap();
    let r = fsck_run(&rig, true);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(rig.blocks().remove(0), now);
    let mut skipped = Vec::new();
    let got = reader::read(
        &rig.dns,
        &rig.ctx.bad,
        None,
        &[now],
        BLOCK,
        20_000,
        0,
        20_000,
        &mut skipped,
    )
    .unwrap();
    assert_eq!(got, data);
}

#[test]
fn this_hosts_sweep_removes_its_copies_no_block_needs_and_nothing_else() {
    let rig = Rig::on_hosts(&[None, Some(HERE)], 1, 8, true);
    write_file(&rig, &bytes(BLOCK as usize + 2000, 6));
    let rows = rig.blocks();
    let (kept, gone) = (rows[0].clone(), rows[1].clone());
    // Cut away on another host: the row went, and this host's copy stayed
    // behind (as did the shared replica here, for the leader to sweep).
    rig.meta
        .commit(
            &[Change::DropBlocksFrom {
                ino: rig.ino,
                from: gone.idx,
            }],
            true,
        )
        .unwrap();
    // Young: within the grace, kept.
    let r = fsck::sweep_copies(&check(&rig, true)).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(rig.nodes[1].find(gone.block_id).is_some());
    age(&rig.nodes[1], gone.block_id, 3600);
    age(&rig.nodes[0], gone.block_id, 3600);
    age(&rig.nodes[1], kept.block_id, 3600);
    let r = fsck::sweep_copies(&check(&rig, true)).unwrap();
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert!(r.problems[0].repaired);
    assert!(rig.nodes[1].find(gone.block_id).is_none(), "copy left");
    assert!(
        rig.nodes[1].quarantined().unwrap().is_empty(),
        "a copy is deleted, not kept"
    );
    assert!(
        rig.nodes[1].find(kept.block_id).is_some(),
        "needed copy swept"
    );
    // Shared datanodes are the leader's to sweep.
    assert!(rig.nodes[0].find(gone.block_id).is_some());
}

/// Replica `dn` of block 7: `data` at stamp 1, restamped to 2.
fn replica(rig: &Rig, dn: u32, data: &[u8]) {
    let node = rig.dns.get(DnId(dn)).expect("datanode");
    let mut w = node.create_rbw(7, 1).expect("rbw");
    append(&mut *w, &mut ChunkAccumulator::new(), data, &[4096]);
    drop(w);
    node.bump_gs(7, 1, 2).expect("bump");
}

fn record_open_block(rig: &Rig, replicas: Vec<DnId>) {
    let row = BlockRow {
        ino: rig.ino,
        idx: 0,
        block_id: 7,
        gs: 2,
        len: 0,
        finalized: false,
        replicas,
    };
    let uc = UnderConstruction {
        ino: rig.ino,
        holder: "h:1".into(),
        pid: 1,
        comm: "w".into(),
        epoch: 1,
        mount_id: "gone".into(),
        since_ms: 0,
    };
    rig.meta
        .commit(&[Change::PutUc(uc), Change::PutBlock(row)], true)
        .unwrap();
}

#[test]
fn recovery_takes_the_shared_replicas_length_and_drops_other_hosts_copies() {
    // This host's copy lost its unsynced tail: it leaves the block, which
    // keeps what the shared replica holds.
    let rig = mixed(1);
    let data = bytes(10_000, 4);
    replica(&rig, 0, &data);
    replica(&rig, 2, &data[..6000]);
    record_open_block(&rig, vec![DnId(0), DnId(2), DnId(3)]);
    let len = recover_file(&*rig.meta, &rig.dns, rig.ino, Recovery::default()).unwrap();
    assert_eq!(len, 10_000);
    let row = rig.blocks().remove(0);
    assert!(row.finalized);
    assert_eq!(row.replicas, [DnId(0)], "copies stayed: {row:?}");
    assert_eq!(rig.read(10_000), data);
}

#[test]
fn copies_alone_do_not_close_a_block_whose_shared_replica_is_out_of_reach() {
    let rig = mixed(1);
    let data = bytes(10_000, 8);
    replica(&rig, 0, &data);
    replica(&rig, 2, &data);
    record_open_block(&rig, vec![DnId(0), DnId(2)]);
    // The store is out of reach: its heartbeat failed, its replica cannot
    // be synced.
    rig.nodes[0].arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    rig.dns.mark_dead(DnId(0));
    let r = recover_file(&*rig.meta, &rig.dns, rig.ino, Recovery::default());
    assert!(matches!(r, Err(FsError::Io(_))), "{r:?}");
    assert!(rig.meta.uc(rig.ino).unwrap().is_some(), "closed on a copy");
    assert!(!rig.blocks()[0].finalized);
    rig.nodes[0].heal();
    rig.dns.heartbeat();
    let len = recover_file(&*rig.meta, &rig.dns, rig.ino, Recovery::default()).unwrap();
    assert_eq!(len, 10_000);
    assert_eq!(rig.blocks()[0].replicas, [DnId(0), DnId(2)]);
}

#[test]
fn an_append_here_drops_another_hosts_copy_from_the_block() {
    let rig = Rig::on_hosts(&[None, Some("b")], 1, 8, true);
    let data = bytes(30_000, 9);
    write_file(&rig, &data[..20_000]);
    // Host b wrote the block with its copy.
    let row = rig.blocks().remove(0);
    let mut theirs = row.clone();
    theirs.replicas.push(DnId(1));
    rig.meta
        .commit(
            &[Change::PutBlockIf {
                expect: row,
                row: theirs,
            }],
            true,
        )
        .unwrap();
    write_file(&rig, &data[20_000..]);
    let row = rig.blocks().remove(0);
    assert_eq!(row.replicas, [DnId(0)], "{row:?}");
    assert_eq!(row.len, 30_000);
    assert_eq!(rig.read(30_000), data);
}

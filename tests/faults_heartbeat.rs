//! Datanode heartbeats (docs/SEMANTICS.md "Datanode health,
//! housekeeping and fsck"): every 3 s each datanode directory must take a small synced write. A
//! datanode that cannot (made read-only, directory removed) is reported
//! dead by `fsck` (in its list of datanode states, apart from the block
//! problems) within about one heartbeat, is logged, and is left out of new
//! pipelines; once it is healthy again it rejoins them.

mod common;
use common::faults::*;
use common::*;

use std::time::{Duration, Instant};

/// A heartbeat period (3 s), the heartbeat itself and some slack.
const DETECT: Duration = Duration::from_millis(4500);

fn four_datanodes() -> Mount {
    Mount::with(Opts {
        datanodes: 4,
        replication: Some(3),
        o: vec![],
        args: Vec::new(),
    })
}

/// Polls fsck until `dn` is reported dead (true) or alive again (false);
/// returns how long it took.
fn wait_dead(m: &Mount, dn: u64, dead: bool) -> Duration {
    let t0 = Instant::now();
    let mut last = serde_json::Value::Null;
    // fsck runs as a process: every 100 ms.
    let reported = poll_until(DETECT, Duration::from_millis(100), || {
        let (code, r) = m.fsck_json();
        if (datanode_state(&r, dn) == "dead") != dead {
            last = r;
            return false;
        }
        // A dead datanode that holds no replica leaves every block
        // whole: it is listed, the filesystem is healthy.
        assert_eq!(code, 0, "the blocks are whole: {r}");
        if dead {
            assert_eq!(r["datanodes_alive"], 3, "{r}");
        } else {
            assert_eq!(r["datanodes_alive"], 4, "{r}");
        }
        true
    });
    if reported {
        return t0.elapsed();
    }
    panic!(
        "datanode {dn} not reported {} by fsck within {DETECT:?}; last report: {last}\nlog:\n{}",
        if dead { "dead" } else { "alive" },
        m.log()
    );
}

/// Writes `n` new files of `len` bytes and returns (name, data, block).
fn new_files(m: &Mount, tag: &str, n: usize, len: usize) -> Vec<(String, Vec<u8>, Block)> {
    (0..n)
        .map(|i| {
            let name = format!("{tag}{i}");
            let data = pattern(len, (i as u64 + 1) * 977);
            m.put(&name, &data);
            let b = wait_closed(m, &name);
            assert_eq!(b.len(), 1, "{name}: {b:?}");
            (name, data, b[0].clone())
        })
        .collect()
}

/// Every replica the block table names holds the file's bytes with
/// checksums that verify.
fn assert_replicas_verify(m: &Mount, files: &[(String, Vec<u8>, Block)]) {
    for (name, data, b) in files {
        for &dn in &b.replicas {
            if let Err(e) = verify_replica(&m.datanodes[dn], b.id, Some(b.gs), data) {
                panic!("{name}: {e}");
            }
        }
    }
}

#[test]
fn an_unwritable_datanode_is_reported_dead_within_a_heartbeat_left_out_of_new_pipelines_and_rejoins()
 {
    let m = four_datanodes();
    let mut ro = RoBind::new(&m.datanodes[3]);
    let took = wait_dead(&m, 3, true);
    eprintln!("read-only datanode reported dead after {took:?}");
    assert!(
        !m.log_lines(&["heartbeat failed", "datanode=3"]).is_empty(),
        "the log does not report the failed heartbeat:\n{}",
        m.log()
    );

    // New files: full pipelines of live datanodes only, no writer error.
    let files = new_files(&m, "while-dead-", 4, 100_000);
    for (name, _, b) in &files {
        assert_eq!(
            b.replicas.len(),
            3,
            "{name}: R=3 with 3 live datanodes: {b:?}"
        );
        assert!(
            !b.replicas.contains(&3),
            "{name} has a replica on the dead datanode: {b:?}"
        );
        assert!(b.finalized, "{name}: {b:?}");
    }
    assert_replicas_verify(&m, &files);
    assert!(replica(&m.datanodes[3], files[0].2.id).is_none());

    ro.restore();
    let took = wait_dead(&m, 3, false);
    eprintln!("restored datanode rejoined after {took:?}");
    assert!(
        !m.log_lines(&["healthy again", "datanode=3"]).is_empty(),
        "the log does not report the datanode rejoining:\n{}",
        m.log()
    );
    // It takes part in new pipelines again (3 of 4, drawn by free space,
    // which all four share: ten files all missing it would be a one in a
    // million chance).
    let later = new_files(&m, "after-", 10, 100_000);
    assert!(
        later.iter().any(|(_, _, b)| b.replicas.contains(&3)),
        "no new block was placed on the rejoined datanode: {later:?}"
    );
    assert_replicas_verify(&m, &later);
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "healthy again: {r}");
}

#[test]
fn a_removed_datanode_directory_is_reported_dead_within_a_heartbeat_and_rejoins_once_recreated() {
    let m = four_datanodes();
    remove_live_dir(&m.datanodes[1]);
    let took = wait_dead(&m, 1, true);
    eprintln!("removed datanode reported dead after {took:?}");
    assert!(
        !m.log_lines(&["heartbeat failed", "datanode=1"]).is_empty(),
        "{}",
        m.log()
    );

    let files = new_files(&m, "while-gone-", 3, 70_000);
    for (name, _, b) in &files {
        assert_eq!(b.replicas.len(), 3, "{name}: {b:?}");
        assert!(
            !b.replicas.contains(&1),
            "{name} placed on the removed datanode: {b:?}"
        );
    }
    assert_replicas_verify(&m, &files);

    // The operator puts an empty directory back: it can be written and
    // has free space, so it is healthy and rejoins.
    std::fs::create_dir_all(&m.datanodes[1]).unwrap();
    let took = wait_dead(&m, 1, false);
    eprintln!("recreated datanode rejoined after {took:?}");
    let later = new_files(&m, "after-", 10, 70_000);
    assert!(
        later.iter().any(|(_, _, b)| b.replicas.contains(&1)),
        "no new block was placed on the recreated datanode: {later:?}"
    );
    assert_replicas_verify(&m, &later);
}

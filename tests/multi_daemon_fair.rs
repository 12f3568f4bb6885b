//! Fairness across daemons (docs/SEMANTICS.md, "Several daemons"): four
//! racers on each of two daemons over one etcd contend for one file, a
//! hundred grants in all. A released file must be winnable from every
//! daemon (no stickiness of the cluster claim to the daemon that held it
//! last), and with `lease_wait` the waiters of all daemons queue FIFO in
//! etcd. The criterion: each daemon wins at least a quarter of the grants.

mod common;

use std::time::Duration;

use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::*;

const GRANTS: usize = 100;

fn race(o: &[&str]) {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "fair", &dns, o);
    let b = daemon(&etcd, "fair", &dns, o);
    a.sh_ok("touch f");
    assert!(wait_until(Duration::from_secs(3), || b.path("f").exists()));
    // Four threads per daemon (tools/testkit/src/load.rs), each looping:
    // open the file for append (waiting in the open with `lease_wait`;
    // `EBUSY` means try again after a moment), append one line `TAG`,
    // close. They stop once the file holds `GRANTS` lines (or after 90 s);
    // each process says how many opens it won.
    let spawn = |m: &Mount, tag: &str| {
        std::process::Command::new(testkit())
            .args([
                "contend",
                m.path("f").to_str().expect("path"),
                tag,
                "4",
                &GRANTS.to_string(),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn racers")
    };
    let ra = spawn(&a, "A");
    let rb = spawn(&b, "B");
    let oa = ra.wait_with_output().expect("racers on A");
    let ob = rb.wait_with_output().expect("racers on B");
    for (name, o) in [("A", &oa), ("B", &ob)] {
        assert!(
            o.status.success(),
            "racers on {name} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let text = a.read_string("f");
    let (wa, wb) = (
        text.lines().filter(|l| *l == "A").count(),
        text.lines().filter(|l| *l == "B").count(),
    );
    let total = wa + wb;
    eprintln!("grants: A {wa}, B {wb} (options {o:?})");
    assert!(
        total >= GRANTS,
        "only {total} grants in 90 s (A {wa}, B {wb})"
    );
    assert!(
        wa * 4 >= total && wb * 4 >= total,
        "one daemon starved the other: A won {wa}, B won {wb} of {total}"
    );
}

#[test]
fn racers_on_two_daemons_each_win_a_fair_share() {
    race(&[]);
}

#[test]
fn waiters_on_two_daemons_queue_fifo_and_each_win_a_fair_share() {
    race(&["lease_wait=10"]);
}

/// Waiters of both daemons get a file in the order they asked for it,
/// whichever daemon the holder and each waiter are on.
#[test]
fn waiters_across_daemons_get_the_file_in_the_order_they_asked() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "fifo", &dns, &["lease_wait=20"]);
    let b = daemon(&etcd, "fifo", &dns, &["lease_wait=20"]);
    let mut holder = Agent::spawn(&a.mnt);
    holder.ok("open f wc");
    assert!(wait_until(Duration::from_secs(3), || b.path("f").exists()));
    // Waiters in the order B, A, B: each asks once the one before it is in
    // the file's queue in etcd (`queue/<ino>/...`, see src/etcd/queue.rs).
    let mut waiters = vec![
        ("1", Agent::spawn(&b.mnt)),
        ("2", Agent::spawn(&a.mnt)),
        ("3", Agent::spawn(&b.mnt)),
    ];
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(a.path("f")).expect("stat f"));
    let queue = format!("/leasefs/fifo/queue/{ino:016x}/");
    for (i, (name, w)) in waiters.iter_mut().enumerate() {
        w.send("open f wa");
        wait_for(
            Duration::from_secs(10),
            &format!("waiter {name} to join the file's queue in etcd"),
            || etcd.count_keys(&queue) == i as u64 + 1,
        );
    }
    for (name, w) in &waiters {
        assert_eq!(w.reply(Duration::ZERO), None, "waiter {name} did not wait");
    }
    holder.ok("write H");
    holder.ok("close");
    for i in 0..waiters.len() {
        let (done, later) = waiters.split_at_mut(i + 1);
        let (name, w) = &mut done[i];
        let r = w.reply(Duration::from_secs(15)).unwrap_or_default();
        assert!(r.starts_with("ok"), "waiter {name}: {r}");
        w.ok(&format!("write {name}"));
        w.ok("close");
        for (later, l) in later.iter() {
            if let Some(r) = l.reply(Duration::ZERO) {
                panic!("waiter {later} was served before waiter {name} was done: {r}");
            }
        }
    }
    assert_eq!(a.read_string("f"), "H\n1\n2\n3\n");
}

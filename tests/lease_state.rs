//! Lease state users can see and rely on (DESIGN §1 "Details of the
//! contract", §4): `leasefs leases` (table and `--json`), files left open by
//! a crashed daemon closed at remount, and fencing epochs that only grow.

mod common;
use common::*;

use std::time::Duration;

use serde_json::Value;

fn epoch_of(a: &mut Agent) -> u64 {
    a.ok("epoch").parse().expect("epoch")
}

fn leases_json(m: &Mount) -> Vec<Value> {
    let o = m.leasefs(&["leases", m.mnt.to_str().unwrap(), "--json"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "leases --json: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    match serde_json::from_str(&out) {
        Ok(Value::Array(v)) => v,
        _ => panic!("leases --json did not print a JSON array: {out}"),
    }
}

#[test]
fn leases_json_lists_every_held_file_with_holder_identity() {
    let m = Mount::with_o("lease_wait=30");
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let before = now_ms();
    m.sh_ok("mkdir d");
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open f1 wac");
    a.ok("write a");
    let mut b = Agent::spawn(&m.mnt);
    b.ok("open d/f2 wac");
    b.ok("client-renewal");
    let mut w = Agent::spawn(&m.mnt);
    w.send("open f1 wa");
    assert!(
        wait_until(Duration::from_secs(3), || m.lease("f1")["waiters"] == 1),
        "{}",
        m.lease("f1")
    );

    let list = leases_json(&m);
    assert_eq!(list.len(), 2, "{list:?}");
    let host = hostname();
    for (rel, who, mode, waiting) in [("f1", &a, "daemon", 1), ("d/f2", &b, "client", 0)] {
        let path = m.path(rel).display().to_string();
        let l = list
            .iter()
            .find(|l| l["path"] == path.as_str())
            .unwrap_or_else(|| panic!("{path} is not listed: {list:?}"));
        assert_eq!(l["state"], "held", "{l}");
        assert_eq!(l["holder"], format!("{host}:{}", who.pid), "{l}");
        assert_eq!(l["comm"], comm_of(who.pid), "{l}");
        assert_eq!(l["mode"], mode, "{l}");
        assert_eq!(l["waiters"], waiting, "{l}");
        let epoch = l["epoch"].as_u64().unwrap_or(0);
        assert!(epoch > 0 && epoch == m.epoch(rel), "{l}");
        assert!(
            l["renewed_ms_ago"].as_u64().is_some_and(|ms| ms < 60_000),
            "{l}"
        );
        let opened = l["opened_wall_ms"].as_u64().unwrap_or(0);
        assert!(
            opened >= before && opened <= now_ms(),
            "open time {opened} not in the test's span: {l}"
        );
        // The xattr says the same.
        let x = m.lease(rel);
        for k in ["state", "holder", "comm", "epoch", "mode", "waiters"] {
            assert_eq!(x[k], l[k], "{k}: xattr {x} vs leases {l}");
        }
    }

    a.ok("close");
    assert!(
        w.reply(Duration::from_secs(3))
            .is_some_and(|r| r.starts_with("ok"))
    );
    w.ok("close");
    b.ok("close");
    assert_eq!(
        leases_json(&m),
        Vec::<Value>::new(),
        "leases left after every writer closed"
    );
}

#[test]
fn leases_table_has_header_and_one_row_per_lease() {
    let m = Mount::new();
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open f1 wac");
    let mut b = Agent::spawn(&m.mnt);
    b.ok("open f2 wac");
    let o = m.leasefs(&["leases", m.mnt.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two rows expected:\n{out}");
    for col in [
        "PATH", "STATE", "HOLDER", "COMM", "EPOCH", "MODE", "WAITERS",
    ] {
        assert!(lines[0].contains(col), "header lacks {col}: {}", lines[0]);
    }
    for (rel, who) in [("f1", &a), ("f2", &b)] {
        let path = m.path(rel).display().to_string();
        let row = lines[1..]
            .iter()
            .find(|l| l.split_whitespace().next() == Some(path.as_str()))
            .unwrap_or_else(|| panic!("no row for {path}:\n{out}"));
        assert!(
            row.contains(&format!(":{}", who.pid)),
            "row lacks the holder's pid: {row}"
        );
        assert!(row.contains("held") && row.contains("daemon"), "{row}");
        assert!(row.contains(&m.epoch(rel).to_string()), "{row}");
    }
}

#[test]
fn daemon_crash_leaves_no_file_open_after_remount() {
    let mut m = Mount::new();
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok("rep 5000 durable");
    h.ok("fsync");
    h.ok("write unsynced");
    let e1 = m.epoch("f");
    m.crash();
    m.mount();

    assert_eq!(m.lease_state("f"), "free", "{}", m.lease("f"));
    let synced = "durable\n".repeat(5000);
    let s = m.read_string("f");
    assert!(
        s.starts_with(&synced),
        "fsynced bytes lost: {} of {} bytes left",
        s.len(),
        synced.len()
    );
    assert!(
        s == synced || s == format!("{synced}unsynced\n"),
        "unexpected tail {:?}",
        &s[synced.len()..]
    );

    // The old holder, still alive, cannot reach the new mount through its fd.
    let r = h.cmd("write stale");
    assert!(
        r.starts_with("err"),
        "a write through the dead mount succeeded: {r}"
    );

    let mut next = Agent::spawn(&m.mnt);
    let r = next.cmd("open f wa");
    assert!(
        r.starts_with("ok") && reply_ms(&r) < 1000,
        "open after remount: {r}"
    );
    assert!(epoch_of(&mut next) > e1);
    next.ok("write after");
    next.ok("close");
    assert_eq!(m.read_string("f"), format!("{s}after\n"));
    assert_eq!(leases_json(&m), Vec::<Value>::new());
    assert!(
        m.log().contains("previous daemon"),
        "the log does not mention the startup recovery"
    );
}

/// Records a grant's epoch, asserting it is above every earlier one.
fn check(seen: &mut Vec<u64>, e: u64, what: &str) {
    if let Some(&last) = seen.last() {
        assert!(
            e > last,
            "{what}: epoch {e} is not above the previous grant's {last} ({seen:?})"
        );
    }
    seen.push(e);
}

#[test]
fn every_grant_has_a_larger_epoch_also_across_remount() {
    let mut m = Mount::new();
    let mut seen: Vec<u64> = Vec::new();
    for i in 0..3 {
        let mut a = Agent::spawn(&m.mnt);
        a.ok("open f wac");
        let e = epoch_of(&mut a);
        assert_eq!(m.epoch("f"), e, "user.leasefs.epoch while held");
        a.ok(&format!("write {i}"));
        a.ok("close");
        assert_eq!(m.epoch("f"), e, "user.leasefs.epoch after close");
        check(&mut seen, e, "agent grant");
    }
    for _ in 0..3 {
        m.sh_ok("echo sh >> f");
        check(&mut seen, m.epoch("f"), "shell append");
    }
    // Grants on other files do not disturb the order on this one.
    m.sh_ok("echo other > g; echo f >> f");
    check(&mut seen, m.epoch("f"), "after a grant on g");

    m.unmount();
    m.mount();
    assert_eq!(
        m.epoch("f"),
        *seen.last().unwrap(),
        "last epoch not kept across remount"
    );
    m.sh_ok("echo remounted >> f");
    check(&mut seen, m.epoch("f"), "first grant after remount");

    // A crash with the file held: the grant after it is larger still.
    {
        let mut h = Agent::spawn(&m.mnt);
        h.ok("open f wa");
        h.ok("write held");
        h.ok("fsync");
        check(&mut seen, epoch_of(&mut h), "grant before the crash");
        m.crash();
    }
    m.mount();
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open f wa");
    check(&mut seen, epoch_of(&mut a), "first grant after a crash");
    a.ok("close");
}

#[test]
fn epoch_of_a_grant_without_writes_is_still_the_last_epoch() {
    let mut m = Mount::new();
    m.sh_ok("echo x > f");
    let e1 = m.epoch("f");
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open f wa");
    let e2 = epoch_of(&mut a);
    assert!(e2 > e1);
    assert_eq!(m.epoch("f"), e2, "user.leasefs.epoch while held");
    a.ok("close");
    assert_eq!(
        m.epoch("f"),
        e2,
        "user.leasefs.epoch went back after a grant that wrote nothing"
    );
    // The agent works in the mount: it goes first, or the unmount is busy.
    drop(a);
    m.unmount();
    m.mount();
    assert_eq!(m.epoch("f"), e2, "user.leasefs.epoch after remount");
}

//! Expiry and recovery (DESIGN §1 "Two different heartbeats", "Expiry and
//! recovery"): a client-renewed holder that stops renewing is preempted
//! after the soft limit and closed by the monitor after the hard limit, and
//! is fenced afterwards; a daemon-renewed holder is never preempted for
//! being slow; `leasefs recover-lease` recovers by hand.

mod common;
use common::*;

use std::time::{Duration, Instant};

const CLIENT_RENEWAL: &str = "client-renewal";
const RENEW: &str = "renew";

fn epoch_of(a: &mut Agent) -> u64 {
    a.ok("epoch").parse().expect("epoch")
}

/// Lets time pass until `t`: a stopped holder's lease must go unrenewed
/// for that long, which only time does.
fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        let_time_pass(d);
    }
}

/// The stopped holder is resumed and finds itself fenced: every write,
/// renewal, fsync and close fails with EIO.
fn assert_fenced(h: &mut Agent) {
    h.signal(libc::SIGCONT);
    for cmd in ["write late", RENEW, "fsync", "close"] {
        let r = h.cmd(cmd);
        assert_eq!(
            err_name(&r),
            Some("EIO"),
            "`{cmd}` by the preempted holder: {r}"
        );
    }
}

#[test]
fn stopped_client_renewed_holder_is_preempted_after_soft_limit_and_fenced() {
    let m = Mount::with_o("soft_limit=2,monitor_interval=0.2");
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok(CLIENT_RENEWAL);
    h.ok("write first");
    h.ok("fsync");
    let e1 = epoch_of(&mut h);
    assert_eq!(m.epoch("f"), e1);
    assert_eq!(m.lease("f")["mode"], "client", "{}", m.lease("f"));

    // Renewing keeps it: 3 s of renewals, past the soft limit.
    let mut other = Agent::spawn(&m.mnt);
    for _ in 0..6 {
        // Renewals are paced in time: that they outlast the limit is the point.
        let_time_pass(Duration::from_millis(500));
        h.ok(RENEW);
    }
    let r = other.cmd("open f wa");
    assert_eq!(
        err_name(&r),
        Some("EBUSY"),
        "a renewing client holder was preempted: {r}"
    );

    h.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let r = other.cmd("open f wa");
    assert_eq!(
        err_name(&r),
        Some("EBUSY"),
        "preempted before the soft limit: {r}"
    );

    sleep_until(stopped + Duration::from_millis(2500));
    let r = other.cmd("open f wa");
    assert!(
        r.starts_with("ok"),
        "open after the soft limit of a stopped client holder: {r}"
    );
    assert!(reply_ms(&r) < 2000, "preempting open took {r}");
    let e2 = epoch_of(&mut other);
    assert!(e2 > e1, "new grant epoch {e2} is not above {e1}");
    assert_eq!(m.epoch("f"), e2);
    assert_eq!(
        m.read_string("f"),
        "first\n",
        "recovery kept other bytes than the acknowledged ones"
    );
    other.ok("write second");
    other.ok("fsync");

    assert_fenced(&mut h);
    other.ok("close");
    assert_eq!(m.read_string("f"), "first\nsecond\n");
    assert_eq!(m.lease_state("f"), "free");
}

#[test]
fn stopped_daemon_renewed_holder_is_not_preempted_after_soft_limit() {
    let m = Mount::with_o("soft_limit=2,monitor_interval=0.2");
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok("write first");
    h.ok("fsync");
    h.signal(libc::SIGSTOP);
    // Stopped for longer than the soft limit: only time can show that a
    // daemon-renewed lease does not expire.
    let_time_pass(Duration::from_millis(3500));
    let mut other = Agent::spawn(&m.mnt);
    let r = other.cmd("open f wa");
    assert_eq!(
        err_name(&r),
        Some("EBUSY"),
        "a daemon-renewed holder was preempted: {r}"
    );
    let l = m.lease("f");
    assert_eq!(l["state"], "held", "{l}");
    assert_eq!(l["mode"], "daemon", "{l}");
    assert_eq!(l["holder"], format!("{}:{}", hostname(), h.pid), "{l}");
    h.signal(libc::SIGCONT);
    h.ok("write still mine");
    h.ok("close");
    assert_eq!(m.read_string("f"), "first\nstill mine\n");
}

#[test]
fn queued_writer_preempts_stopped_client_holder_at_soft_limit() {
    let m = Mount::with_o("soft_limit=2,monitor_interval=0.2,lease_wait=10");
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok(CLIENT_RENEWAL);
    h.ok("write first");
    h.ok("fsync");
    h.ok(RENEW);
    let renewed = Instant::now();
    h.signal(libc::SIGSTOP);
    let mut other = Agent::spawn(&m.mnt);
    other.send("open f wa");
    let r = other
        .reply(Duration::from_secs(8))
        .expect("the queued writer was never granted");
    let waited = renewed.elapsed();
    assert!(r.starts_with("ok"), "{r}");
    assert!(
        waited >= Duration::from_millis(1800) && waited < Duration::from_millis(3500),
        "granted {waited:?} after the last renewal, soft_limit is 2 s"
    );
    other.ok("write second");
    assert_fenced(&mut h);
    other.ok("close");
    assert_eq!(m.read_string("f"), "first\nsecond\n");
}

#[test]
fn monitor_closes_client_lease_past_hard_limit_without_other_writer() {
    let m = Mount::with_o("soft_limit=1,hard_limit=2,monitor_interval=0.2");
    // A daemon-renewed holder, stopped as long: never expires.
    let mut d = Agent::spawn(&m.mnt);
    d.ok("open g wac");
    d.ok("write daemon");
    d.signal(libc::SIGSTOP);

    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok(CLIENT_RENEWAL);
    h.ok("write acked");
    h.ok("fsync");
    h.ok(RENEW);
    let renewed = Instant::now();
    h.signal(libc::SIGSTOP);
    assert_eq!(m.lease_state("f"), "held");
    assert!(
        wait_until(Duration::from_secs(6), || m.lease_state("f") == "free"),
        "the file was not closed past the hard limit: {}",
        m.lease("f")
    );
    let after = renewed.elapsed();
    assert!(
        after >= Duration::from_millis(1800),
        "closed {after:?} after the last renewal, before hard_limit=2"
    );
    assert!(
        after < Duration::from_millis(4000),
        "closed only {after:?} after the last renewal"
    );
    let log = m.log();
    assert!(
        log.lines().any(|l| l.contains("HardLimit")) && log.contains("lease recovery"),
        "the log does not mention the hard-limit recovery:\n{log}"
    );
    assert_eq!(m.read_string("f"), "acked\n");
    assert_fenced(&mut h);
    assert_eq!(m.read_string("f"), "acked\n");
    // The file is closed: anyone may write it at once.
    m.sh_ok("echo next >> f");
    assert_eq!(m.read_string("f"), "acked\nnext\n");

    assert_eq!(
        m.lease_state("g"),
        "held",
        "a daemon-renewed holder expired: {}",
        m.lease("g")
    );
    d.signal(libc::SIGCONT);
    d.ok("close");
    assert_eq!(m.read_string("g"), "daemon\n");
}

#[test]
fn recover_lease_closes_a_held_file_and_fences_its_holder() {
    let m = Mount::new();
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok("write acked");
    h.ok("fsync");
    let e1 = epoch_of(&mut h);
    h.signal(libc::SIGSTOP);

    let path = m.path("f");
    let o = m.leasefs(&["recover-lease", path.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "recover-lease: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("closed"),
        "recover-lease did not say the file is closed: {out}"
    );
    assert_eq!(m.lease_state("f"), "free", "{}", m.lease("f"));
    assert_eq!(m.read_string("f"), "acked\n");

    assert_fenced(&mut h);
    let mut next = Agent::spawn(&m.mnt);
    let r = next.cmd("open f wa");
    assert!(
        r.starts_with("ok") && reply_ms(&r) < 1000,
        "open of the recovered file: {r}"
    );
    assert!(epoch_of(&mut next) > e1);
    next.ok("write next");
    next.ok("close");
    assert_eq!(m.read_string("f"), "acked\nnext\n");
}

#[test]
fn recover_lease_exits_0_on_closed_file_and_2_outside_a_mount() {
    let m = Mount::new();
    m.sh_ok("echo closed > f");
    let o = m.leasefs(&["recover-lease", m.path("f").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("closed"));
    assert_eq!(m.read_string("f"), "closed\n");

    for outside in [
        m.dir.path().to_path_buf(),
        m.data.clone(),
        m.path("missing"),
    ] {
        let o = m.leasefs(&["recover-lease", outside.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "recover-lease {}: {err}",
            outside.display()
        );
        assert_eq!(err.lines().count(), 1, "expected one line, got: {err}");
        assert!(
            o.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn killed_writer_releases_its_lease_at_once() {
    let m = Mount::new();
    let mut h = Agent::spawn(&m.mnt);
    h.ok("open f wac");
    h.ok("write acked");
    h.ok("fsync");
    h.ok("write buffered");
    h.signal(libc::SIGKILL);
    assert!(
        h.wait_exit(Duration::from_secs(5)).is_some(),
        "writer did not die"
    );
    // Its open file description is gone: no soft or hard limit to wait for.
    assert!(
        wait_until(Duration::from_secs(2), || m.lease_state("f") == "free"),
        "{}",
        m.lease("f")
    );
    let mut next = Agent::spawn(&m.mnt);
    let r = next.cmd("open f wa");
    assert!(
        r.starts_with("ok") && reply_ms(&r) < 1000,
        "open after the writer was killed: {r}"
    );
    next.ok("write next");
    next.ok("close");
    let s = m.read_string("f");
    assert!(
        s == "acked\nnext\n" || s == "acked\nbuffered\nnext\n",
        "{s:?}"
    );
}

#[test]
fn lease_ioctls_need_a_write_descriptor() {
    let m = Mount::new();
    m.sh_ok("echo x > f");
    let mut r = Agent::spawn(&m.mnt);
    r.ok("open f r");
    for cmd in [CLIENT_RENEWAL, RENEW, "epoch"] {
        let a = r.cmd(cmd);
        assert_eq!(
            err_name(&a),
            Some("EBADF"),
            "`{cmd}` on a read-only descriptor: {a}"
        );
    }
    r.ok("close");
}

//! One writer across daemons when a claim goes behind its daemon's back
//! (docs/SEMANTICS.md "Several daemons", "Fencing across daemons"): two
//! daemons over one etcd and the same datanode directories.
//!
//! - A writer on daemon A appends numbered lines with an fsync each; its
//!   claim's etcd lease is revoked (as `etcdctl lease revoke` does); a
//!   writer on daemon B takes the file over and appends its own. No line
//!   either of them had acknowledged is lost or moved, the two never
//!   interleave, and A's writer gets `EIO` with no later fsync
//!   acknowledged.

mod common;

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::*;

fn logs(a: &Mount, b: &Mount) -> String {
    format!(
        "--- daemon A ---\n{}\n--- daemon B ---\n{}",
        a.log(),
        b.log()
    )
}

/// What writer 1 did: the lines it had fsynced, when each fsync was sent,
/// and its first refusal.
#[derive(Default)]
struct Writer1 {
    /// (line, when its fsync was sent) of every fsync that succeeded.
    acked: Vec<(String, Instant)>,
    failed: Option<(Instant, String)>,
}

/// Checks a file written by writer 1 (whose acknowledged text is
/// `acked1`), then taken over by writer 2 (lines `acked2`, every one
/// acknowledged): `acked1` first, then at most writer 1's unacknowledged
/// lines (the last one possibly cut: recovery keeps the longest prefix
/// every replica holds, whatever the line), then exactly writer 2's lines.
fn check_takeover(content: &str, acked1: &str, acked2: &[String]) -> Result<(), String> {
    if !content.starts_with(acked1) {
        return Err("writer 1's acknowledged lines are not the file's start".into());
    }
    let w2: String = acked2.iter().map(|l| format!("{l}\n")).collect();
    let Some(at) = content.find(&format!("{}\n", acked2[0])) else {
        return Err("writer 2's first line is missing".into());
    };
    let mut between: Vec<&str> = content[acked1.len()..at].split('\n').collect();
    let cut = between.pop().unwrap_or("");
    if let Some(l) = between
        .iter()
        .find(|l| !(l.starts_with("w1-") && l.len() == 8))
    {
        return Err(format!("not a line of writer 1's before writer 2's: {l:?}"));
    }
    if !"w1-00000".starts_with(&cut[..cut.len().min(3)]) || cut.len() > 8 {
        return Err(format!(
            "not a piece of writer 1's line before writer 2's: {cut:?}"
        ));
    }
    if content[at..] != w2 {
        let got: Vec<&str> = content[at..].lines().collect();
        let kept = got
            .iter()
            .zip(acked2)
            .take_while(|(g, w)| **g == w.as_str())
            .count();
        return Err(format!(
            "{} of writer 2's {} acknowledged lines are lost or moved ({} lines from its first; from the first difference: {:?})",
            acked2.len() - kept,
            acked2.len(),
            got.len(),
            &got[kept..got.len().min(kept + 8)]
        ));
    }
    Ok(())
}

/// Writer 1 on daemon A appends `rep` copies of a numbered line at a
/// time, with an fsync every `fsync_every` of them; its claim is revoked
/// behind A's back; writer 2 on daemon B takes the file over and appends
/// 150 lines with an fsync each. Checks every acknowledged line of both.
fn revoke_under(test: &str, rep: usize, fsync_every: usize) {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, test, &dns, &["soft_limit=3"]);
    let b = daemon(&etcd, test, &dns, &["soft_limit=3"]);
    let mut w1 = Agent::spawn(&a.mnt);
    w1.ok("open f wc");
    w1.ok("write w1-00000");
    w1.ok("fsync");
    let ino = std::fs::metadata(a.path("f")).expect("stat f").ino();

    // Writer 1 appends (and fsyncs) until refused.
    let state = Arc::new(Mutex::new(Writer1::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let t1 = {
        let (state, stop) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            for i in 1.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let line = format!("w1-{i:05}");
                let mut r = w1.cmd(&format!("rep {rep} {line}"));
                written.push(line);
                let sent = Instant::now();
                if r.starts_with("ok") && i % fsync_every == 0 {
                    r = w1.cmd("fsync");
                    if r.starts_with("ok") {
                        let mut s = state.lock().unwrap();
                        s.acked.extend(written.drain(..).map(|l| (l, sent)));
                    }
                }
                if !r.starts_with("ok") {
                    state.lock().unwrap().failed = Some((Instant::now(), r));
                    break;
                }
            }
            w1
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), || state
            .lock()
            .unwrap()
            .acked
            .len()
            >= 30),
        "writer 1 does not get going\n{}",
        a.log()
    );
    let lease = etcd.revoke_claim(test, ino);
    let revoked = Instant::now();

    // Writer 2 on B takes the file as soon as it can.
    let mut w2 = Agent::spawn(&b.mnt);
    let got = poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        w2.cmd("open f wan").starts_with("ok")
    });
    let opened = Instant::now();
    assert!(
        got,
        "writer 2 never got the file after lease {lease} was revoked\n{}",
        logs(&a, &b)
    );
    let mut acked2 = Vec::new();
    for i in 0..150 {
        let line = format!("w2-{i:05}");
        w2.ok(&format!("write {line}"));
        w2.ok("fsync");
        acked2.push(line);
    }
    w2.ok("close");
    stop.store(true, Ordering::Relaxed);
    let mut w1 = t1.join().expect("writer 1 thread");
    let _ = w1.cmd("close");
    let s = state.lock().unwrap();

    // Writer 1 was refused, and learnt it within a keep-alive period of
    // the revoke (TTL 3 s: one every second), not at its own deadline.
    let (failed_at, why) = s.failed.clone().unwrap_or_else(|| {
        panic!(
            "writer 1 was never refused after its claim was revoked\n{}",
            logs(&a, &b)
        )
    });
    assert_eq!(err_name(&why), Some("EIO"), "writer 1: {why}");
    let late: Vec<_> = s.acked.iter().filter(|(_, sent)| *sent > opened).collect();
    assert!(
        late.is_empty(),
        "writer 1 had {} lines acknowledged by fsyncs it sent after writer 2 got the file (the first: {:?})\n{}",
        late.len(),
        late.first().map(|l| &l.0),
        logs(&a, &b)
    );
    let learnt = failed_at.saturating_duration_since(revoked);
    assert!(
        learnt < Duration::from_millis(1800),
        "writer 1 refused {learnt:?} after the revoke\n{}",
        logs(&a, &b)
    );

    // Every acknowledged line is there, in order, as often as written;
    // writer 1's unacknowledged lines at most between the two; nothing
    // interleaved.
    let acked1: String = std::iter::once("w1-00000\n".to_string())
        .chain(s.acked.iter().map(|(l, _)| format!("{l}\n").repeat(rep)))
        .collect();
    for m in [&a, &b] {
        if let Err(e) = check_takeover(&m.read_string("f"), &acked1, &acked2) {
            panic!("{e}\n{}", logs(&a, &b));
        }
    }
    eprintln!(
        "writer 1: {} lines acknowledged, refused {learnt:?} after the revoke; writer 2 opened {:?} after it",
        acked1.lines().count(),
        opened.saturating_duration_since(revoked)
    );
}

/// Writer 1 fsyncs every line: its first fsync after the revoke is
/// refused (the commit compares the claim), before writer 2 is under way.
#[test]
fn a_revoked_claim_fences_its_writer_and_the_next_writer_loses_nothing() {
    revoke_under("revoke", 1, 1);
}

/// Writer 1 streams 36 KiB at a time and fsyncs every 100th: its packets
/// keep going to the replicas it has open while writer 2 recovers the
/// file and appends, until A learns the claim is gone. Writer 2's data
/// never shares a replica file with them.
#[test]
fn a_revoked_claims_streaming_writer_cannot_touch_the_next_writers_data() {
    revoke_under("revoke-stream", 4000, 100);
}

/// Daemon A is stopped (SIGSTOP: a paused VM, a stalled host) while its
/// writer streams into a file; the claim is revoked; writer 2 on daemon B
/// recovers the file and appends; then A resumes, its stream with packets
/// still to write into the replica files it has open. Nothing A does
/// after it resumes may reach writer 2's data, and A's writer is refused.
#[test]
fn a_resumed_daemons_stream_cannot_touch_the_next_writers_data() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "resume", &dns, &["soft_limit=3"]);
    let b = daemon(&etcd, "resume", &dns, &["soft_limit=3"]);
    let mut w1 = Agent::spawn(&a.mnt);
    w1.ok("open f wc");
    w1.ok("write w1-00000");
    w1.ok("fsync");
    let ino = std::fs::metadata(a.path("f")).expect("stat f").ino();
    // Writer 1 streams without fsync: A always has packets under way.
    let streaming = Arc::new(AtomicBool::new(true));
    let t1 = {
        let streaming = streaming.clone();
        std::thread::spawn(move || {
            let mut last = String::new();
            for i in 1.. {
                last = w1.cmd(&format!("rep 4000 w1-{i:05}"));
                if !last.starts_with("ok") || !streaming.load(Ordering::Relaxed) {
                    break;
                }
            }
            (w1, last)
        })
    };
    let_time_pass(Duration::from_millis(300));
    let pid = a.pid.expect("daemon A's pid");
    let frozen = Stopped::stop(pid);
    etcd.revoke_claim("resume", ino);

    let mut w2 = Agent::spawn(&b.mnt);
    let got = poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        w2.cmd("open f wan").starts_with("ok")
    });
    assert!(got, "writer 2 never got the file\n{}", b.log());
    let mut acked2 = Vec::new();
    for i in 0..150 {
        let line = format!("w2-{i:05}");
        w2.ok(&format!("write {line}"));
        w2.ok("fsync");
        acked2.push(line);
    }
    w2.ok("close");
    let expected = b.read_string("f");

    // A resumes: whatever its stream had under way goes nowhere writer 2's
    // bytes are.
    drop(frozen);
    streaming.store(false, Ordering::Relaxed);
    let (mut w1, last) = t1.join().expect("writer 1 thread");
    let r = if last.starts_with("ok") {
        w1.cmd("fsync")
    } else {
        last
    };
    assert_eq!(err_name(&r), Some("EIO"), "writer 1 after A resumed: {r}");
    let _ = w1.cmd("close");
    let_time_pass(Duration::from_millis(500));
    for m in [&a, &b] {
        let content = m.read_string("f");
        if let Err(e) = check_takeover(&content, "w1-00000\n", &acked2) {
            panic!("after A resumed: {e}\n{}", logs(&a, &b));
        }
        assert_eq!(
            content, expected,
            "the file changed after writer 2 closed it"
        );
    }
}

/// A client renewal over etcd renews the file's claim and succeeds only
/// once etcd confirmed it: with etcd stopped (every daemon cut off) it
/// fails with ETIMEDOUT within a keep-alive period, instead of
/// promising a soft limit no other daemon would respect; once etcd is
/// back it succeeds again; once the claim is revoked it fails with EIO
/// and the writer is fenced. `renew-valid` says for how long it holds.
#[test]
fn client_renewals_succeed_only_once_etcd_confirms_the_claim() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    // soft_limit=2.9: a TTL of 3 s (rounded up, never down to 2).
    let a = daemon(&etcd, "renew", &dns, &["soft_limit=2.9"]);
    let mut w = Agent::spawn(&a.mnt);
    w.ok("open f wc");
    let ino = std::fs::metadata(a.path("f")).expect("stat f").ino();
    w.ok("client-renewal");
    w.ok("renew");
    let valid: u64 = w.ok("renew-valid").parse().expect("milliseconds");
    assert!(
        (2700..=2900).contains(&valid),
        "a renewal is valid for {valid} ms (soft limit 2900 ms)"
    );

    let frozen = Stopped::stop(etcd.pid());
    let t0 = Instant::now();
    let r = w.cmd("renew");
    let took = t0.elapsed();
    drop(frozen);
    assert_eq!(
        err_name(&r),
        Some("ETIMEDOUT"),
        "a renewal with etcd stopped: {r}\n{}",
        a.log()
    );
    assert!(
        took <= Duration::from_millis(1500),
        "the renewal waited {took:?} for etcd (at most a keep-alive period, 1 s)"
    );
    assert!(
        poll_until(Duration::from_secs(3), Duration::from_millis(50), || w
            .cmd("renew")
            .starts_with("ok")),
        "no renewal once etcd was back\n{}",
        a.log()
    );
    w.ok("write still-mine");

    etcd.revoke_claim("renew", ino);
    let r = w.cmd("renew");
    assert_eq!(
        err_name(&r),
        Some("EIO"),
        "a renewal of a revoked claim: {r}\n{}",
        a.log()
    );
    let r = w.cmd("write after-revoke");
    assert_eq!(err_name(&r), Some("EIO"), "a write after the revoke: {r}");
    assert!(
        a.log().contains("etcd says the cluster claim is gone"),
        "{}",
        a.log()
    );
}

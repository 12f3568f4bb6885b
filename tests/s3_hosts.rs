//! Several hosts on one machine (issue 30 item 5): three daemons that share
//! nothing but etcd and an S3 bucket (three Garage nodes, replication 3;
//! mount-scripts/garage.sh). Each "host" is
//!
//! - its own data directory (its lock, log, control socket, metadata
//!   cache) and no datanode directory at all: its only datanode is the
//!   bucket, `s3://BUCKET/PREFIX`, the same on every host, at
//!   `--replication 1` (the store keeps three copies itself). A local
//!   directory beside the bucket without `-o local_copy` would count
//!   toward R while the other hosts cannot read it; with it, it is a
//!   host-local copy, which `tests/s3_local_copy.rs` covers. Here nothing
//!   but the bucket holds data, so every promise rests on it alone;
//! - its own way to the services: a `testkit proxy` to etcd and one to a
//!   Garage node of its own (host i talks to node i), which the tests cut
//!   to take one host's network away and heal to give it back.
//!
//! Network namespaces (`unshare --net` with veth pairs) would isolate the
//! hosts further, but would need routes and addresses set up per test for
//! what the proxies already give: every byte between a daemon and a
//! service passes through a proxy of that host only. The daemons still see
//! one hostname, one clock and one kernel (one FUSE, one page cache per
//! mount).
//!
//! What is checked, each promise by an assertion that fails when it breaks
//! (docs/SEMANTICS.md "Object-store datanodes" and "Several daemons"):
//! contention across hosts (EBUSY, or a queued open with `lease_wait`,
//! granted when the holder closes), a reader following a writer on another
//! host (every byte acknowledged by fsync, close or a finished block seen
//! there, never a byte not written), kill -9 of a writer's daemon and the
//! file recovered from another host (`recover-lease`, or the soft limit),
//! three spouts on three hosts consuming one directory, an election across
//! hosts with its leader's daemon killed, `datanode list`, `stats` and
//! `fsck` on every host, and a host losing the store or etcd for a while.
//!
//! Each test starts its own Garage cluster (about 2 s) and etcd, and the
//! tests run one at a time ([`SLOT`]): three daemons, three store nodes
//! and etcd on a 2-core machine leave no room for a second test's timing.
//! The file takes about two minutes. Skipped, with a message, where Garage
//! is not installed.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::elect::{Candidate, check_terms, events, history, is_end, journal};
use common::etcd::EtcdServer;
use common::garage::Garage;
use common::proxy::Proxy;
use common::spout::*;
use common::*;
use serde_json::Value;

/// One test at a time (see the module's doc).
static SLOT: Mutex<()> = Mutex::new(());

/// The hosts' mount options: a soft limit (and so a claim TTL) of 3 s, and
/// blocks of 1 MiB, so that a few MiB cross block boundaries.
const HOST_O: &str = "soft_limit=3,monitor_interval=0.2,block_size=1M";

/// The claims' TTL over etcd with `soft_limit=3`.
const TTL: Duration = Duration::from_secs(3);

/// One host: its daemon and its two proxies.
struct Host {
    /// First field: unmounted before the proxies go.
    m: Mount,
    etcd: Proxy,
    s3: Proxy,
}

/// Three hosts over one etcd and one bucket prefix. Fields drop in order:
/// the mounts, then etcd, then Garage, then the slot.
struct Hosts {
    hosts: Vec<Host>,
    _etcd: EtcdServer,
    _garage: Garage,
    /// `s3://BUCKET/PREFIX`, every host's only datanode.
    url: String,
    _slot: MutexGuard<'static, ()>,
}

impl Hosts {
    /// Starts Garage, etcd and three hosts; `extra[i]` are more mount
    /// options of host i. `None` (after saying so) without Garage.
    fn start(name: &str, extra: [&[&str]; 3]) -> Option<Hosts> {
        if !Garage::installed() {
            eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
            return None;
        }
        let slot = SLOT.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        let garage = Garage::start();
        let etcd = EtcdServer::start();
        let prefix = format!("{name}-{}", std::process::id());
        let url = format!("s3://{}/{prefix}", garage.bucket);
        let hosts = (0..3)
            .map(|i| {
                let etcd_proxy = Proxy::start(&etcd.endpoint());
                let node = garage.endpoints[i]
                    .strip_prefix("http://")
                    .expect("garage.sh gives http:// endpoints");
                let s3_proxy = Proxy::start(node);
                let mut o = vec![
                    format!(
                        "s3_endpoint=http://{},s3_region={},s3_credentials={}",
                        s3_proxy.endpoint(),
                        garage.region,
                        garage.dir().join("env").display()
                    ),
                    HOST_O.to_string(),
                ];
                o.extend(extra[i].iter().map(|s| s.to_string()));
                let m = Mount::with_datanode_paths(
                    Opts {
                        replication: Some(1),
                        o,
                        args: vec![
                            "--meta".into(),
                            format!("etcd://{}", etcd_proxy.endpoint()),
                            "--prefix".into(),
                            prefix.clone(),
                        ],
                        ..Opts::default()
                    },
                    vec![PathBuf::from(&url)],
                );
                Host {
                    m,
                    etcd: etcd_proxy,
                    s3: s3_proxy,
                }
            })
            .collect();
        eprintln!(
            "{name}: Garage up in {:.1} s, three hosts mounted {:.1} s after the start",
            garage.startup.as_secs_f64(),
            t0.elapsed().as_secs_f64()
        );
        Some(Hosts {
            hosts,
            _etcd: etcd,
            _garage: garage,
            url,
            _slot: slot,
        })
    }

    fn m(&self, i: usize) -> &Mount {
        &self.hosts[i].m
    }

    /// The last lines of every daemon's log, for a failure's message.
    fn logs(&self) -> String {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| format!("--- host {i} ---\n{}", tail(&h.m.log(), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Hosts {
    /// Gives every host its network back before the mounts are unmounted
    /// (an unmount flushes through etcd and the store), whatever failed.
    fn drop(&mut self) {
        for h in &mut self.hosts {
            for p in [&mut h.etcd, &mut h.s3] {
                let _ = p.try_send("heal");
                let _ = p.try_send("resume");
            }
        }
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn errno(reply: &str) -> &str {
    err_name(reply).unwrap_or("ok")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

// ---- 1. contention --------------------------------------------------------

/// A writer on host A holds `f`: a writer on B is refused (`EBUSY`), one
/// on C (mounted with `lease_wait`) waits in etcd's queue and is granted
/// the file as soon as A closes; while C writes, A and B are refused; after
/// C's close B is granted at once. Every host reads the three writers'
/// lines in grant order, and the epochs grow with each grant.
#[test]
fn a_file_held_on_one_host_is_refused_or_queued_on_the_others() {
    let Some(h) = Hosts::start("contend", [&[], &[], &["lease_wait=20"]]) else {
        return;
    };
    let (a, b, c) = (h.m(0), h.m(1), h.m(2));
    let mut wa = Agent::spawn(&a.mnt);
    let mut wb = Agent::spawn(&b.mnt);
    let mut wc = Agent::spawn(&c.mnt);
    wa.ok("open f wc");
    let ea: u64 = wa.ok("epoch").parse().expect("an epoch");
    wa.ok("write from-a");
    wa.ok("fsync");
    wait_for(Duration::from_secs(5), "B to see f", || {
        b.path("f").exists()
    });
    let r = wb.cmd("open f wa");
    assert_eq!(errno(&r), "EBUSY", "a second writer on host B: {r}");
    let l = b.lease("f");
    assert_eq!(l["state"], "held", "{l}");
    assert_eq!(l["holder"], format!("{}:{}", hostname(), wa.pid), "{l}");
    assert!(l["daemon"].as_str().is_some_and(|d| !d.is_empty()), "{l}");

    // C queues: its open does not return while A holds the file.
    wc.send("open f wa");
    assert_eq!(
        wc.reply(Duration::from_millis(1500)),
        None,
        "C's open (lease_wait) returned while A held the file"
    );
    let closed = Instant::now();
    wa.ok("close");
    let r = wc
        .reply(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("C's queued open never returned\n{}", h.logs()));
    assert!(r.starts_with("ok"), "C's queued open: {r}\n{}", h.logs());
    let handover = closed.elapsed();
    let ec: u64 = wc.ok("epoch").parse().expect("an epoch");
    wc.ok("write from-c");
    for (who, w) in [("A", &mut wa), ("B", &mut wb)] {
        let r = w.cmd("open f wan");
        assert_eq!(errno(&r), "EBUSY", "{who} while C writes: {r}");
    }
    wc.ok("fsync");
    wc.ok("close");
    // C's close ended its claim before it returned: B is granted at once.
    let r = wb.cmd("open f wan");
    assert!(r.starts_with("ok"), "B right after C's close: {r}");
    let eb: u64 = wb.ok("epoch").parse().expect("an epoch");
    wb.ok("write from-b");
    wb.ok("close");
    assert!(ea < ec && ec < eb, "epochs A {ea}, C {ec}, B {eb}");
    for (i, m) in [a, b, c].into_iter().enumerate() {
        let mut got = String::new();
        let same = wait_until(Duration::from_secs(3), || {
            got = m.read_string("f");
            got == "from-a\nfrom-c\nfrom-b\n"
        });
        assert!(same, "host {i} reads {got:?}");
    }
    eprintln!("C's queued open granted {handover:?} after A's close; epochs {ea} < {ec} < {eb}");
}

// ---- 2. a reader following a writer ----------------------------------------

/// What the writer of [`a_reader_on_another_host_sees_every_acknowledged_byte`]
/// writes, line by line.
fn follow_lines() -> Vec<String> {
    (0..20)
        .map(|i| format!("fsynced {i:03} {}", "x".repeat(i * 131)))
        .collect()
}

/// A reader on host `m` following `rel` with one descriptor (as `tail -f`
/// does): every byte it reads must be the byte `want` has at that offset.
/// Returns how many bytes it read before `want` was complete or `max`
/// passed, or the first difference.
fn follow(
    m: &Mount,
    rel: &str,
    want: Vec<u8>,
    max: Duration,
) -> std::thread::JoinHandle<Result<usize, String>> {
    use std::io::Read;
    let path = m.path(rel);
    std::thread::spawn(move || {
        let mut f = std::fs::File::open(&path).map_err(|e| format!("open: {e}"))?;
        let mut at = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        let deadline = Instant::now() + max;
        while at < want.len() && Instant::now() < deadline {
            let n = f.read(&mut buf).map_err(|e| format!("read at {at}: {e}"))?;
            if n == 0 {
                // At the visible end: poll, as tail -f does.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if at + n > want.len() || buf[..n] != want[at..at + n] {
                let bad = (0..n)
                    .find(|k| want.get(at + k) != Some(&buf[*k]))
                    .unwrap_or(0);
                return Err(format!(
                    "byte {} read as {:#04x}, written as {:?}",
                    at + bad,
                    buf[bad],
                    want.get(at + bad)
                ));
            }
            at += n;
        }
        Ok(at)
    })
}

/// A writer on host A; readers on B (one descriptor following the file)
/// and C. Each fsynced line is seen on B within the bound SEMANTICS gives
/// across daemons (the length is published at the fsync, the attribute
/// cache lasts 1 s); a finished block publishes its length without any
/// fsync; the close publishes the rest. The follower on B never reads a
/// byte that differs from what A wrote at that offset (no zeros, no
/// unacknowledged bytes) and reads every byte in the end.
#[test]
fn a_reader_on_another_host_sees_every_acknowledged_byte() {
    let Some(h) = Hosts::start("follow", [&[], &[], &[]]) else {
        return;
    };
    let (a, b, c) = (h.m(0), h.m(1), h.m(2));
    let lines = follow_lines();
    // 1.5 MiB of lines without an fsync: the first 1 MiB block is
    // finished on the way.
    let bulk_line = "bulk-".repeat(20);
    let bulk_n = (3 << 19) / (bulk_line.len() + 1);
    let mut want = String::new();
    for l in &lines {
        want.push_str(l);
        want.push('\n');
    }
    let fsynced_end = want.len();
    for _ in 0..bulk_n {
        want.push_str(&bulk_line);
        want.push('\n');
    }
    want.push_str("closed\n");
    let mut w = Agent::spawn(&a.mnt);
    w.ok("open log wc");
    wait_for(Duration::from_secs(5), "B to see log", || {
        b.path("log").exists()
    });
    let reader = follow(b, "log", want.clone().into_bytes(), Duration::from_secs(90));

    let mut acked = 0;
    let mut slowest = Duration::ZERO;
    for l in &lines {
        w.ok(&format!("write {l}"));
        w.ok("fsync");
        acked += l.len() + 1;
        let t0 = Instant::now();
        let mut seen = 0;
        let ok = wait_until(Duration::from_secs(3), || {
            seen = std::fs::metadata(b.path("log")).map_or(0, |m| m.len() as usize);
            seen >= acked
        });
        assert!(
            ok,
            "B shows {seen} bytes 3 s after an fsync of {acked} on A\n{}",
            h.logs()
        );
        slowest = slowest.max(t0.elapsed());
        let got = b.read("log");
        assert!(
            got.len() >= acked && want.as_bytes().starts_with(&got),
            "B reads {} bytes that are not a prefix of what A wrote",
            got.len()
        );
    }
    assert_eq!(acked, fsynced_end);

    // No fsync: the first block (1 MiB) is finished while A writes on.
    w.ok(&format!("rep {bulk_n} {bulk_line}"));
    let mut seen = 0;
    let published = wait_until(Duration::from_secs(10), || {
        seen = std::fs::metadata(c.path("log")).map_or(0, |m| m.len() as usize);
        seen >= 1 << 20
    });
    assert!(
        published,
        "C shows {seen} bytes: the finished first block's length was not published\n{}",
        h.logs()
    );
    w.ok("write closed");
    w.ok("close");
    for (i, m) in [(1, b), (2, c)] {
        let mut got = Vec::new();
        let all = wait_until(Duration::from_secs(3), || {
            got = m.read("log");
            got.len() == want.len()
        });
        assert!(
            all,
            "host {i} reads {} of {} bytes after the close",
            got.len(),
            want.len()
        );
        assert!(got == want.as_bytes(), "host {i} reads other bytes");
    }
    let followed = reader
        .join()
        .expect("the follower")
        .unwrap_or_else(|e| panic!("the follower on B: {e}"));
    assert_eq!(followed, want.len(), "the follower on B stopped short");

    // Several blocks at once, written with dd on A, read with sha256sum on
    // B and C.
    a.sh_ok("dd if=/dev/urandom of=big bs=64k count=48 conv=fsync status=none && sha256sum big > big.sum");
    let sum = a.read_string("big.sum");
    for m in [b, c] {
        let out = m.sh_ok("sha256sum big");
        assert_eq!(
            out.split_whitespace().next(),
            sum.split_whitespace().next(),
            "big reads differently on another host"
        );
    }
    eprintln!(
        "fsynced lines seen on B at most {slowest:?} after the fsync; the follower read {followed} bytes"
    );
}

// ---- 3. kill -9 of a writer's daemon --------------------------------------

/// Host A's daemon is killed (-9) while two writers hold files there, each
/// with lines fsynced and more written but not. From host B, `f1` is
/// recovered at once by `leasefs recover-lease` and `f2` once A's claim ran
/// out (the soft limit): each is closed with every fsynced line, followed
/// only by whole lines A wrote, and B appends to both. A, mounted again on
/// its data directory, reads what B reads.
#[test]
fn a_killed_hosts_files_are_recovered_from_another_host() {
    let Some(mut h) = Hosts::start("kill", [&[], &[], &[]]) else {
        return;
    };
    let mut ws: Vec<Agent> = (0..2).map(|_| Agent::spawn(&h.m(0).mnt)).collect();
    let mut acked = Vec::new();
    for (k, w) in ws.iter_mut().enumerate() {
        let n = k + 1;
        w.ok(&format!("open f{n} wc"));
        w.ok(&format!("rep 2000 fsynced-{n}"));
        w.ok("fsync");
        acked.push(format!("fsynced-{n}\n").repeat(2000));
        // Left in A's packet buffer: lost with the daemon, or not.
        w.ok(&format!("rep 10 maybe-{n}"));
    }
    h.hosts[0].m.crash();
    let killed = Instant::now();
    drop(ws);
    let b = h.m(1);
    let mut wb = Agent::spawn(&b.mnt);
    let r = wb.cmd("open f2 wan");
    assert_eq!(
        errno(&r),
        "EBUSY",
        "the killed daemon's claim counts until it runs out: {r}"
    );

    // f1 by hand, at once.
    let out = b.leasefs(&["recover-lease", path_str(&b.path("f1"))]);
    assert!(
        out.status.success(),
        "recover-lease of f1 through B: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        h.logs()
    );
    let by_hand = killed.elapsed();
    let check = |rel: &str, acked: &str, n: usize, end: &str| {
        for (i, m) in [(1, h.m(1)), (2, h.m(2))] {
            let content = m.read_string(rel);
            assert!(
                content.starts_with(acked) && content.ends_with(end),
                "{rel} on host {i}: {} bytes, the {} fsynced first? {}; ends with {end:?}? {}",
                content.len(),
                acked.len(),
                content.starts_with(acked),
                content.ends_with(end)
            );
            let mid = &content[acked.len()..content.len() - end.len()];
            assert!(
                mid.is_empty()
                    || (mid.lines().all(|l| l == format!("maybe-{n}")) && mid.ends_with('\n')),
                "{rel} on host {i}: bytes A never acknowledged whole: {mid:?}"
            );
        }
    };
    check("f1", &acked[0], 1, "");
    let recovered = b.read_string("f1").len();
    assert_eq!(
        b.lease_state("f1"),
        "free",
        "f1 is not closed after recover-lease: {}",
        b.lease("f1")
    );
    wb.ok("open f1 wan");
    wb.ok("write appended-by-b");
    wb.ok("close");
    check("f1", &acked[0], 1, "appended-by-b\n");
    assert_eq!(
        b.read_string("f1").len(),
        recovered + "appended-by-b\n".len()
    );

    // f2 once A's claim ran out.
    let mut got = false;
    wait_until(Duration::from_secs(20), || {
        got = wb.cmd("open f2 wan").starts_with("ok");
        got
    });
    assert!(got, "B never got f2 after A's daemon died\n{}", h.logs());
    let waited = killed.elapsed();
    assert!(
        waited >= TTL * 2 / 3,
        "f2 taken {waited:?} after A died, before its claim could run out"
    );
    wb.ok("write appended-by-b");
    wb.ok("close");
    check("f2", &acked[1], 2, "appended-by-b\n");
    assert!(
        b.log()
            .contains("recovering a file another daemon left open"),
        "{}",
        tail(&b.log(), 40)
    );

    // A again, on its own data directory: the same bytes.
    h.hosts[0].m.mount();
    for rel in ["f1", "f2"] {
        let on_b = h.m(1).read_string(rel);
        let mut on_a = String::new();
        let same = wait_until(Duration::from_secs(3), || {
            on_a = h.m(0).read_string(rel);
            on_a == on_b
        });
        assert!(
            same,
            "{rel}: A reads {} bytes, B {}",
            on_a.len(),
            on_b.len()
        );
    }
    let (code, report) = h.m(1).fsck_json();
    assert_eq!(code, 0, "fsck after the recoveries: {report}");
    eprintln!("f1 recovered by hand {by_hand:?} after kill -9; f2 taken by B {waited:?} after");
}

// ---- 4. spouts on three hosts ---------------------------------------------

/// `leasefs spout` on each host over one directory: an instance on C is
/// killed (-9) in the middle of the big file, then instances on A, B and C
/// consume everything. Every line is emitted at least once and nothing
/// else; every file ends in done/ whole; no lock file or DIRLOCK is left,
/// as every host sees it.
#[test]
fn spouts_on_three_hosts_consume_one_directory() {
    let Some(h) = Hosts::start("spout", [&[], &[], &[]]) else {
        return;
    };
    let (a, b, c) = (h.m(0), h.m(1), h.m(2));
    setup(a);
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // The oldest file, the first any instance takes.
    files.insert("big".into(), lines_of("big", 20_000));
    publish(a, "big", &files["big"]);
    for i in 0..12 {
        let name = format!("f{i:02}");
        files.insert(name.clone(), lines_of(&name, 200 + 37 * i));
        // Published from A and B in turn.
        publish(if i % 2 == 0 { a } else { b }, &name, &files[&name]);
    }
    for (i, m) in [a, b, c].into_iter().enumerate() {
        assert!(
            wait_until(Duration::from_secs(5), || names_in(m, "in").len()
                == files.len()),
            "host {i} sees {:?} in in/",
            names_in(m, "in")
        );
    }
    let args = [
        "--lock-timeout",
        "3",
        "--commit-count",
        "100",
        "--commit-sec",
        "1",
        "--once",
    ];
    // A slow consumer on C, killed in the middle of big.
    let mut killed = Inst::spawn_slow(c, "killed", &args, 16);
    let committed = wait_committed(c, "in/.lock/big", "killed");
    killed.signal(libc::SIGKILL);
    killed.wait(Duration::from_secs(10));
    let (_, killed_at) = last_entry(c, "in/.lock/big").expect("big's lock entry");
    assert!(killed_at >= committed, "killed at {killed_at}");

    let t0 = Instant::now();
    let mut insts: Vec<Inst> = [("a", a), ("b", b), ("c", c)]
        .into_iter()
        .map(|(id, m)| Inst::spawn(m, id, &args))
        .collect();
    for i in insts.iter_mut() {
        i.wait_ok(Duration::from_secs(120));
    }
    let took = t0.elapsed();
    for (i, m) in [a, b, c].into_iter().enumerate() {
        let mut want: Vec<String> = files.keys().cloned().collect();
        want.sort();
        assert_eq!(
            names_in(m, "done"),
            want,
            "host {i}: not every file is done"
        );
        assert_eq!(
            names_in(m, "in"),
            [".bad", ".lock"],
            "host {i}: left in in/"
        );
        assert!(
            names_in(m, "in/.lock").is_empty(),
            "host {i}: lock files or DIRLOCK left: {:?}",
            names_in(m, "in/.lock")
        );
        assert!(names_in(m, "in/.bad").is_empty(), "host {i}: bad files");
    }
    for (name, lines) in &files {
        let done = b.read_string(&format!("done/{name}"));
        assert_eq!(done.lines().count(), lines.len(), "done/{name} changed");
    }
    let mut all = vec![killed];
    all.extend(insts);
    let emitted: Vec<String> = all.iter().flat_map(|i| i.stdout_lines()).collect();
    let times = every_line_at_least_once(&emitted, &files);
    let resumed: Vec<(String, u64)> = all.iter().flat_map(|i| i.takeovers()).collect();
    assert!(
        resumed
            .iter()
            .any(|(f, off)| f == "big" && *off == killed_at),
        "big was not resumed at the killed instance's last entry {killed_at}: {resumed:?}"
    );
    let per_host: Vec<(String, usize)> = all[1..]
        .iter()
        .map(|i| (i.id.clone(), i.consumed().len() + i.takeovers().len()))
        .collect();
    assert!(
        per_host.iter().filter(|(_, n)| *n > 0).count() >= 2,
        "the files were not shared out among the hosts: {per_host:?}"
    );
    let dups: usize = times.values().map(|n| n - 1).sum();
    eprintln!(
        "{} lines emitted ({dups} again after the takeover of big at {killed_at}) in {took:?}; files per instance {per_host:?}",
        emitted.len()
    );
}

// ---- 5. an election across hosts ------------------------------------------

/// The leader's term, by the audit table: (epoch, id) of the last
/// `elected` whose end is not recorded.
fn open_term(h: &[Value]) -> Option<(u64, String)> {
    let i = h.iter().rposition(|e| e["event"] == "elected")?;
    let epoch = h[i]["epoch"].as_u64()?;
    if h[i..]
        .iter()
        .any(|e| is_end(e) && e["epoch"].as_u64() == Some(epoch))
    {
        return None;
    }
    Some((epoch, h[i]["who"].as_str()?.to_string()))
}

/// `start`/`tick`/`error` lines of `testkit term --events`: (kind, id,
/// epoch, pid, monotonic ns).
fn outside(path: &Path) -> Vec<(String, String, u64, u32, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.to_string(),
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
                f.get(4)?.parse().ok()?,
            ))
        })
        .collect()
}

/// Commands alive now, by their `start` lines: never more than one.
fn running(path: &Path) -> Vec<(String, u64)> {
    outside(path)
        .into_iter()
        .filter(|e| e.0 == "start" && alive(e.3))
        .map(|e| (e.1, e.2))
        .collect()
}

/// An elector on each host, its command `testkit term` appending to a
/// journal on the mount (fenced by epoch) and noting outside the mount
/// when it acts. The leader's daemon is killed (-9): a candidate on
/// another host leads with a larger epoch once the dead daemon's claim ran
/// out; then that leader's daemon too, and the third host leads. Never two
/// commands at once; terms in increasing epochs in the audit table, the
/// outside journal and the shared journal, each term's end recorded
/// before the next began.
#[test]
fn an_election_across_hosts_survives_its_leaders_daemons_killed() {
    let Some(mut h) = Hosts::start("elect", [&[], &[], &[]]) else {
        return;
    };
    std::fs::create_dir(h.m(0).path("own")).expect("mkdir own");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = out_dir.path().join("outside");
    let ids = ["a", "b", "c"];
    let mut cands: Vec<Candidate> = (0..3)
        .map(|i| {
            let m = h.m(i);
            let cmd = [
                testkit().display().to_string(),
                "term".into(),
                m.path("journal").display().to_string(),
                "--events".into(),
                out.display().to_string(),
                "--own".into(),
                m.path("own").display().to_string(),
            ];
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            Candidate::spawn(m, "el", ids[i], &[], &cmd)
        })
        .collect();
    let one_at_a_time = |what: &str| {
        let r = running(&out);
        assert!(r.len() <= 1, "{what}: commands running at once: {r:?}");
    };
    let ticks = |epoch: u64| {
        outside(&out)
            .iter()
            .filter(|e| e.0 == "tick" && e.2 == epoch)
            .count()
    };
    let mut alive_hosts: Vec<usize> = vec![0, 1, 2];
    let mut terms: Vec<(u64, String)> = Vec::new();
    let mut handovers = Vec::new();
    for round in 0..3 {
        let after = terms.last().map_or(0, |t| t.0);
        let watch = alive_hosts[0];
        let t0 = Instant::now();
        let mut term = None;
        wait_until(Duration::from_secs(20), || {
            one_at_a_time(&format!("round {round}"));
            term = open_term(&history(h.m(watch), "el")).filter(|t| t.0 > after);
            term.is_some()
        });
        let (epoch, id) = term.unwrap_or_else(|| {
            panic!(
                "round {round}: no leader after epoch {after}\n{}\n{}",
                cands
                    .iter()
                    .map(|c| format!("--- {} ---\n{}", c.id, tail(&c.log(), 20)))
                    .collect::<Vec<_>>()
                    .join("\n"),
                h.logs()
            )
        });
        if round > 0 {
            handovers.push(t0.elapsed());
        }
        let i = ids.iter().position(|x| *x == id).expect("a known id");
        assert!(
            alive_hosts.contains(&i),
            "round {round}: {id} leads, but its host's daemon is dead"
        );
        // The term acts: a few lines in the journal on the mount.
        assert!(
            wait_until(Duration::from_secs(15), || {
                one_at_a_time(&format!("term {epoch}"));
                ticks(epoch) >= 3
            }),
            "term {epoch} ({id}) got no line into the journal\n{}",
            h.logs()
        );
        terms.push((epoch, id.clone()));
        if round == 2 {
            break;
        }
        // kill -9 of the leader's daemon.
        h.hosts[i].m.crash();
        alive_hosts.retain(|x| *x != i);
    }
    let last = alive_hosts[0];
    for c in cands.iter().filter(|c| c.id == ids[last]) {
        c.signal(libc::SIGTERM);
    }
    for c in cands.iter_mut().filter(|c| c.id == ids[last]) {
        assert!(
            c.wait(Duration::from_secs(10)).is_some_and(|s| s.success()),
            "the last leader on SIGTERM\n{}",
            c.log()
        );
    }
    let epochs: Vec<u64> = terms.iter().map(|t| t.0).collect();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs {epochs:?}");
    let leaders: Vec<&str> = terms.iter().map(|t| t.1.as_str()).collect();
    assert!(
        leaders[0] != leaders[1] && leaders[1] != leaders[2] && leaders[0] != leaders[2],
        "leaders {leaders:?}"
    );
    let m = h.m(last);
    let hist = history(m, "el");
    check_terms(&hist, &journal(m));
    assert_eq!(
        events(&hist, "elected")
            .iter()
            .filter_map(|e| e["epoch"].as_u64())
            .collect::<Vec<_>>(),
        epochs,
        "{hist:#?}"
    );
    // The outside journal: each term started once, in epoch order, and no
    // term acted after the next one started.
    let evs = outside(&out);
    let starts: Vec<&(String, String, u64, u32, u64)> =
        evs.iter().filter(|e| e.0 == "start").collect();
    assert_eq!(
        starts.iter().map(|e| e.2).collect::<Vec<_>>(),
        epochs,
        "{evs:?}"
    );
    for w in starts.windows(2) {
        let late = evs
            .iter()
            .find(|e| e.0 == "tick" && e.2 == w[0].2 && e.4 > w[1].4);
        assert!(
            late.is_none(),
            "term {} acted after term {} began: {late:?}",
            w[0].2,
            w[1].2
        );
    }
    drop(cands);
    eprintln!("terms {terms:?}; handovers after kill -9 of the leader's daemon took {handovers:?}");
}

// ---- 6. what the operator sees --------------------------------------------

/// `datanode list`, `stats --once` and `fsck`, as text and JSON, on each
/// host: the one object-store datanode, live, with one storage ID on all.
#[test]
fn every_host_shows_the_object_store_datanode() {
    let Some(h) = Hosts::start("cli", [&[], &[], &[]]) else {
        return;
    };
    h.m(0)
        .sh_ok("echo hello > f && sync f && echo again > g && sync g");
    let mut ids = Vec::new();
    for (i, host) in h.hosts.iter().enumerate() {
        let m = &host.m;
        let mnt = path_str(&m.mnt);
        let run = |args: &[&str]| {
            let o = m.leasefs(args);
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            assert!(
                o.status.success(),
                "host {i}: leasefs {args:?}: {text}{}",
                String::from_utf8_lossy(&o.stderr)
            );
            text
        };
        let list = run(&["datanode", "list", mnt]);
        assert!(
            list.contains(&h.url) && list.contains("live"),
            "host {i}: datanode list:\n{list}"
        );
        let list: Value =
            serde_json::from_str(&run(&["datanode", "list", mnt, "--json"])).expect("JSON");
        let dns = list.as_array().expect("an array of datanodes");
        assert_eq!(dns.len(), 1, "host {i}: {list}");
        assert_eq!(dns[0]["path"], h.url.as_str(), "host {i}: {list}");
        ids.push(dns[0]["storage_id"].clone());

        let stats = run(&["stats", mnt, "--once"]);
        assert!(
            stats.contains(&h.url) && stats.contains("live"),
            "host {i}: stats --once:\n{stats}"
        );
        let stats = run(&["stats", mnt, "--once", "--json"]);
        assert!(
            stats.contains(&h.url),
            "host {i}: stats --once --json:\n{stats}"
        );

        let f = m.fsck(&[]);
        assert_eq!(f.code, 0, "host {i}: fsck: {f:?}");
        assert!(
            f.stdout.contains("HEALTHY") && f.stdout.contains("Datanodes alive: 1/1"),
            "host {i}: fsck:\n{}",
            f.stdout
        );
        let (code, r) = m.fsck_json();
        assert_eq!(code, 0, "host {i}: {r}");
        assert_eq!(r["datanodes_alive"], 1, "host {i}: {r}");
        assert_eq!(
            r["datanode_states"][0]["path"],
            h.url.as_str(),
            "host {i}: {r}"
        );
        assert!(r["files"].as_u64() >= Some(2), "host {i}: {r}");
    }
    assert!(
        ids.iter()
            .all(|x| x == &ids[0] && x.as_str().is_some_and(|s| s.starts_with("DS-"))),
        "storage IDs {ids:?}"
    );
}

// ---- 7. a host losing the store or etcd -----------------------------------

/// Cuts host `i`'s connection to the store for 4 s while its writer has
/// lines in flight and fsyncs them; meanwhile host `other` reads the
/// writer's fsynced lines and writes a file of its own (the outage is the
/// host's, not the store's). Returns the fsync's answer, how long the cut
/// lasted and how long the fsync took. The file `rel` then holds `before`
/// (fsynced before the cut) and maybe `during`.
fn fsync_across_a_store_cut(
    h: &mut Hosts,
    i: usize,
    other: usize,
    rel: &str,
) -> (Agent, String, Duration, Duration) {
    let mut w = Agent::spawn(&h.m(i).mnt);
    w.ok(&format!("open {rel} wc"));
    w.ok("rep 200 before-the-cut");
    w.ok("fsync");
    let before = "before-the-cut\n".repeat(200);
    h.hosts[i].s3.send("cut");
    let cut = Instant::now();
    w.ok("rep 300 during-the-cut");
    w.send("fsync");
    // The cut is a length of time: 4 s, while the fsync is under way.
    let early = w.reply(Duration::from_secs(3));
    let mut answered = cut.elapsed();
    let o = h.m(other);
    assert!(
        o.read_string(rel).starts_with(&before),
        "host {other} cannot read host {i}'s fsynced lines while {i} is cut off from the store"
    );
    o.sh_ok(&format!(
        "echo from-{other} > {rel}.other && sync {rel}.other"
    ));
    let_time_pass(Duration::from_secs(4).saturating_sub(cut.elapsed()));
    let held = cut.elapsed();
    h.hosts[i].s3.send("heal");
    let r = early
        .or_else(|| {
            let r = w.reply(Duration::from_secs(60));
            answered = cut.elapsed();
            r
        })
        .unwrap_or_else(|| {
            panic!(
                "the fsync never returned after the store came back\n{}",
                h.logs()
            )
        });
    (w, r, held, answered)
}

/// After a store cut: host `i`'s datanode is live again (a failed PUT
/// marks it dead until its next heartbeat, every 3 s), it writes and
/// fsyncs a new file that another host reads, and reads the file the other
/// host wrote meanwhile.
fn recovers_from_the_cut(h: &Hosts, i: usize, other: usize, rel: &str) {
    let m = h.m(i);
    let mnt = m.mnt.display().to_string();
    let mut list = String::new();
    let live = wait_until(Duration::from_secs(10), || {
        let o = m.leasefs(&["datanode", "list", &mnt]);
        list = String::from_utf8_lossy(&o.stdout).into_owned();
        list.contains("live")
    });
    assert!(live, "host {i}'s datanode after the cut:\n{list}");
    let mut w = Agent::spawn(&m.mnt);
    w.ok(&format!("open {rel}.after wc"));
    w.ok(&format!("write from-{i}"));
    w.ok("fsync");
    w.ok("close");
    assert_eq!(
        h.m(other).read_string(&format!("{rel}.after")),
        format!("from-{i}\n")
    );
    assert_eq!(
        m.read_string(&format!("{rel}.other")),
        format!("from-{other}\n")
    );
}

/// A host's connection to the store cut for 4 s while its writer fsyncs.
/// On host A (the default `s3_retry_timeout`, 30 s) the fsync waits for
/// the store and succeeds once the connection is back: the client retries
/// (before, it gave up after 10 retries, about 3 s, and the writer got
/// `EIO`). On host C, mounted with `s3_retry_timeout=2`, the same cut
/// outlasts the retries: the fsync fails with `EIO` and the daemon logs
/// the failed PUT. Either way nothing fsynced before is lost, other hosts
/// read and write meanwhile, and the host writes again after the cut.
#[test]
fn a_host_cut_off_from_the_store_waits_or_fails_then_recovers() {
    let Some(mut h) = Hosts::start("s3cut", [&[], &[], &["s3_retry_timeout=2"]]) else {
        return;
    };
    let before = "before-the-cut\n".repeat(200);
    let during = "during-the-cut\n".repeat(300);

    // A: waits, then succeeds.
    let (mut w, r, held, took) = fsync_across_a_store_cut(&mut h, 0, 1, "f");
    assert!(
        r.starts_with("ok"),
        "fsync on A across a {held:?} cut of the store (s3_retry_timeout 30 s): {r}\n{}",
        h.logs()
    );
    assert!(
        took >= held,
        "the fsync succeeded {took:?} after the cut began, before the store was back"
    );
    w.ok("write after-the-cut");
    let r = w.cmd("close");
    assert!(
        r.starts_with("ok"),
        "close on A just after the cut: {r}\n{}",
        h.logs()
    );
    let want = before.clone() + &during + "after-the-cut\n";
    for i in 0..3 {
        let mut got = String::new();
        let all = wait_until(Duration::from_secs(3), || {
            got = h.m(i).read_string("f");
            got == want
        });
        assert!(
            all,
            "host {i} reads {} bytes of f, not the {} written",
            got.len(),
            want.len()
        );
    }
    recovers_from_the_cut(&h, 0, 1, "f");

    // C: the retries end first: a clear error, nothing fsynced lost.
    let (mut w, r, held_c, took_c) = fsync_across_a_store_cut(&mut h, 2, 1, "g");
    assert_eq!(
        errno(&r),
        "EIO",
        "fsync on C across a {held_c:?} cut (s3_retry_timeout 2 s): {r}"
    );
    assert!(
        h.m(2).log().contains("replica write failed"),
        "C's log does not say why\n{}",
        h.logs()
    );
    let _ = w.cmd("close");
    drop(w);
    for i in 0..3 {
        let got = h.m(i).read_string("g");
        assert!(
            got.starts_with(&before)
                && (got.len() == before.len() || got == before.clone() + &during),
            "host {i} reads {} bytes of g: not the fsynced {} (and at most the lines in flight)",
            got.len(),
            before.len()
        );
    }
    recovers_from_the_cut(&h, 2, 1, "g");
    eprintln!(
        "store cut for {held:?}: A's fsync succeeded {took:?} after the cut began; \
         C (s3_retry_timeout=2) failed with EIO {took_c:?} after"
    );
}

/// Host A's connection to etcd is cut for longer than the claim's TTL
/// while its writer appends: A fences the writer (writes and fsync fail
/// with EIO) before etcd could let the claim expire; host B takes the file
/// while A is still cut off, with every line A fsynced; once the
/// connection is back A registers again and writes the file after B.
#[test]
fn a_host_cut_off_from_etcd_is_fenced_and_recovers() {
    let Some(mut h) = Hosts::start("etcdcut", [&[], &[], &[]]) else {
        return;
    };
    let mut w = Agent::spawn(&h.m(0).mnt);
    w.ok("open f wc");
    w.ok("rep 500 before-the-cut");
    w.ok("fsync");
    // A keep-alive round of the claim (every TTL/3) or two.
    let_time_pass(Duration::from_millis(1500));
    w.ok("write still-connected");
    w.ok("fsync");
    let acked = "before-the-cut\n".repeat(500) + "still-connected\n";
    let mut wb = Agent::spawn(&h.m(1).mnt);
    assert_eq!(errno(&wb.cmd("open f wan")), "EBUSY");

    h.hosts[0].etcd.send("cut");
    let cut = Instant::now();
    // A probe every 50 ms: when fencing came is measured.
    let mut fenced_at = None;
    let mut probes = 0;
    poll_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let r = w.cmd("write probe");
        if r.starts_with("ok") {
            probes += 1;
            false
        } else {
            assert_eq!(errno(&r), "EIO", "a write of A's writer while cut off: {r}");
            fenced_at = Some(cut.elapsed());
            true
        }
    });
    let fenced_at =
        fenced_at.unwrap_or_else(|| panic!("A's writer never fenced while cut off\n{}", h.logs()));
    assert!(
        fenced_at <= TTL,
        "A's writer fenced {fenced_at:?} after the cut: etcd may let the claim expire after {TTL:?}\n{}",
        h.logs()
    );
    assert_eq!(errno(&w.cmd("fsync")), "EIO", "fsync after fencing");
    // B takes the file while A is still cut off.
    let mut got = false;
    wait_until(Duration::from_secs(15), || {
        got = wb.cmd("open f wan").starts_with("ok");
        got
    });
    assert!(got, "B never got f while A was cut off\n{}", h.logs());
    let taken_at = cut.elapsed();
    assert!(
        taken_at > fenced_at,
        "B took f ({taken_at:?}) before A fenced its writer ({fenced_at:?})"
    );
    wb.ok("write from-b");
    wb.ok("close");
    let _ = w.cmd("close");
    // Past the TTL in all, then the connection comes back.
    let_time_pass((TTL + Duration::from_millis(500)).saturating_sub(cut.elapsed()));
    h.hosts[0].etcd.send("heal");
    let held = cut.elapsed();
    assert!(
        wait_until(Duration::from_secs(15), || h
            .m(0)
            .log()
            .contains("registered this daemon in etcd again")),
        "A did not register again after the cut\n{}",
        h.logs()
    );
    let mut w2 = Agent::spawn(&h.m(0).mnt);
    let mut again = false;
    wait_until(Duration::from_secs(15), || {
        again = w2.cmd("open f wan").starts_with("ok");
        again
    });
    assert!(again, "A never got f again after the cut\n{}", h.logs());
    w2.ok("write from-a-again");
    w2.ok("close");
    let tail_lines = "from-b\nfrom-a-again\n";
    for i in 0..3 {
        let mut content = String::new();
        let ok = wait_until(Duration::from_secs(3), || {
            content = h.m(i).read_string("f");
            content.ends_with(tail_lines)
        });
        assert!(
            ok,
            "host {i}: f ends {:?}",
            &content[content.len().saturating_sub(60)..]
        );
        assert!(
            content.starts_with(&acked),
            "host {i}: the fsynced lines are not intact"
        );
        let mid = &content[acked.len()..content.len() - tail_lines.len()];
        assert!(
            mid.lines().all(|l| l == "probe"),
            "host {i}: torn or foreign bytes between A's and B's lines: {mid:?}"
        );
    }
    eprintln!(
        "etcd cut for {held:?}: A's writer fenced after {fenced_at:?} ({probes} writes first), B took f after {taken_at:?}"
    );
}

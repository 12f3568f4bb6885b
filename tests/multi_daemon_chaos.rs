//! Pauses and partitions across daemons (issue 31, docs/SEMANTICS.md
//! "Timing: pauses, partitions and clock jumps"): three daemons over one etcd and the same
//! datanodes, an elector on each whose command acts only outside the mount
//! (`testkit tick`: monotonic timestamps in a file of the test), and
//! writers on each appending numbered lines with fsync to one file.
//!
//! - A leader whose daemon is stopped (SIGSTOP) past the soft limit: its
//!   elector cannot renew (the ioctl hangs), and stops its command on its
//!   own clock before another daemon can elect anyone.
//! - The same when its daemon is cut off from etcd by a proxy: the
//!   renewals keep succeeding locally, but the daemon vouches only for
//!   what etcd confirmed, and the command stops before that runs out.
//! - Rounds of faults (`LEASEFS_CHAOS_ROUNDS`, default 3 here; 200 by
//!   hand, `LEASEFS_CHAOS_SEED` to replay one): a daemon stopped across
//!   the TTL, the proxy between daemon 0 and etcd paused or cut, the
//!   claim of the writers' file revoked in etcd behind its daemon's back,
//!   daemon 2's CLOCK_REALTIME jumped by an hour (libfaketime), the
//!   leader's elector and its command stopped past the soft limit. After each
//!   round: every acknowledged line exactly where it was acknowledged, no
//!   line of the file mixing two writers' bytes, epochs along the file
//!   increasing and the file's epoch the same on every daemon, and never
//!   two leaders' commands acting at once.
//!
//! Revoking the election file's claim is left out of the rounds: like
//! `recover-lease`, it ends a term at once, and nothing outside the mount
//! can be stopped at once (SEMANTICS "Timing: pauses, partitions and clock jumps").
//!
//! Every test takes the machine for its timing (one at a time: [`SLOT`]).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::elect::{Candidate, history};
use common::etcd::{EtcdServer, daemon_at, shared_datanodes};
use common::proxy::Proxy;
use common::*;

static SLOT: Mutex<()> = Mutex::new(());

fn slot() -> std::sync::MutexGuard<'static, ()> {
    SLOT.lock().unwrap_or_else(|e| e.into_inner())
}

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

// ---- the commands' outside journal -----------------------------------------

/// One line of `testkit tick`'s file.
#[derive(Debug, Clone)]
struct Tick {
    id: String,
    epoch: u64,
    pid: u32,
    ns: u64,
}

fn ticks(path: &Path) -> Vec<Tick> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some(Tick {
                id: f.get(1)?.to_string(),
                epoch: f.get(2)?.parse().ok()?,
                pid: f.get(3)?.parse().ok()?,
                ns: f.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

/// Each term's first and last tick, by epoch.
fn spans(ts: &[Tick]) -> BTreeMap<u64, (String, u64, u64)> {
    let mut m: BTreeMap<u64, (String, u64, u64)> = BTreeMap::new();
    for t in ts {
        let e = m.entry(t.epoch).or_insert((t.id.clone(), t.ns, t.ns));
        e.1 = e.1.min(t.ns);
        e.2 = e.2.max(t.ns);
    }
    m
}

/// Never two commands acting at once: in epoch order, each term's last
/// tick comes before the next term's first. The smallest gap, if any.
fn one_leader_at_a_time(ts: &[Tick]) -> Result<Option<Duration>, String> {
    let s: Vec<(u64, (String, u64, u64))> = spans(ts).into_iter().collect();
    let mut gap: Option<Duration> = None;
    for w in s.windows(2) {
        let ((e1, (id1, _, last1)), (e2, (id2, first2, _))) = (&w[0], &w[1]);
        if last1 >= first2 {
            return Err(format!(
                "two leaders acting at once: term {e1} ({id1}) ticked {} ms after term {e2} ({id2}) began",
                (last1 - first2) / 1_000_000
            ));
        }
        let g = Duration::from_nanos(first2 - last1);
        gap = Some(gap.map_or(g, |x| x.min(g)));
    }
    Ok(gap)
}

/// The term acting now, by its ticks: (epoch, id) of the newest term that
/// ticked in the last 200 ms.
fn acting(ts: &[Tick]) -> Option<(u64, String)> {
    let now = monotonic_ns();
    ts.iter()
        .rev()
        .find(|t| now.saturating_sub(t.ns) < 200_000_000)
        .map(|t| (t.epoch, t.id.clone()))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A daemon the test stopped: continued on drop, in every path.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        kill(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

// ---- the cluster ---------------------------------------------------------------

/// Three daemons; daemon 0 reaches etcd through the proxy, daemon 2 runs
/// under libfaketime with its CLOCK_REALTIME offset read from a file.
struct Cluster {
    etcd: EtcdServer,
    proxy: Proxy,
    ms: Vec<Mount>,
    /// libfaketime's offset for daemon 2 (`+0`, `+1h`, `-1h`).
    faketime: PathBuf,
    _dn: tempfile::TempDir,
    out: tempfile::TempDir,
    prefix: String,
}

impl Cluster {
    fn start(n: usize, soft_limit: &str, prefix: &str) -> Cluster {
        let etcd = EtcdServer::start();
        let proxy = Proxy::start(&etcd.endpoint());
        let dn = tempfile::tempdir().expect("tempdir");
        let out = tempfile::tempdir().expect("tempdir");
        let dns = shared_datanodes(&dn);
        let faketime = out.path().join("faketime");
        std::fs::write(&faketime, "+0").expect("faketime file");
        let o = format!("soft_limit={soft_limit},monitor_interval=0.2");
        let ft = faketime.display().to_string();
        let ms = (0..n)
            .map(|i| {
                let endpoint = if i == 0 {
                    proxy.endpoint()
                } else {
                    etcd.endpoint()
                };
                let env: Vec<(&str, &str)> = if i == 2 {
                    assert!(
                        Path::new(LIBFAKETIME).exists(),
                        "{LIBFAKETIME} is missing (apt-get install libfaketime)"
                    );
                    vec![
                        ("LD_PRELOAD", LIBFAKETIME),
                        ("FAKETIME_TIMESTAMP_FILE", &ft),
                        ("FAKETIME_CACHE_DURATION", "1"),
                        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                    ]
                } else {
                    Vec::new()
                };
                daemon_at(&endpoint, prefix, &dns, &[&o], &env)
            })
            .collect();
        Cluster {
            etcd,
            proxy,
            ms,
            faketime,
            _dn: dn,
            out,
            prefix: prefix.to_string(),
        }
    }

    fn ticks_path(&self) -> PathBuf {
        self.out.path().join("ticks")
    }

    /// An elector on each daemon, its command `testkit tick`.
    fn electors(&self) -> Vec<Candidate> {
        let cmd = [
            testkit().display().to_string(),
            "tick".into(),
            self.ticks_path().display().to_string(),
        ];
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.ms
            .iter()
            .enumerate()
            .map(|(i, m)| Candidate::spawn(m, "el", &format!("e{i}"), &[], &cmd))
            .collect()
    }

    fn logs(&self, cands: &[Candidate]) -> String {
        let mut s = String::new();
        for (i, m) in self.ms.iter().enumerate() {
            s += &format!("--- daemon {i} ---\n{}\n", tail(&m.log(), 60));
        }
        for c in cands {
            s += &format!("--- elector {} ---\n{}\n", c.id, tail(&c.log(), 40));
        }
        s
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until a term acts; its (epoch, id).
fn wait_acting(c: &Cluster, max: Duration) -> Option<(u64, String)> {
    let mut found = None;
    wait_until(max, || {
        found = acting(&ticks(&c.ticks_path()));
        found.is_some()
    });
    found
}

// ---- the leader's deadline ---------------------------------------------------------

/// Stops the leader's daemon (or cuts it off from etcd) until another
/// leader has acted for 1 s (9 s at most), and
/// checks that the leader's command had stopped before any other command
/// began, that another leader took over, and that the old leader records
/// its loss. `stubborn`: the command ignores SIGTERM, so it lives through
/// its whole grace.
fn leader_outlives_no_lease(fault: &str, soft_limit: &str, stubborn: bool) {
    let _slot = slot();
    let mut c = Cluster::start(2, soft_limit, &format!("dl-{fault}"));
    let ticks_path = c.ticks_path().display().to_string();
    let mut cmd = vec![testkit().display().to_string(), "tick".into(), ticks_path];
    if stubborn {
        cmd.push("--ignore-term".into());
    }
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    // The leader on daemon 0 (behind the proxy): its elector starts first.
    let mut cands = vec![Candidate::spawn(&c.ms[0], "el", "e0", &[], &cmd)];
    let (e1, id1) = wait_acting(&c, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", c.logs(&cands)));
    assert_eq!(id1, "e0");
    cands.push(Candidate::spawn(&c.ms[1], "el", "e1", &[], &cmd));
    let_time_pass(Duration::from_millis(1500));
    let t0 = Instant::now();
    let stopped = match fault {
        "stop" => Some(Stopped::stop(c.ms[0].pid.expect("daemon pid"))),
        "cut" | "pause" => {
            c.proxy.send(fault);
            None
        }
        _ => unreachable!(),
    };
    // Until the new leader has acted for a second (9 s at most, the
    // issue's pause): long enough for the old command to show.
    let mut next = None;
    let mut seen_at = None;
    wait_until(Duration::from_secs(9), || {
        let ts = ticks(&c.ticks_path());
        if let Err(e) = one_leader_at_a_time(&ts) {
            panic!("{fault}: {e}\n{}", c.logs(&cands));
        }
        next = next
            .clone()
            .or_else(|| acting(&ts).filter(|(e, _)| *e > e1));
        if next.is_some() && seen_at.is_none() {
            seen_at = Some(Instant::now());
        }
        seen_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(1))
    });
    let held = t0.elapsed();
    drop(stopped);
    match fault {
        "cut" => c.proxy.send("heal"),
        "pause" => c.proxy.send("resume"),
        _ => {}
    }
    let (e2, id2) =
        next.unwrap_or_else(|| panic!("{fault}: nobody took over in 9 s\n{}", c.logs(&cands)));
    assert_eq!(id2, "e1");
    assert!(e2 > e1);
    let_time_pass(Duration::from_secs(1));
    let ts = ticks(&c.ticks_path());
    let gap =
        one_leader_at_a_time(&ts).unwrap_or_else(|e| panic!("{fault}: {e}\n{}", c.logs(&cands)));
    // The old leader accounts for its term once its daemon is back: it
    // lost it (its deadline, or fenced), never `resigned`.
    assert!(
        wait_until(Duration::from_secs(10), || {
            history(&c.ms[1], "el").iter().any(|e| {
                e["epoch"].as_u64() == Some(e1) && e["event"] == "lost" && e["who"] == "e0"
            })
        }),
        "{fault}: the old leader recorded no loss\n{:#?}\n{}",
        history(&c.ms[1], "el"),
        c.logs(&cands)
    );
    assert!(
        !history(&c.ms[1], "el")
            .iter()
            .any(|e| e["epoch"].as_u64() == Some(e1) && e["event"] == "resigned"),
        "{fault}: a term that was lost recorded as resigned"
    );
    eprintln!(
        "{fault} for {held:?} (soft_limit {soft_limit}{}): term {e1} stopped {:?} before term {e2} began",
        if stubborn { ", SIGTERM ignored" } else { "" },
        gap.unwrap_or_default()
    );
    for cand in &cands {
        cand.signal(libc::SIGTERM);
    }
    for cand in cands.iter_mut() {
        cand.wait(Duration::from_secs(10));
    }
}

/// The case: the leader's daemon stopped for 9 s, soft limit 3 s.
/// The elector's renewal ioctl hangs on the stopped daemon; the command
/// must stop on the elector's own clock, before daemon 1 elects another.
/// (Before: the command ran on until SIGCONT.)
#[test]
fn a_leader_whose_daemon_stops_stops_its_command_before_another_leads() {
    leader_outlives_no_lease("stop", "3", false);
}

/// The leader's daemon cut off from etcd (connections reset), with a
/// command that waits for SIGKILL and `soft_limit=2.9` (a TTL of 2 s):
/// the daemon answers renewals until it gives the claim up, but vouches
/// only for what etcd confirmed. (Before: the leader learnt of the loss at
/// its next renewal and then gave its command a grace that ran past the
/// TTL.)
#[test]
fn a_leader_whose_daemon_is_cut_off_stops_its_command_before_another_leads() {
    leader_outlives_no_lease("cut", "2.9", true);
}

/// The leader's daemon's connection to etcd stops delivering (paused).
#[test]
fn a_leader_whose_daemon_cannot_reach_etcd_stops_its_command_before_another_leads() {
    leader_outlives_no_lease("pause", "2.9", true);
}

// ---- rounds ---------------------------------------------------------------------

/// A small xorshift generator: a round is its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

const FAULTS: [&str; 6] = ["stop", "pause", "cut", "revoke", "clock", "elector"];

/// One acknowledged line: writer, seq, offset, length, epoch.
#[derive(Debug)]
struct Ack {
    id: String,
    seq: u64,
    off: usize,
    len: usize,
    epoch: u64,
}

fn acks(side: &Path) -> Vec<Ack> {
    let text = std::fs::read_to_string(side).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.first() == Some(&"ack")).then_some(())?;
            Some(Ack {
                id: f.get(1)?.to_string(),
                seq: f.get(2)?.parse().ok()?,
                off: f.get(3)?.parse().ok()?,
                len: f.get(4)?.parse().ok()?,
                epoch: f.get(5)?.parse().ok()?,
            })
        })
        .collect()
}

/// `ID SEQ EPOCH` as `testkit lines` writes it, parsed.
fn parse_line(l: &str) -> Option<(String, u64, u64)> {
    let f: Vec<&str> = l.split(' ').collect();
    if f.len() != 3 || f[1].len() != 8 || f[2].len() != 20 || !f[0].starts_with('w') {
        return None;
    }
    Some((f[0].to_string(), f[1].parse().ok()?, f[2].parse().ok()?))
}

/// Whether `l` could be the start of a line `testkit lines` writes (the
/// torn tail of a fenced writer's unacknowledged line).
fn torn_prefix(l: &str) -> bool {
    let model = "w0 00000000 00000000000000000000";
    l.len() < model.len()
        && l.bytes().zip(model.bytes()).all(|(a, m)| match m {
            b'w' | b' ' => a == m,
            _ => a.is_ascii_digit(),
        })
}

/// The writers' file after a round: every acknowledged line where it was
/// acknowledged; every line one writer's (or a torn, unacknowledged tail);
/// epochs along the file never going back; the same bytes and the same
/// epoch on every daemon.
fn check_file(c: &Cluster, rel: &str, sides: &[PathBuf]) -> Result<usize, String> {
    let read = |i: usize| {
        std::fs::read(c.ms[i].path(rel)).map_err(|e| format!("daemon {i}: read {rel}: {e}"))
    };
    let content = read(1)?;
    for i in 0..c.ms.len() {
        let other = read(i)?;
        if other != content {
            return Err(format!(
                "daemon {i} shows {} bytes of {rel}, daemon 1 {}",
                other.len(),
                content.len()
            ));
        }
    }
    let all: Vec<Ack> = sides.iter().flat_map(|s| acks(s)).collect();
    // Lost lines first (nowhere in the file), then misplaced ones (not
    // where the writer's own file position said it wrote them).
    let (mut lost, mut misplaced) = (Vec::new(), Vec::new());
    for a in &all {
        let want = format!("{} {:08} {:020}\n", a.id, a.seq, a.epoch);
        if want.len() == a.len && content.get(a.off..a.off + a.len) == Some(want.as_bytes()) {
            continue;
        }
        match content
            .windows(want.len())
            .position(|w| w == want.as_bytes())
        {
            Some(at) => misplaced.push(format!("{want:?} at {at}, acknowledged at {}", a.off)),
            None => lost.push(format!("{want:?} (acknowledged at {})", a.off)),
        }
    }
    if !lost.is_empty() || !misplaced.is_empty() {
        return Err(format!(
            "of {} acknowledged lines, {} lost (first: {:?}), {} not where the writer's file position put them (first: {:?}); file {} bytes",
            all.len(),
            lost.len(),
            lost.first(),
            misplaced.len(),
            misplaced.first(),
            content.len()
        ));
    }
    let text = String::from_utf8_lossy(&content);
    let mut last_epoch = 0;
    for (n, l) in text.split('\n').enumerate() {
        if l.is_empty() {
            continue;
        }
        match parse_line(l) {
            Some((_, _, epoch)) => {
                if epoch < last_epoch {
                    return Err(format!(
                        "{rel} line {n}: epoch {epoch} after {last_epoch}: an older grant wrote after a newer one"
                    ));
                }
                last_epoch = epoch;
            }
            None if torn_prefix(l) => {}
            None => return Err(format!("{rel} line {n} mixes writers' bytes: {l:?}")),
        }
    }
    let epochs: Vec<Option<String>> =
        c.ms.iter()
            .map(|m| m.xattr(rel, "user.leasefs.epoch"))
            .collect();
    if epochs.iter().any(|e| e != &epochs[0]) {
        return Err(format!(
            "{rel}: the file's epoch differs between daemons: {epochs:?}"
        ));
    }
    if let Some(e) = epochs[0]
        .as_deref()
        .and_then(|e| e.trim().parse::<u64>().ok())
        && e < last_epoch
    {
        return Err(format!(
            "{rel}: epoch {e} shown, below the file's last grant {last_epoch}"
        ));
    }
    Ok(all.len())
}

fn rounds() -> usize {
    std::env::var("LEASEFS_CHAOS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Rounds of pauses, partitions, revoked claims and clock jumps, the
/// leaders checked after each (writers run as well, their file is not
/// checked: see the next test). A failing round names its seed:
/// `LEASEFS_CHAOS_SEED=S LEASEFS_CHAOS_ROUNDS=1` plays it again first.
#[test]
fn pause_and_partition_rounds_leaders() {
    chaos_rounds(false);
}

/// The same rounds with the writers' file checked too. Before the kernel
/// was told the file's size at each grant over etcd, about half of the
/// acknowledged lines were not where their writer's O_APPEND file
/// position said, in every round (a writer opening on one daemon after
/// another daemon's writer appended started from the kernel's stale size:
/// "acknowledged at 0", found at 264). `LEASEFS_CHAOS_KEEP_GOING=1`
/// reports every failing round and fails at the end, for counting.
#[test]
fn pause_and_partition_rounds() {
    chaos_rounds(true);
}

fn chaos_rounds(check_writers: bool) {
    let _slot = slot();
    let keep_going = std::env::var("LEASEFS_CHAOS_KEEP_GOING").is_ok_and(|v| v == "1");
    let mut failures: Vec<String> = Vec::new();
    let mut reported = std::collections::HashSet::new();
    let base: u64 = std::env::var("LEASEFS_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| monotonic_ns() % 1_000_000 + 1);
    let mut c = Cluster::start(3, "2", &format!("chaos-{}", std::process::id()));
    let mut cands = c.electors();
    std::fs::create_dir(c.ms[0].path("w")).expect("mkdir w");
    let mut checked = 0;
    let mut gaps = Vec::new();
    let t_all = Instant::now();
    for round in 0..rounds() {
        let seed = base + round as u64;
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        // The leader's daemon, mostly, where the fault can end a term.
        let now = ticks(&c.ticks_path());
        let leader = now.last().cloned();
        let leads_on = leader
            .as_ref()
            .and_then(|t| t.id.strip_prefix('e')?.parse::<usize>().ok());
        let victim = match fault {
            "pause" | "cut" => 0,
            "clock" => 2,
            "stop" | "elector" if rng.below(4) != 0 => leads_on.unwrap_or(0),
            _ => rng.below(3) as usize,
        };
        let rel = format!("w/r{round}");
        let run_ms = 4000;
        let sides: Vec<PathBuf> = (0..3)
            .map(|i| c.out.path().join(format!("side-{round}-{i}")))
            .collect();
        let mut writers: Vec<Child> = (0..3)
            .map(|i| {
                Command::new(testkit())
                    .arg("lines")
                    .arg(c.ms[i].path(&rel))
                    .arg(format!("w{i}"))
                    .arg("--side")
                    .arg(&sides[i])
                    .args(["--for-ms", &run_ms.to_string()])
                    .args(["--seed", &(seed * 3 + i as u64).to_string()])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("spawn testkit lines")
            })
            .collect();
        let at = Duration::from_millis(300 + rng.below(1200));
        let hold = Duration::from_millis(2000 + rng.below(2500));
        let_time_pass(at);
        eprintln!(
            "round {round} seed {seed}: {fault} on daemon {victim} for {hold:?} after {at:?}"
        );
        match fault {
            "stop" => {
                let s = Stopped::stop(c.ms[victim].pid.expect("daemon pid"));
                let_time_pass(hold);
                drop(s);
            }
            "pause" | "cut" => {
                c.proxy.send(fault);
                let_time_pass(hold);
                c.proxy
                    .send(if fault == "pause" { "resume" } else { "heal" });
            }
            "revoke" => {
                // The writers' file only (see the module's doc).
                use std::os::unix::fs::MetadataExt;
                let ino = std::fs::metadata(c.ms[1].path(&rel)).map(|m| m.ino());
                // The writers close and reopen it: its claim may end
                // between being read and being revoked.
                match ino.map(|ino| (ino, c.etcd.try_revoke_claim(&c.prefix, ino))) {
                    Ok((_, Some(_))) => {}
                    other => eprintln!("round {round}: no claim to revoke ({other:?})"),
                }
            }
            "elector" => {
                // The elector and its command frozen past the soft limit:
                // its daemon preempts it and kills the command.
                let el = cands[victim].pid();
                let cmd = leader
                    .as_ref()
                    .filter(|t| t.id == format!("e{victim}"))
                    .map(|t| t.pid);
                let s1 = Stopped::stop(el);
                let s2 = cmd.map(Stopped::stop);
                let_time_pass(hold);
                drop(s2);
                drop(s1);
            }
            "clock" => {
                let jump = if rng.below(2) == 0 { "+1h" } else { "-1h" };
                std::fs::write(&c.faketime, jump).expect("faketime");
                let_time_pass(hold);
                std::fs::write(&c.faketime, "+0").expect("faketime");
            }
            _ => unreachable!(),
        }
        for w in writers.iter_mut() {
            let pid = w.id();
            let done = wait_until(Duration::from_secs(30), || {
                w.try_wait().ok().flatten().is_some()
            });
            if !done {
                kill(pid, libc::SIGKILL);
                let _ = w.wait();
                panic!(
                    "round {round} (seed {seed}, {fault}): a writer hangs\n{}",
                    c.logs(&cands)
                );
            }
        }
        // Let closes and lengths reach every daemon (attribute cache 1 s).
        let_time_pass(Duration::from_millis(1200));
        let mut fail = |what: String, c: &Cluster| {
            let msg = format!(
                "round {round} (seed {seed}, {fault} on daemon {victim}): {what}\n\
                 replay: LEASEFS_CHAOS_SEED={seed} LEASEFS_CHAOS_ROUNDS=1"
            );
            if !keep_going {
                panic!("{msg}\n{}", c.logs(&cands));
            }
            // The logs too: a rare failure may not come back on replay.
            eprintln!("FAILED {msg}\n{}", c.logs(&cands));
            failures.push(msg);
        };
        if check_writers {
            match check_file(&c, &rel, &sides) {
                Ok(n) => checked += n,
                Err(e) => fail(e, &c),
            }
        }
        match one_leader_at_a_time(&ticks(&c.ticks_path())) {
            Ok(g) => gaps.extend(g),
            Err(e) => {
                if reported.insert(e.clone()) {
                    fail(e, &c)
                }
            }
        }
        // A leader again before the next round.
        if wait_acting(&c, Duration::from_secs(15)).is_none() {
            panic!(
                "round {round} (seed {seed}, {fault}): no leader afterwards\n{}",
                c.logs(&cands)
            );
        }
    }
    let terms = spans(&ticks(&c.ticks_path())).len();
    for cand in &cands {
        cand.signal(libc::SIGTERM);
    }
    for cand in cands.iter_mut() {
        cand.wait(Duration::from_secs(10));
    }
    eprintln!(
        "{} rounds from seed {base} in {:?}: {checked} acknowledged lines checked, {terms} terms, smallest handover gap {:?}, {} failed rounds",
        rounds(),
        t_all.elapsed(),
        gaps.iter().min(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

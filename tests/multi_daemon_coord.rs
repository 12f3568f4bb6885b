//! Coordination through the cluster layer (docs/SEMANTICS.md "Several daemons"): several
//! daemons over one etcd and the same datanode directories, with the
//! clients of one filesystem spread over them.
//!
//! - `leasefs spout`, one instance per daemon: every file consumed once,
//!   every line emitted, nothing left behind; an instance killed with -9 on
//!   one daemon and one stopped (SIGSTOP) on another are taken over by an
//!   instance on a third daemon, the stopped one fenced when it wakes.
//! - `leasefs elect`, one elector per daemon on one election directory: one
//!   command at a time, a stopped leader preempted after the soft limit by
//!   an elector of another daemon (larger epoch, the old command's writes
//!   fenced), a killed leader replaced at once.
//! - Two daemons racing to open one new name with O_CREAT: both open it.
//! - A partition (etcd stopped with SIGSTOP): the daemon fences its writer
//!   within 2/3 of the TTL plus a keep-alive period, before etcd could let
//!   the claim expire; afterwards the file can be written again, from
//!   either daemon, with its fsynced prefix intact.
//!
//! The partition test stops the shared etcd of its own test, but it needs
//! the machine's attention for its timing: it runs alone (the other tests
//! of this file take [`SLOT`] shared, it takes it exclusively).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::elect::{Candidate, check_terms, events, history, is_end, journal};
use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::spout::*;
use common::*;
use serde_json::Value;

static SLOT: RwLock<()> = RwLock::new(());

fn shared_slot() -> RwLockReadGuard<'static, ()> {
    SLOT.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive_slot() -> RwLockWriteGuard<'static, ()> {
    SLOT.write().unwrap_or_else(|e| e.into_inner())
}

fn logs_of(ms: &[&Mount]) -> String {
    ms.iter()
        .enumerate()
        .map(|(i, m)| format!("--- daemon {i} ---\n{}", m.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- namespace ---------------------------------------------------------------

/// Two daemons open one new name with O_CREAT (no O_EXCL) at the same
/// time, many times: the one whose create loses the race in etcd opens the
/// file the other created, as open(2) promises, instead of failing with
/// EEXIST (electors starting together on several daemons died of this).
#[test]
fn racing_creates_on_two_daemons_open_the_same_file() {
    let _slot = shared_slot();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "create", &dns, &[]);
    let b = daemon(&etcd, "create", &dns, &[]);
    let mut wa = Agent::spawn(&a.mnt);
    let mut wb = Agent::spawn(&b.mnt);
    for i in 0..40 {
        // Readers need no lease: both opens must succeed. Writers: one
        // gets the file's lease, the other EBUSY.
        let (flags, name) = if i % 2 == 0 {
            ("rc", format!("r{i}"))
        } else {
            ("wc", format!("w{i}"))
        };
        wa.send(&format!("open {name} {flags}n"));
        wb.send(&format!("open {name} {flags}n"));
        let ra = wa.reply(Duration::from_secs(10)).expect("A answered");
        let rb = wb.reply(Duration::from_secs(10)).expect("B answered");
        for (who, r) in [("A", &ra), ("B", &rb)] {
            let e = err_name(r);
            assert!(
                e.is_none() || (flags == "wc" && e == Some("EBUSY")),
                "{who}: open({name}, O_CREAT) without O_EXCL: {r}"
            );
        }
        if flags == "wc" {
            assert!(
                ra.starts_with("ok") || rb.starts_with("ok"),
                "nobody opened {name}: {ra} / {rb}"
            );
        }
        for (w, r) in [(&mut wa, &ra), (&mut wb, &rb)] {
            if r.starts_with("ok") {
                w.ok("close");
            }
        }
    }
    // One file per name.
    let names = a.sh_ok("ls");
    assert_eq!(names.lines().count(), 40, "{names}");
}

// ---- spout -----------------------------------------------------------------

const SPOUT_O: &str = "soft_limit=2,monitor_interval=0.2";

/// Nothing left in the source and lock directories, every file in done/
/// whole.
fn check_all_done(m: &Mount, files: &BTreeMap<String, Vec<String>>) {
    let want: Vec<String> = files.keys().cloned().collect();
    assert_eq!(names_in(m, "done"), want, "not every file is done");
    assert_eq!(
        names_in(m, "in"),
        [".bad", ".lock"],
        "left in the source directory"
    );
    assert!(
        names_in(m, "in/.lock").is_empty(),
        "lock files or DIRLOCK left: {:?}",
        names_in(m, "in/.lock")
    );
    assert!(names_in(m, "in/.bad").is_empty());
    for (name, lines) in files {
        let done = m.read_string(&format!("done/{name}"));
        assert_eq!(done.lines().count(), lines.len(), "done/{name} changed");
    }
}

/// One instance per daemon, no failure: the files are shared out among the
/// daemons' instances, each consumed by exactly one, each line emitted
/// exactly once.
#[test]
fn spout_instances_on_three_daemons_consume_each_file_once() {
    let _slot = shared_slot();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let ms: Vec<Mount> = (0..3)
        .map(|_| daemon(&etcd, "spout", &dns, &[SPOUT_O]))
        .collect();
    setup(&ms[0]);
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..40 {
        let name = format!("f{i:02}");
        files.insert(name.clone(), lines_of(&name, 500 + 50 * i));
        publish(&ms[0], &name, &files[&name]);
    }
    // Every daemon sees the published files.
    for m in &ms {
        assert!(
            wait_until(Duration::from_secs(5), || names_in(m, "in").len() == 40),
            "{:?}",
            names_in(m, "in")
        );
    }
    let args = [
        "--lock-timeout",
        "3",
        "--commit-count",
        "200",
        "--commit-sec",
        "1",
        "--once",
    ];
    let t0 = Instant::now();
    let mut insts: Vec<Inst> = ["a", "b", "c"]
        .iter()
        .zip(&ms)
        .map(|(id, m)| Inst::spawn(m, id, &args))
        .collect();
    for i in insts.iter_mut() {
        i.wait_ok(Duration::from_secs(60));
    }
    eprintln!("3 instances consumed 40 files in {:?}", t0.elapsed());
    for m in &ms {
        check_all_done(m, &files);
    }

    // Each file started by exactly one instance; each instance had work.
    let mut by: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for i in &insts {
        for f in i.consumed() {
            by.entry(f).or_default().push(&i.id);
        }
        assert!(i.takeovers().is_empty(), "{}: {}", i.id, i.stderr());
        assert!(
            !i.stderr().contains("lost the lock"),
            "{}: {}",
            i.id,
            i.stderr()
        );
        assert_eq!(i.stdout_split().1, None, "{}: torn last line", i.id);
    }
    for name in files.keys() {
        assert_eq!(
            by.get(name).map(Vec::len),
            Some(1),
            "{name} consumed by {:?}",
            by.get(name)
        );
    }
    for i in &insts {
        assert!(
            !i.consumed().is_empty(),
            "instance {} (daemon of its own) consumed no file: {by:?}",
            i.id
        );
    }
    // Every line exactly once, and each file's lines by the instance that
    // consumed it, in order.
    let emitted: Vec<String> = insts.iter().flat_map(|i| i.stdout_lines()).collect();
    let c = counts(&emitted);
    for (name, lines) in &files {
        for l in lines {
            assert_eq!(c.get(l.as_str()), Some(&1), "{name}: line `{l}`");
        }
    }
    assert_eq!(emitted.len(), files.values().map(Vec::len).sum::<usize>());
    for i in &insts {
        let out = i.stdout_lines();
        for name in i.consumed() {
            let mine: Vec<&String> = out
                .iter()
                .filter(|l| l.split(' ').next() == Some(name.as_str()))
                .collect();
            assert!(
                mine.iter().copied().eq(files[&name].iter()),
                "{}: {name} not emitted whole and in order",
                i.id
            );
        }
    }
    eprintln!(
        "files per instance: {:?}",
        insts
            .iter()
            .map(|i| (i.id.as_str(), i.consumed().len()))
            .collect::<Vec<_>>()
    );
}

/// An instance on daemon A is killed with -9 in the middle of big-a, one
/// on daemon B is stopped in the middle of big-b; the instance on daemon C
/// takes both over (big-b only once B let its claim run out: the stopped
/// holder no longer renews), every line is emitted at least once,
/// duplicates only after the takeover points, and the stopped instance,
/// resumed, is fenced and leaves the file to C.
#[test]
fn spout_files_of_killed_and_stopped_instances_pass_to_another_daemon() {
    const BIG: usize = 100_000;
    let _slot = shared_slot();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let ms: Vec<Mount> = (0..3)
        .map(|_| daemon(&etcd, "takeover", &dns, &[SPOUT_O]))
        .collect();
    let (a, b, c) = (&ms[0], &ms[1], &ms[2]);
    setup(a);
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in ["big-a", "big-b"] {
        files.insert(name.into(), lines_of(name, BIG));
        publish(a, name, &files[name]);
    }
    for i in 0..20 {
        let name = format!("small-{i:02}");
        files.insert(name.clone(), lines_of(&name, 200 + 10 * i));
        publish(a, &name, &files[&name]);
    }
    let args = [
        "--lock-timeout",
        "3",
        "--commit-count",
        "5000",
        "--commit-sec",
        "1",
        "--once",
    ];

    // On A: takes the oldest file, big-a, reads it slowly, is killed.
    let mut killed = Inst::spawn_slow(a, "killed", &args, 256);
    let committed = wait_committed(a, "in/.lock/big-a", "killed");
    killed.signal(libc::SIGSTOP);
    assert!(a.path("in/big-a.inprogress").exists());
    killed.signal(libc::SIGKILL);
    killed.wait(Duration::from_secs(10));
    // The lock file's last entry, as any daemon sees it once published.
    let mut killed_at = None;
    assert!(wait_until(Duration::from_secs(3), || {
        killed_at = last_entry(c, "in/.lock/big-a").map(|e| e.1);
        killed_at.is_some_and(|k| k >= committed)
            && last_entry(a, "in/.lock/big-a").map(|e| e.1) == killed_at
    }));
    let killed_at = killed_at.expect("big-a's entry");
    assert!((killed_at as usize) < BIG * 14, "killed at {killed_at}");

    // On B: takes the next oldest, big-b, and is stopped (with its lease
    // on the lock file: it no longer renews; it renewed every 200 ms).
    let mut stopped_args = args.to_vec();
    stopped_args.extend(["--renew-ms", "200"]);
    let mut stopped = Inst::spawn_slow(b, "stopped", &stopped_args, 256);
    wait_committed(b, "in/.lock/big-b", "stopped");
    stopped.signal(libc::SIGSTOP);
    let froze = Instant::now();
    assert!(b.path("in/big-b.inprogress").exists());
    let (_, stopped_at) = last_entry(b, "in/.lock/big-b").expect("big-b's lock entry");

    // On C: the small files, then both big ones once their locks are idle
    // (1 s for this one) and their leases gone: big-a's at once (A let go
    // of it with its dead holder's descriptor), big-b's only once B gave
    // its claim up, more than the soft limit (2 s) after the holder's last
    // renewal.
    let mut other_args = args.to_vec();
    other_args[1] = "1";
    other_args.extend(["--renew-ms", "300"]);
    let mut other = Inst::spawn(c, "other", &other_args);
    let taken = wait_until(Duration::from_secs(30), || {
        matches!(last_entry(c, "in/.lock/big-b"), Some((id, _)) if id != "stopped")
            || c.path("done/big-b").exists()
    });
    assert!(
        taken,
        "big-b was never taken over\n{}\n{}",
        other.stderr(),
        logs_of(&[a, b, c])
    );
    let waited = froze.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "big-b taken over {waited:?} after its owner stopped: before the soft limit (2 s)"
    );
    // B preempted its expired holder because a writer elsewhere wanted
    // the file, and the claim went with it.
    assert!(
        b.log()
            .contains("a writer on another daemon preempts an expired holder"),
        "{}",
        b.log()
    );
    stopped.signal(libc::SIGCONT);

    other.wait_ok(Duration::from_secs(60));
    stopped.wait_ok(Duration::from_secs(30));
    for m in &ms {
        check_all_done(m, &files);
    }

    // The stopped owner woke up fenced and gave the file up.
    assert!(
        stopped.stderr().contains("lost the lock of big-b"),
        "{}",
        stopped.stderr()
    );
    assert_eq!(
        stopped.consumed().first().map(String::as_str),
        Some("big-b"),
        "{}",
        stopped.stderr()
    );
    assert!(
        stopped.takeovers().is_empty() && !other.consumed().contains(&"big-b".to_string()),
        "big-b was started twice"
    );
    let mut took: Vec<String> = other.takeovers().into_iter().map(|t| t.0).collect();
    took.sort();
    assert_eq!(took, ["big-a", "big-b"], "{}", other.stderr());

    // Every line at least once, nothing else.
    let all = [&killed, &stopped, &other];
    assert_eq!(stopped.stdout_split().1, None);
    assert_eq!(other.stdout_split().1, None);
    if let Some(torn) = killed.stdout_split().1 {
        assert!(
            files["big-a"].iter().any(|l| l.starts_with(&torn)),
            "`{torn}`"
        );
    }
    let emitted: Vec<String> = all.iter().flat_map(|i| i.stdout_lines()).collect();
    let cnt = every_line_at_least_once(&emitted, &files);

    // Duplicates only at or after the takeover points.
    let resumed: HashMap<String, u64> = other.takeovers().into_iter().collect();
    assert_eq!(
        resumed["big-a"], killed_at,
        "big-a resumed at its last entry"
    );
    assert!(
        resumed["big-b"] >= stopped_at,
        "big-b resumed at {}, before {stopped_at}",
        resumed["big-b"]
    );
    let mut dups = 0;
    for (line, n) in &cnt {
        if *n > 1 {
            dups += n - 1;
            let (name, off) = line_offset(line);
            let from = resumed.get(&name).copied();
            assert!(
                from.is_some_and(|f| off >= f),
                "`{line}` (offset {off}) emitted {n} times, but {name} was resumed at {from:?}"
            );
        }
    }
    // What the killed owner committed, it had emitted.
    let k: HashSet<String> = killed.stdout_lines().into_iter().collect();
    for l in &files["big-a"][..(killed_at as usize / 14)] {
        assert!(
            k.contains(l),
            "`{l}` committed by the killed owner, never emitted"
        );
    }
    eprintln!(
        "{} lines emitted, {dups} duplicates, takeovers {resumed:?}, big-b taken after {waited:?}",
        emitted.len()
    );
}

// ---- elect -----------------------------------------------------------------

const ELECT_O: &str = "soft_limit=2,monitor_interval=0.2";

/// A command's process group the test stopped: continued and killed if
/// the test fails before the group is gone.
struct Group(u32);

impl Group {
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) of the process group of a command our elector ran.
        unsafe {
            libc::kill(-(self.0 as i32), sig);
        }
    }

    fn gone(&self) -> bool {
        // SAFETY: signal 0 only checks whether the group exists.
        unsafe { libc::kill(-(self.0 as i32), 0) != 0 }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.gone() {
            self.signal(libc::SIGCONT);
            self.signal(libc::SIGKILL);
        }
    }
}

fn cand_logs(cands: &[Candidate]) -> String {
    cands
        .iter()
        .map(|c| format!("--- elector {} ---\n{}", c.id, c.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The term going on by the audit table: (epoch, id) of the last
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

/// The election file's record of term `epoch` (pid and pgid of its
/// leader), as daemon `m` shows the file.
fn record_of(m: &Mount, dir: &str, epoch: u64) -> Option<Value> {
    let text = std::fs::read_to_string(m.path(&format!("{dir}/LEADER"))).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["epoch"].as_u64() == Some(epoch))
}

/// Waits for a term with an epoch above `after` and its record.
fn wait_term(m: &Mount, dir: &str, after: u64, max: Duration) -> Option<(u64, String, Value)> {
    let mut found = None;
    wait_until(max, || {
        found = open_term(&history(m, dir))
            .filter(|(e, _)| *e > after)
            .and_then(|(e, id)| record_of(m, dir, e).map(|r| (e, id, r)));
        found.is_some()
    });
    found
}

/// One line of the outside journal.
#[derive(Debug, Clone)]
struct Ev {
    kind: String,
    id: String,
    epoch: u64,
    pid: u32,
    ns: u64,
    errno: String,
}

fn outside(path: &Path) -> Vec<Ev> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some(Ev {
                kind: f.first()?.to_string(),
                id: f.get(1)?.to_string(),
                epoch: f.get(2)?.parse().ok()?,
                pid: f.get(3)?.parse().ok()?,
                ns: f.get(4)?.parse().ok()?,
                errno: f.get(5).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// Commands (by their start lines) that are alive and not stopped.
fn running_commands(path: &Path) -> Vec<(String, u64)> {
    outside(path)
        .into_iter()
        .filter(|e| e.kind == "start" && alive(e.pid) && !stopped(e.pid))
        .map(|e| (e.id, e.epoch))
        .collect()
}

/// By the outside journal: each epoch started once, in increasing order,
/// and every line a term got into the shared journal came before the next
/// term's command started.
fn check_outside(evs: &[Ev]) {
    let starts: Vec<&Ev> = evs.iter().filter(|e| e.kind == "start").collect();
    for w in starts.windows(2) {
        assert!(
            w[0].epoch < w[1].epoch && w[0].ns < w[1].ns,
            "terms started out of order: {w:?}"
        );
    }
    for w in starts.windows(2) {
        let late = evs
            .iter()
            .find(|e| e.kind == "tick" && e.epoch == w[0].epoch && e.ns > w[1].ns);
        assert!(
            late.is_none(),
            "term {} wrote {late:?} after term {} started at {}",
            w[0].epoch,
            w[1].epoch,
            w[1].ns
        );
    }
}

/// Three daemons, an elector on each. One command runs at a time; the
/// leader stopped with its command is preempted after the soft limit by an
/// elector on another daemon (its daemon let the claim run out), with a
/// larger epoch, and the old command's writes are fenced on its daemon;
/// a leader killed with -9 is replaced at once.
#[test]
fn electors_on_three_daemons_one_command_at_a_time() {
    let _slot = shared_slot();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let ms: Vec<Mount> = (0..3)
        .map(|_| daemon(&etcd, "elect", &dns, &[ELECT_O]))
        .collect();
    std::fs::create_dir(ms[0].path("own")).expect("mkdir own");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = out_dir.path().join("outside");
    let ids = ["a", "b", "c"];
    let mut cands: Vec<Candidate> = ids
        .iter()
        .zip(&ms)
        .map(|(id, m)| {
            // A leader's command (tools/testkit/src/term.rs). Outside the
            // mount it logs `start ID EPOCH PID NS` when it starts, `tick ID
            // EPOCH PID NS` after each line it got into the shared journal
            // on the mount (`EPOCH ID`, opened for each line, EBUSY
            // retried) and `error ID EPOCH PID NS ERRNO` before exiting
            // with 3 on any other error. NS is CLOCK_MONOTONIC, common to
            // every process of the machine. It keeps a file of its own
            // under own/ open all term and writes to it before each line:
            // the descriptor the daemon's fencing must stop.
            let cmd = [
                testkit().display().to_string(),
                "term".into(),
                m.path("journal").display().to_string(),
                "--events".into(),
                out.display().to_string(),
                "--own".into(),
                m.path("own").display().to_string(),
            ];
            Candidate::spawn(
                m,
                "el",
                id,
                &[],
                &cmd.iter().map(String::as_str).collect::<Vec<_>>(),
            )
        })
        .collect();
    let m0 = &ms[0];
    let samples = std::cell::Cell::new(0);
    let one_at_a_time = |what: &str| {
        let r = running_commands(&out);
        samples.set(samples.get() + 1);
        assert!(r.len() <= 1, "{what}: commands running at once: {r:?}");
    };

    let (e1, id1, rec1) = wait_term(m0, "el", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", cand_logs(&cands)));
    assert!(wait_until(Duration::from_secs(10), || {
        one_at_a_time("first term");
        outside(&out)
            .iter()
            .filter(|e| e.kind == "tick" && e.epoch == e1)
            .count()
            >= 5
    }));
    // Followers on the other daemons keep following.
    holds_for(
        Duration::from_millis(1000),
        "one command at a time in the first term",
        || {
            one_at_a_time("first term");
            true
        },
    );
    assert_eq!(events(&history(m0, "el"), "elected").len(), 1);

    // Freeze the leader and its command.
    let i1 = ids.iter().position(|i| *i == id1).expect("a known id");
    assert_eq!(rec1["pid"].as_u64(), Some(cands[i1].pid() as u64));
    let group1 = Group(rec1["pgid"].as_u64().expect("pgid") as u32);
    cands[i1].signal(libc::SIGSTOP);
    group1.signal(libc::SIGSTOP);
    let froze = Instant::now();
    holds_for(
        Duration::from_millis(1000),
        "the stopped leader's term, within 1 s of its stop (soft limit 2 s)",
        || open_term(&history(m0, "el")).map(|t| t.0) == Some(e1),
    );
    let mut second = None;
    wait_until(Duration::from_secs(10), || {
        one_at_a_time("handover after SIGSTOP");
        second = open_term(&history(m0, "el")).filter(|t| t.0 > e1);
        second.is_some()
    });
    let (e2, id2) = second.unwrap_or_else(|| {
        panic!(
            "no new leader after the leader stopped\n{}\n{}",
            cand_logs(&cands),
            logs_of(&ms.iter().collect::<Vec<_>>())
        )
    });
    let took = froze.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "taken over {took:?} after the stop"
    );
    assert_ne!(id2, id1);
    assert!(e2 > e1);
    assert!(
        ms[i1]
            .log()
            .contains("a writer on another daemon preempts an expired holder"),
        "{}",
        ms[i1].log()
    );
    // The daemon that preempted says so, before the lease moved on: the
    // successor on another daemon could not tell a stopped leader from a
    // dead one.
    let h = history(m0, "el");
    let ends: Vec<&Value> = h
        .iter()
        .filter(|e| is_end(e) && e["epoch"].as_u64() == Some(e1))
        .collect();
    assert!(
        ends.first().is_some_and(|e| e["event"] == "preempted"),
        "term {e1} not recorded as preempted: {h:#?}"
    );

    // The old command, frozen with its elector, is killed by its daemon
    // once the term is over (a zombie until its stopped elector reaps it):
    // nothing it held open all term writes again.
    let old_pid = outside(&out)
        .iter()
        .find(|e| e.kind == "start" && e.epoch == e1)
        .map(|e| e.pid)
        .expect("the old command's start");
    assert!(
        wait_until(Duration::from_secs(5), || !alive(old_pid)),
        "the old command lives on after its term ended"
    );
    if let Some(e) = outside(&out)
        .iter()
        .find(|e| e.kind == "error" && e.epoch == e1)
    {
        panic!("the frozen old command ran again (error {})", e.errno);
    }

    assert!(wait_until(Duration::from_secs(10), || {
        one_at_a_time("second term");
        outside(&out)
            .iter()
            .any(|e| e.kind == "tick" && e.epoch == e2)
    }));
    // Then its elector: it notices the loss and follows again.
    cands[i1].signal(libc::SIGCONT);
    assert!(
        wait_until(Duration::from_secs(5), || {
            events(&history(m0, "el"), "lost")
                .iter()
                .any(|e| e["epoch"].as_u64() == Some(e1))
        }),
        "the old leader did not record its loss\n{}",
        cands[i1].log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || group1.gone()),
        "the old command's group lives on"
    );
    assert!(cands[i1].wait(Duration::from_millis(300)).is_none());

    // kill -9 of the second leader: its daemon releases the claim at once.
    let i2 = ids.iter().position(|i| *i == id2).expect("a known id");
    let rec2 = record_of(m0, "el", e2).expect("record of the second term");
    let group2 = Group(rec2["pgid"].as_u64().expect("pgid") as u32);
    cands[i2].signal(libc::SIGKILL);
    cands[i2].wait(Duration::from_secs(5));
    let killed = Instant::now();
    let mut third = None;
    wait_until(Duration::from_secs(10), || {
        one_at_a_time("handover after kill -9");
        third = open_term(&history(m0, "el")).filter(|t| t.0 > e2);
        third.is_some()
    });
    let (e3, id3) =
        third.unwrap_or_else(|| panic!("no leader after kill -9\n{}", cand_logs(&cands)));
    let took3 = killed.elapsed();
    assert!(took3 < Duration::from_secs(3), "handover took {took3:?}");
    assert_ne!(id3, id2);
    assert!(
        wait_until(Duration::from_secs(5), || group2.gone()),
        "the killed leader's command lives on"
    );
    assert!(wait_until(Duration::from_secs(10), || {
        one_at_a_time("third term");
        outside(&out)
            .iter()
            .any(|e| e.kind == "tick" && e.epoch == e3)
    }));

    for c in cands.iter().filter(|c| c.id != id2) {
        c.signal(libc::SIGTERM);
    }
    for c in cands.iter_mut().filter(|c| c.id != id2) {
        let st = c.wait(Duration::from_secs(10));
        assert!(
            st.is_some_and(|s| s.success()),
            "elector {} on SIGTERM: {st:?}\n{}",
            c.id,
            c.log()
        );
    }
    let h = history(m0, "el");
    check_terms(&h, &journal(m0));
    let evs = outside(&out);
    check_outside(&evs);
    let epochs: Vec<u64> = evs
        .iter()
        .filter(|e| e.kind == "start")
        .map(|e| e.epoch)
        .collect();
    assert_eq!(epochs, [e1, e2, e3], "{evs:?}");
    // Nothing of an old term in the shared journal after a newer one.
    let lines = journal(m0);
    for e in [e2, e3] {
        let first = lines
            .iter()
            .position(|l| l.0 == e)
            .expect("term in journal");
        assert!(!lines[first..].iter().any(|l| l.0 < e), "{lines:?}");
    }
    eprintln!(
        "terms {e1} ({id1}) -> {e2} ({id2}) after {took:?} stopped -> {e3} ({id3}) {took3:?} after kill -9; {} samples",
        samples.get()
    );
}

// ---- partition -------------------------------------------------------------

/// etcd stopped (SIGSTOP) by the test; continued on drop, in every path.
struct Frozen(u32);

impl Frozen {
    fn stop(pid: u32) -> Frozen {
        kill(pid, libc::SIGSTOP);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// etcd stopped for longer than the soft limit (3 s) while daemon A has
/// three writers, each holding a file of its own: A cannot renew their
/// claims, and fences every one of them (EIO) once keep-alives have gone
/// unconfirmed for 2/3 of the TTL, within 2/3 TTL plus one keep-alive
/// period of the stop, before etcd could let a claim expire. Once etcd is
/// back, each file can be written from B and from A again, and what was
/// fsynced before the partition is intact.
#[test]
fn partitioned_daemon_fences_its_writers_before_their_claims_can_expire() {
    const TTL: Duration = Duration::from_secs(3);
    let _slot = exclusive_slot();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "part", &dns, &["soft_limit=3"]);
    let b = daemon(&etcd, "part", &dns, &["soft_limit=3"]);
    let names = ["f", "g", "h"];
    let mut ws: Vec<Agent> = names.iter().map(|_| Agent::spawn(&a.mnt)).collect();
    for (w, n) in ws.iter_mut().zip(names) {
        w.ok(&format!("open {n} wc"));
        w.ok(&format!("rep 500 {n}-before-partition"));
        w.ok("fsync");
    }
    // A few keep-alive rounds of the claims (every TTL/3 = 1 s; a round
    // leaves no outward sign, so only time makes sure they ran).
    let_time_pass(Duration::from_millis(1500));
    let mut acked = Vec::new();
    for (w, n) in ws.iter_mut().zip(names) {
        w.ok("write still-connected");
        w.ok("fsync");
        acked.push(format!("{n}-before-partition\n").repeat(500) + "still-connected\n");
    }
    let mut wb = Agent::spawn(&b.mnt);
    assert_eq!(err_name(&wb.cmd("open f wan")), Some("EBUSY"));

    let frozen = Frozen::stop(etcd.pid());
    let t0 = Instant::now();
    // Writes need no etcd: they go on until the daemon fences the writer.
    let mut fenced_at: Vec<Option<Duration>> = vec![None; names.len()];
    let mut probes = vec![0; names.len()];
    // A probe by each writer every 30 ms: when fencing came is measured.
    let all_fenced = poll_until(Duration::from_secs(10), Duration::from_millis(30), || {
        for (i, w) in ws.iter_mut().enumerate() {
            if fenced_at[i].is_some() {
                continue;
            }
            let r = w.cmd("write probe");
            if r.starts_with("ok") {
                probes[i] += 1;
            } else {
                assert_eq!(err_name(&r), Some("EIO"), "{}: {r}", names[i]);
                fenced_at[i] = Some(t0.elapsed());
            }
        }
        fenced_at.iter().all(Option::is_some)
    });
    assert!(
        all_fenced,
        "not fenced during the partition: {fenced_at:?}\n{}",
        a.log()
    );
    let fenced_at: Vec<Duration> = fenced_at.into_iter().flatten().collect();
    let limit = TTL * 2 / 3 + TTL / 3;
    assert!(
        fenced_at.iter().all(|t| *t <= limit),
        "writers fenced {fenced_at:?} after etcd stopped (TTL {TTL:?}: keep-alives every {:?}, \
         fencing due after {:?} without one)\n{}",
        TTL / 3,
        TTL * 2 / 3,
        a.log()
    );
    assert!(
        probes.iter().all(|p| *p > 0),
        "a first write after the stop already failed: {probes:?}"
    );
    for w in ws.iter_mut() {
        let r = w.cmd("fsync");
        assert_eq!(err_name(&r), Some("EIO"), "fsync after fencing: {r}");
    }
    assert_eq!(
        a.log()
            .matches("cluster claim not renewed in time; giving the file up")
            .count(),
        names.len(),
        "{}",
        a.log()
    );
    // Longer than the soft limit in all: a partition is a length of time.
    let_time_pass((TTL + Duration::from_millis(500)).saturating_sub(t0.elapsed()));
    drop(frozen);
    let stopped_for = t0.elapsed();
    // A's liveness key ran out with the partition: A registers again, so
    // nobody takes A for a dead daemon.
    assert!(
        wait_until(Duration::from_secs(10), || a
            .log()
            .contains("registered this daemon in etcd again")),
        "A did not register again after the partition\n{}",
        a.log()
    );

    // etcd is back: B gets each file (A gave its claims up; B recovers the
    // files A left under construction) and writes.
    for n in names {
        let got = wait_until(Duration::from_secs(15), || {
            wb.cmd(&format!("open {n} wan")).starts_with("ok")
        });
        assert!(
            got,
            "B never got {n} after the partition\n{}",
            logs_of(&[&a, &b])
        );
        wb.ok("write from-b");
        wb.ok("close");
    }
    // The fenced writers' descriptors are dead; closing them changes
    // nothing.
    for w in ws.iter_mut() {
        let _ = w.cmd("close");
    }
    // And A again, with new opens.
    let mut w2 = Agent::spawn(&a.mnt);
    for n in names {
        let got = wait_until(Duration::from_secs(10), || {
            w2.cmd(&format!("open {n} wan")).starts_with("ok")
        });
        assert!(got, "A never got {n} again\n{}", a.log());
        w2.ok("write from-a-again");
        w2.ok("close");
    }

    let tail = "from-b\nfrom-a-again\n";
    for m in [&a, &b] {
        for (n, acked) in names.iter().zip(&acked) {
            assert!(wait_until(Duration::from_secs(3), || m
                .read_string(n)
                .ends_with(tail)));
            let content = m.read_string(n);
            assert!(
                content.starts_with(acked.as_str()),
                "{n}: the fsynced prefix is not intact: {:?}...",
                &content[..content.len().min(200)]
            );
            // In between, at most whole lines the fenced writer never had
            // acknowledged.
            let mid = &content[acked.len()..content.len() - tail.len()];
            assert!(mid.lines().all(|l| l == "probe"), "{n}: torn data: {mid:?}");
        }
    }
    eprintln!(
        "fenced {fenced_at:?} after etcd stopped (writes that went through first: {probes:?}); etcd stopped for {stopped_for:?}"
    );
}

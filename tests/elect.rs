//! `leasefs elect` (docs/SEMANTICS.md "Leader election") with real
//! processes on a real mount (`soft_limit=2`, which the electors read from
//! the mount as their lease duration): three electors and kill -9 of the leader; SIGSTOP of the leader
//! and its command (preempted after the soft limit, fenced on waking, its
//! command's writes refused); a leader that misses its renew deadline with
//! nobody competing; resignation when the command exits, `--once`,
//! SIGTERM, the audit table through `--history` and `sqlite3`; and a churn
//! of more than a hundred leadership changes.
//!
//! Every leader's command appends `EPOCH ID` lines to a shared journal on
//! the mount. [`check_terms`] then proves that no two terms overlapped: the
//! journal's epochs never go back, each epoch belongs to one id, each
//! matches an `elected` event of that id, and every term's end is in the
//! audit table before the next `elected`.

mod common;
use common::elect::{Candidate, check_terms, events, group_alive, history, journal, journal_at};
use common::*;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

const MOUNT_O: &str = "soft_limit=2,monitor_interval=0.2";

/// A command's process group that the test stopped: continued and killed
/// if the test fails before the group is gone.
struct Group(u32);

impl Group {
    fn signal(&self, sig: i32) {
        kill_group(self.0, sig);
    }

    fn gone(&self) -> bool {
        // SAFETY: kill(2) with signal 0 only checks whether the group exists.
        unsafe { libc::kill(-(self.0 as i32), 0) != 0 }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.gone() {
            kill_group(self.0, libc::SIGCONT);
            kill_group(self.0, libc::SIGKILL);
        }
    }
}

fn kill_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) of a process group a test elector started.
    unsafe {
        libc::kill(-(pgid as i32), sig);
    }
}

fn logs(cands: &[&Candidate]) -> String {
    cands
        .iter()
        .map(|c| format!("--- elector {} ---\n{}", c.id, c.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The leader now: the election file's last record, if its epoch is the
/// one the lease is held at.
fn leader(m: &Mount, dir: &str) -> Option<Value> {
    let leader = format!("{dir}/LEADER");
    let lease: Value = serde_json::from_str(m.xattr(&leader, "user.leasefs.lease")?.trim()).ok()?;
    if lease["state"] != "held" {
        return None;
    }
    let text = std::fs::read_to_string(m.path(&leader)).ok()?;
    let rec: Value = serde_json::from_str(text.lines().last()?).ok()?;
    (rec["epoch"] == lease["epoch"]).then_some(rec)
}

/// Waits for a leader whose epoch is above `after`.
fn wait_leader(m: &Mount, dir: &str, after: u64, max: Duration) -> Option<Value> {
    let mut found = None;
    wait_until(max, || {
        found = leader(m, dir).filter(|r| r["epoch"].as_u64().unwrap_or(0) > after);
        found.is_some()
    });
    found
}

/// A leader's command (tools/testkit/src/term.rs): appends `EPOCH ID` to
/// the journal every 50 ms, opening it for each line and retrying on
/// EBUSY (the previous leader's command may still be closing it). With
/// `own`, a directory of the mount, it also keeps a file of its own open
/// for the whole term and writes to it before each line: the "old handle"
/// that fencing must stop. Any other error is written to the status file
/// (outside the mount) as `EPOCH ID ERRNO` and ends the command with
/// status 3.
fn journal_command(m: &Mount, status: &str, own: Option<&str>) -> Vec<String> {
    let mut cmd = vec![
        testkit().display().to_string(),
        "term".into(),
        m.path("journal").display().to_string(),
        "--status".into(),
        status.into(),
    ];
    if let Some(own) = own {
        cmd.extend(["--own".into(), own.into()]);
    }
    cmd
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn pgid_of(rec: &Value) -> u32 {
    rec["pgid"]
        .as_u64()
        .expect("record names the command's group") as u32
}

fn stop_all(cands: &mut [&mut Candidate]) {
    for c in cands.iter() {
        c.signal(libc::SIGTERM);
    }
    for c in cands.iter_mut() {
        let st = c.wait(Duration::from_secs(10));
        assert!(
            st.is_some_and(|s| s.success()),
            "elector {} on SIGTERM: {st:?}\n{}",
            c.id,
            c.log()
        );
    }
}

#[test]
fn killing_the_leader_with_sigkill_hands_over_at_once() {
    let m = Mount::with_o(MOUNT_O);
    let status = m.dir.path().join("status").display().to_string();
    let cmd = journal_command(&m, &status, None);
    let mut a = Candidate::spawn(&m, "el", "a", &[], &strs(&cmd));
    let mut b = Candidate::spawn(&m, "el", "b", &[], &strs(&cmd));
    let mut c = Candidate::spawn(&m, "el", "c", &[], &strs(&cmd));
    let first = wait_leader(&m, "el", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", logs(&[&a, &b, &c])));
    let e1 = first["epoch"].as_u64().expect("epoch");
    let lease = m.lease("el/LEADER");
    assert_eq!(lease["mode"], "client", "{lease}");
    assert_eq!(
        lease["holder"],
        format!("{}:{}", hostname(), first["pid"]),
        "{lease}"
    );
    assert!(wait_until(Duration::from_secs(10), || journal(&m)
        .iter()
        .any(|l| l.0 == e1)));
    // Followers keep following: still one term after a few retries.
    holds_for(
        Duration::from_millis(600),
        "a single term while the leader renews",
        || events(&history(&m, "el"), "elected").len() == 1,
    );

    let old = Group(pgid_of(&first));
    let (dead, rest): (Vec<_>, Vec<_>) = [&mut a, &mut b, &mut c]
        .into_iter()
        .partition(|x| Some(x.pid() as u64) == first["pid"].as_u64());
    let dead = dead.into_iter().next().expect("the leader is one of ours");
    dead.signal(libc::SIGKILL);
    let killed = Instant::now();
    let second =
        wait_leader(&m, "el", e1, Duration::from_secs(10)).expect("no new leader after kill -9");
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "handover after kill -9 took {took:?}"
    );
    assert_ne!(second["id"], first["id"]);
    // The dead leader's command died with it (parent-death signal).
    assert!(
        wait_until(Duration::from_secs(5), || old.gone()),
        "the killed leader's command lives on"
    );
    let h = history(&m, "el");
    let expired = events(&h, "expired");
    assert!(
        expired.iter().any(|e| e["epoch"].as_u64() == Some(e1)
            && e["who"] == first["id"]
            && e["why"].as_str().unwrap_or("").contains("gone")),
        "{h:#?}"
    );
    let e2 = second["epoch"].as_u64().expect("epoch");
    assert!(wait_until(Duration::from_secs(10), || journal(&m)
        .iter()
        .any(|l| l.0 == e2)));
    let mut rest = rest;
    stop_all(&mut rest);
    dead.wait(Duration::from_secs(5));
    check_terms(&history(&m, "el"), &journal(&m));
}

#[test]
fn a_stopped_leader_is_preempted_after_the_soft_limit_and_fenced() {
    let m = Mount::with_o(MOUNT_O);
    m.sh_ok("mkdir own");
    let status_path = m.dir.path().join("status");
    let status = status_path.display().to_string();
    let own = m.path("own").display().to_string();
    let cmd = journal_command(&m, &status, Some(&own));
    let mut a = Candidate::spawn(&m, "el", "a", &[], &strs(&cmd));
    let mut b = Candidate::spawn(&m, "el", "b", &[], &strs(&cmd));
    let mut c = Candidate::spawn(&m, "el", "c", &[], &strs(&cmd));
    let first = wait_leader(&m, "el", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", logs(&[&a, &b, &c])));
    let e1 = first["epoch"].as_u64().expect("epoch");
    let id1 = first["id"].as_str().expect("id").to_string();
    assert!(wait_until(Duration::from_secs(10), || journal(&m)
        .iter()
        .filter(|l| l.0 == e1)
        .count()
        >= 2));

    // Freeze the leader and its command mid-term.
    let group = Group(pgid_of(&first));
    let cands = [&mut a, &mut b, &mut c];
    let (stopped, mut rest): (Vec<_>, Vec<_>) = cands
        .into_iter()
        .partition(|x| Some(x.pid() as u64) == first["pid"].as_u64());
    let old = stopped
        .into_iter()
        .next()
        .expect("the leader is one of ours");
    old.signal(libc::SIGSTOP);
    group.signal(libc::SIGSTOP);
    let frozen = Instant::now();

    // Its lease was renewed at most 500 ms before: nobody takes over for
    // another 1.5 s.
    holds_for(
        Duration::from_millis(1000),
        "the stopped leader's term (not preempted before the soft limit)",
        || m.epoch("el/LEADER") == e1,
    );
    let second = wait_leader(&m, "el", e1, Duration::from_secs(8))
        .expect("no new leader after the soft limit");
    let took = frozen.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "taken over after only {took:?}"
    );
    let e2 = second["epoch"].as_u64().expect("epoch");
    assert_ne!(second["id"].as_str(), Some(id1.as_str()));
    let h = history(&m, "el");
    let preempted = events(&h, "preempted");
    assert!(
        preempted
            .iter()
            .any(|e| e["epoch"].as_u64() == Some(e1) && e["who"] == id1.as_str()),
        "no preempted event for epoch {e1}: {h:#?}"
    );

    // The old command, frozen with its elector, cannot be stopped by it:
    // the daemon kills it, the term being over. Its write through the
    // file it held open all term never happens, and the file it held (the
    // journal, maybe) is closed, so the new command can write.
    assert!(
        wait_until(Duration::from_secs(5), || !group_alive(group.0)),
        "the old command lives on after its term ended\n{}",
        m.log()
    );
    let status = std::fs::read_to_string(&status_path).unwrap_or_default();
    assert!(
        !status.lines().any(|l| l.starts_with(&format!("{e1} "))),
        "the old command acted after its term: {status}"
    );
    assert!(wait_until(Duration::from_secs(10), || journal(&m)
        .iter()
        .any(|l| l.0 == e2)));
    // Then its elector: it notices the loss, stops the command's group and
    // follows again.
    old.signal(libc::SIGCONT);
    let lost = wait_until(Duration::from_secs(5), || {
        events(&history(&m, "el"), "lost").iter().any(|e| {
            e["epoch"].as_u64() == Some(e1) && e["why"].as_str().unwrap_or("").contains("fenced")
        })
    });
    assert!(
        lost,
        "the old leader did not record its loss\n{}",
        old.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || group.gone()),
        "the old command's group lives on"
    );
    assert!(
        old.wait(Duration::from_millis(300)).is_none(),
        "the old leader exited instead of following"
    );
    assert_eq!(
        leader(&m, "el").map(|r| r["epoch"].clone()),
        Some(second["epoch"].clone())
    );

    // Nothing of the old term after the new term's first line.
    let lines = journal(&m);
    let first_new = lines
        .iter()
        .position(|l| l.0 == e2)
        .expect("new epoch in journal");
    assert!(!lines[first_new..].iter().any(|l| l.0 == e1), "{lines:?}");
    rest.push(old);
    stop_all(&mut rest);
    check_terms(&history(&m, "el"), &journal(&m));
}

#[test]
fn a_leader_that_misses_its_renew_deadline_steps_down_and_competes_again() {
    let m = Mount::with_o(MOUNT_O);
    let mut a = Candidate::spawn(&m, "solo", "a", &[], &["sleep", "60"]);
    let first = wait_leader(&m, "solo", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", a.log()));
    let e1 = first["epoch"].as_u64().expect("epoch");
    let group = Group(pgid_of(&first));
    // Stopped past the renew deadline (1.33 s): nobody competes, so the
    // lease is not taken, but the leader must not trust it any more. Only
    // time puts a leader past its deadline.
    a.signal(libc::SIGSTOP);
    let_time_pass(Duration::from_millis(1600));
    a.signal(libc::SIGCONT);
    let second = wait_leader(&m, "solo", e1, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("not re-elected\n{}", a.log()));
    assert!(group.gone(), "the command of the lost term still runs");
    let e2 = second["epoch"].as_u64().expect("epoch");
    // The term's record comes before its `elected`.
    let mut h = Vec::new();
    wait_until(Duration::from_secs(10), || {
        h = history(&m, "solo");
        events(&h, "elected")
            .last()
            .and_then(|e| e["epoch"].as_u64())
            == Some(e2)
    });
    let lost = events(&h, "lost");
    assert_eq!(lost.len(), 1, "{h:#?}");
    let why = lost[0]["why"].as_str().unwrap_or("");
    assert!(
        why.contains("renew deadline missed") && !why.contains("fenced"),
        "{why}"
    );
    let elected = events(&h, "elected");
    assert_eq!(elected.last().and_then(|e| e["epoch"].as_u64()), Some(e2));
    assert!(
        elected
            .last()
            .and_then(|e| e["why"].as_str())
            .is_some_and(|w| w.contains("lost")),
        "{h:#?}"
    );
    stop_all(&mut [&mut a]);
    check_terms(&history(&m, "solo"), &[]);
}

#[test]
fn the_leader_resigns_when_its_command_exits_and_the_audit_table_is_queryable() {
    let m = Mount::with_o(MOUNT_O);
    let out = m.dir.path().join("env");
    let script = format!(
        "echo \"$LEASEFS_EPOCH $LEASEFS_ID $LEASEFS_ELECTION\" > {}; exit 3",
        out.display()
    );
    let mut once = Candidate::spawn(&m, "jobs", "once", &["--once"], &["sh", "-c", &script]);
    let st = once
        .wait(Duration::from_secs(15))
        .expect("--once did not exit");
    assert_eq!(st.code(), Some(3), "{}", once.log());
    let env = std::fs::read_to_string(&out).expect("the command ran");
    let f: Vec<&str> = env.split_whitespace().collect();
    let epoch: u64 = f[0].parse().expect("LEASEFS_EPOCH");
    assert_eq!(f[1], "once");
    assert_eq!(
        Path::new(f[2]),
        std::fs::canonicalize(m.path("jobs")).expect("dir")
    );
    let rec: Value =
        serde_json::from_str(m.read_string("jobs/LEADER").lines().last().expect("record"))
            .expect("JSON");
    assert_eq!(rec["id"], "once");
    assert_eq!(rec["epoch"], epoch);
    assert_eq!(rec["host"], hostname());
    assert_eq!(rec["pid"], once.pid());
    assert!(
        rec["time_ms"]
            .as_u64()
            .is_some_and(|t| t > 1_600_000_000_000),
        "{rec}"
    );

    // The lease went on at once: the next candidate (no command) leads at
    // once, until SIGTERM makes it resign and exit 0.
    let mut idle = Candidate::spawn(&m, "jobs", "idle", &[], &[]);
    let second = wait_leader(&m, "jobs", epoch, Duration::from_secs(10)).expect("no second leader");
    assert_eq!(second["id"], "idle");
    stop_all(&mut [&mut idle]);
    assert_eq!(m.lease_state("jobs/LEADER"), "free");

    let h = history(&m, "jobs");
    let kinds: Vec<(&str, &str)> = h
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or(""),
                e["who"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("elected", "once"),
            ("resigned", "once"),
            ("elected", "idle"),
            ("resigned", "idle")
        ],
        "{h:#?}"
    );
    assert_eq!(h[1]["epoch"], epoch);
    assert!(
        h[1]["why"].as_str().unwrap_or("").contains("exit status 3"),
        "{h:#?}"
    );
    assert!(
        h[2]["why"].as_str().unwrap_or("").contains("once (epoch"),
        "{h:#?}"
    );
    assert!(
        h[3]["why"].as_str().unwrap_or("").contains("asked to stop"),
        "{h:#?}"
    );

    // The table for people: one line per event.
    let dir = m.path("jobs");
    let o = m.leasefs(&["elect", dir.to_str().expect("utf-8"), "--history"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{text}");
    assert!(
        rows[1].contains("resigned") && rows[1].contains(&format!("{}:{}", hostname(), once.pid())),
        "{text}"
    );
    // And for the sqlite3 shell, in the data directory (on the SQLite
    // backend; over etcd the table is the one `--history` showed).
    if etcd_backend() {
    } else if let Ok(o) = Command::new("sqlite3")
        .arg(m.data.join("meta.db"))
        .arg("SELECT event, who, epoch FROM election_audit WHERE election = '/jobs' ORDER BY id")
        .output()
    {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            rows.starts_with(&format!("elected|once|{epoch}\nresigned|once|{epoch}\n")),
            "{rows}"
        );
    }

    // Bad use is one line and exit 2.
    let o = m.leasefs(&["elect", "/", "--id", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).lines().count(),
        1,
        "{o:?}"
    );
    let o = m.leasefs(&[
        "elect",
        dir.to_str().expect("utf-8"),
        "--id",
        "x",
        "--lease-ms",
        "2000",
        "--renew-ms",
        "5000",
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    // A lease longer than the mount's soft limit would let a leader outlive it.
    let o = m.leasefs(&[
        "elect",
        dir.to_str().expect("utf-8"),
        "--id",
        "x",
        "--lease-ms",
        "5000",
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("soft limit"),
        "{o:?}"
    );
}

#[test]
fn a_churn_of_a_hundred_leadership_changes_never_overlaps() {
    let m = Mount::with_o(MOUNT_O);
    let script = "echo \"$LEASEFS_EPOCH $LEASEFS_ID\" >> journal && sleep 0.02 && echo \"$LEASEFS_EPOCH $LEASEFS_ID\" >> journal";
    let ids = ["w", "x", "y", "z"];
    let mut cands: Vec<Candidate> = ids
        .iter()
        .map(|id| {
            Candidate::spawn(
                &m,
                "churn",
                id,
                &["--retry-ms", "50"],
                &["sh", "-c", script],
            )
        })
        .collect();
    let started = Instant::now();
    let changes = |h: &[Value]| {
        let who: Vec<&Value> = events(h, "elected")
            .into_iter()
            .map(|e| &e["who"])
            .collect();
        who.windows(2).filter(|w| w[0] != w[1]).count()
    };
    let mut last = 0;
    // Looked at twice a second: each look runs `leasefs elect --history`.
    let enough = poll_until(Duration::from_secs(90), Duration::from_millis(500), || {
        assert!(
            cands
                .iter_mut()
                .all(|c| matches!(c.child.try_wait(), Ok(None))),
            "an elector exited\n{}",
            logs(&cands.iter().collect::<Vec<_>>())
        );
        last = changes(&history(&m, "churn"));
        last >= 100
    });
    let refs: Vec<&Candidate> = cands.iter().collect();
    assert!(
        enough,
        "only {last} leadership changes in {:?}\n{}",
        started.elapsed(),
        logs(&refs)
    );
    let mut all: Vec<&mut Candidate> = cands.iter_mut().collect();
    stop_all(&mut all);
    let h = history(&m, "churn");
    let lines = journal(&m);
    assert!(lines.len() >= 100, "{} journal lines", lines.len());
    check_terms(&h, &lines);
    // Everyone led at some point.
    for id in ids {
        assert!(
            events(&h, "elected").iter().any(|e| e["who"] == id),
            "{id} never led"
        );
    }
    eprintln!(
        "{} leadership changes in {:?}",
        changes(&h),
        started.elapsed()
    );
}

/// A process the test's command started outside the test's reach (a
/// grandchild): killed on drop if it outlives the test.
struct Stray(u32);

impl Drop for Stray {
    fn drop(&mut self) {
        if alive(self.0) {
            kill(self.0, libc::SIGCONT);
            kill(self.0, libc::SIGKILL);
        }
    }
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The old term stops acting, all of it: a leader's command leaves a
/// background child that deletes a flag and makes directories on the
/// mount, and another that leaves the command's session (`setsid`). The
/// elector is killed with -9 (its command dies with it, the grandchildren
/// do not). Once the next leader is elected, the flag stays, no directory
/// is made, and both grandchildren are gone: the first at least once its
/// term ended (fenced, then killed by the daemon), the one that left the
/// session too when the command ran in a cgroup of its own.
#[test]
fn a_killed_leaders_grandchildren_cannot_act_in_the_next_term() {
    let m = Mount::with_o(MOUNT_O);
    m.sh_ok("mkdir made");
    let out = m.dir.path().join("gc");
    std::fs::create_dir(&out).expect("mkdir gc");
    let (mnt, o) = (m.mnt.display(), out.display());
    let script = format!(
        "(n=0; while :; do n=$((n+1)); rm -f {mnt}/flag 2>/dev/null; \
         mkdir {mnt}/made/$LEASEFS_EPOCH-$n 2>/dev/null; echo t >> {o}/ticks; sleep 0.1; done) &
         echo $! > {o}/child.pid
         setsid sh -c 'echo $$ > {o}/escaped.pid; while :; do echo t >> {o}/esc; sleep 0.1; done' &
         wait"
    );
    let mut a = Candidate::spawn(&m, "el", "a", &[], &["sh", "-c", &script]);
    let first = wait_leader(&m, "el", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", a.log()));
    let e1 = first["epoch"].as_u64().expect("epoch");
    let cgroup = first["cgroup"].as_str().is_some();
    assert!(
        wait_until(Duration::from_secs(10), || count_lines(&out.join("ticks"))
            >= 2
            && read_pid(&out.join("escaped.pid")).is_some()),
        "the grandchildren did not start\n{}",
        a.log()
    );
    let child = Stray(read_pid(&out.join("child.pid")).expect("child pid"));
    let escaped = Stray(read_pid(&out.join("escaped.pid")).expect("escaped pid"));
    let mut b = Candidate::spawn(&m, "el", "b", &[], &["sleep", "600"]);

    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    let second = wait_leader(&m, "el", e1, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no second leader\n{}", b.log()));
    assert_eq!(second["id"], "b");
    std::fs::write(m.path("flag"), "").expect("create the flag");
    let made = names_in_dir(&m.path("made"));
    // Give the old term's loop time for a few more rounds, if it lives.
    let ticks = count_lines(&out.join("ticks"));
    wait_until(Duration::from_secs(5), || {
        !alive(child.0) || count_lines(&out.join("ticks")) >= ticks + 5
    });
    assert!(
        m.path("flag").exists(),
        "the old term's grandchild deleted the flag after term {} began",
        second["epoch"]
    );
    assert_eq!(
        names_in_dir(&m.path("made")),
        made,
        "the old term made directories after the new term began"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !alive(child.0)),
        "the old term's grandchild lives on\n{}",
        m.log()
    );
    if cgroup {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(escaped.0)),
            "the grandchild that left the session lives on, though in the term's cgroup"
        );
    } else {
        eprintln!("no cgroup for the command: a process that leaves its session escapes");
    }
    stop_all(&mut [&mut b]);
    let h = history(&m, "el");
    assert!(
        events(&h, "expired")
            .iter()
            .any(|e| e["epoch"].as_u64() == Some(e1)),
        "{h:#?}"
    );
}

fn names_in_dir(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Fences outlive the daemon: the leader's elector is frozen (it cannot
/// stop its command), the daemon is killed with -9 and mounted again, and
/// a new candidate wins at once. The old command, which goes on appending
/// to the journal through fresh opens of the new mount, is refused (and
/// stopped) by the restarted daemon: no line of the old epoch follows the
/// new epoch's first line.
#[test]
fn a_restarted_daemon_still_fences_the_old_terms_command() {
    let mut m = Mount::with_o(MOUNT_O);
    // The journal sits in a directory of the mount: while the daemon is
    // down, the old command's appends fail instead of creating a file in
    // the bare mountpoint (which the next mount would refuse as not empty).
    std::fs::create_dir(m.path("j")).expect("mkdir j");
    let script = format!(
        "while :; do echo \"$LEASEFS_EPOCH $LEASEFS_ID\" >> {} 2>/dev/null; sleep 0.05; done",
        m.path("j/journal").display()
    );
    let mut a = Candidate::spawn(&m, "el", "a", &[], &["sh", "-c", &script]);
    let first = wait_leader(&m, "el", 0, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader\n{}", a.log()));
    let e1 = first["epoch"].as_u64().expect("epoch");
    let group = Group(pgid_of(&first));
    assert!(wait_until(Duration::from_secs(10), || journal_at(
        &m,
        "j/journal"
    )
    .iter()
    .filter(|l| l.0 == e1)
    .count()
        >= 3));
    a.signal(libc::SIGSTOP);
    m.crash();
    m.mount();
    let mut b = Candidate::spawn(&m, "el", "b", &[], &["sh", "-c", &script]);
    let second = wait_leader(&m, "el", e1, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no leader after the restart\n{}\n{}", b.log(), m.log()));
    let e2 = second["epoch"].as_u64().expect("epoch");
    assert!(
        wait_until(Duration::from_secs(10), || journal_at(&m, "j/journal")
            .iter()
            .filter(|l| l.0 == e2)
            .count()
            >= 20),
        "the new term does not write\n{}",
        b.log()
    );
    let lines = journal_at(&m, "j/journal");
    let first_new = lines.iter().position(|l| l.0 == e2).expect("new epoch");
    let late: Vec<_> = lines[first_new..].iter().filter(|l| l.0 == e1).collect();
    assert!(
        late.is_empty(),
        "the old term wrote {} line(s) after the new term began\n{}",
        late.len(),
        m.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || !group_alive(group.0)),
        "the old term's command lives on after the restart"
    );
    a.signal(libc::SIGCONT);
    stop_all(&mut [&mut a, &mut b]);
}

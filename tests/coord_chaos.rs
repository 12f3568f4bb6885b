//! Chaos runs of the coordination commands, long enough to meet the rare
//! interleavings. This suite runs once (it is not in the etcd pass of
//! `mount-scripts/test.sh`): the election churn sets up its own etcd and
//! daemons, the spout run a plain mount.
//!
//! - Elections: three electors, one per daemon, over one etcd; 200
//!   handovers (`LEASEFS_CHURN_HANDOVERS`) by kill -9 of the leader,
//!   SIGSTOP of the leader, kill -9 and restart of the leader's daemon, and
//!   a partition (etcd stopped past the soft limit). Every leader's command
//!   is a process tree that writes, renames and deletes on the mount and
//!   notes each action in a journal: the journal shows terms in strictly
//!   increasing epoch order, no action of an old term after a newer term's
//!   first one, and the audit table a start and an end for every term.
//! - Spouts: four instances over 200 files, their consumers dying,
//!   buffering, exiting early or killed, the instances killed with -9 and
//!   stopped with SIGSTOP: every line reaches a consumer at least once, and
//!   every file ends in done with every line delivered.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::elect::{Candidate, events, history, is_end};
use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::spout::{Inst, lines_of, names_in, publish, setup};
use common::*;
use serde_json::Value;

// ---- elections ---------------------------------------------------------------

const ELECT_O: &str = "soft_limit=1,monitor_interval=0.2";

fn handovers() -> usize {
    std::env::var("LEASEFS_CHURN_HANDOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// A leader's command: a background child renames and deletes a file of
/// the term, the command itself writes; each action that succeeded is
/// noted in the journal (`EPOCH ID ACTION`), itself an append on the mount.
/// Everything is under directories of the mount (`j`, `w`), so that while
/// its daemon is down nothing lands in the bare mountpoint.
fn term_command(mnt: &Path) -> Vec<String> {
    let m = mnt.display();
    let script = format!(
        "E=$LEASEFS_EPOCH; I=$LEASEFS_ID; D={m}/w/$E
         act() {{ echo \"$E $I $1\" >> {m}/j/journal 2>/dev/null; }}
         mkdir $D 2>/dev/null
         (while :; do echo x > $D/a 2>/dev/null && mv $D/a $D/b 2>/dev/null && act r
                      rm -f $D/b 2>/dev/null && act d; sleep 0.02; done) &
         while :; do act w; sleep 0.02; done"
    );
    vec!["sh".into(), "-c".into(), script]
}

/// One daemon and its elector.
struct Site {
    m: Mount,
    id: String,
    cand: Option<Candidate>,
}

impl Site {
    fn spawn(&mut self) {
        let cmd = term_command(&self.m.mnt);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.cand = Some(Candidate::spawn(
            &self.m,
            "el",
            &self.id,
            &["--retry-ms", "50"],
            &cmd,
        ));
    }

    fn pid(&self) -> Option<u32> {
        self.cand.as_ref().map(Candidate::pid)
    }
}

/// (epoch, elector pid) of the term the election file's lease is held at,
/// as daemon `m` shows it.
fn leader_of(m: &Mount) -> Option<(u64, u32)> {
    let lease: Value =
        serde_json::from_str(m.xattr("el/LEADER", "user.leasefs.lease")?.trim()).ok()?;
    if lease["state"] != "held" {
        return None;
    }
    let text = std::fs::read_to_string(m.path("el/LEADER")).ok()?;
    let rec: Value = serde_json::from_str(text.lines().last()?).ok()?;
    let epoch = rec["epoch"].as_u64()?;
    // Over etcd the lease shows the holder's daemon, not the epoch.
    (lease["epoch"].as_u64() == Some(epoch) || lease["daemon"].is_string())
        .then_some((epoch, rec["pid"].as_u64()? as u32))
}

fn any_leader(sites: &[Site]) -> Option<(u64, u32)> {
    sites.iter().filter_map(|s| leader_of(&s.m)).max()
}

/// The journal's complete lines: (epoch, id, action).
fn journal_of(m: &Mount) -> Vec<(u64, String, String)> {
    let text = std::fs::read(m.path("j/journal"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((
                f.next()?.parse().ok()?,
                f.next()?.to_string(),
                f.next()?.to_string(),
            ))
        })
        .collect()
}

/// etcd stopped by the test; continued on drop, in every path.
struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

#[test]
fn election_churn_with_kills_stops_restarts_and_a_partition() {
    let want = handovers();
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let mut sites: Vec<Site> = ["a", "b", "c"]
        .iter()
        .map(|id| Site {
            m: daemon(&etcd, "churn", &dns, &[ELECT_O]),
            id: id.to_string(),
            cand: None,
        })
        .collect();
    for d in ["w", "j"] {
        std::fs::create_dir(sites[0].m.path(d)).expect("mkdir");
    }
    for s in sites.iter_mut() {
        s.spawn();
    }
    let started = Instant::now();
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut last = 0;
    let mut respawned = 0;
    let mut stopped: Option<u32> = None;
    let mut changes = 0;
    loop {
        // Electors that exited (an election directory gone while their
        // daemon restarted) come back; a stopped one resumes.
        for s in sites.iter_mut() {
            if s.cand
                .as_mut()
                .is_none_or(|c| c.wait(Duration::ZERO).is_some())
            {
                s.spawn();
                respawned += 1;
            }
        }
        let mut cur = None;
        wait_until(Duration::from_secs(30), || {
            cur = any_leader(&sites).filter(|l| l.0 > last);
            cur.is_some()
        });
        let (epoch, pid) = cur.unwrap_or_else(|| {
            panic!(
                "no new leader after epoch {last} ({changes} handovers)\n{}",
                sites
                    .iter()
                    .map(|s| format!(
                        "--- {} ---\n{}",
                        s.id,
                        s.cand.as_ref().map(Candidate::log).unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        });
        if last != 0 {
            changes += 1;
        }
        last = epoch;
        if let Some(p) = stopped.take() {
            kill(p, libc::SIGCONT);
        }
        if changes >= want {
            break;
        }
        // Let the term act: a few of its actions in the journal.
        wait_until(Duration::from_secs(3), || {
            journal_of(&sites[0].m)
                .iter()
                .rev()
                .take(20)
                .filter(|l| l.0 == epoch)
                .count()
                >= 3
        });
        let Some(i) = sites.iter().position(|s| s.pid() == Some(pid)) else {
            continue; // an elector that just exited led; the next round sees
        };
        let action = match changes % 50 {
            13 => "partition",
            7 | 37 => "restart",
            3 | 21 | 43 => "sigstop",
            _ => "kill",
        };
        *tally.entry(action).or_default() += 1;
        match action {
            "kill" => {
                if let Some(c) = sites[i].cand.as_mut() {
                    c.signal(libc::SIGKILL);
                    c.wait(Duration::from_secs(5));
                }
            }
            "sigstop" => {
                kill(pid, libc::SIGSTOP);
                stopped = Some(pid);
            }
            "restart" => {
                sites[i].m.crash();
                let m = &mut sites[i].m;
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.mount())).is_err() {
                    panic!("remount failed\n{}", m.log());
                }
            }
            _ => {
                let frozen = Frozen(etcd.pid());
                kill(etcd.pid(), libc::SIGSTOP);
                // A partition is a length of time: past the renew deadline.
                let_time_pass(Duration::from_millis(1600));
                drop(frozen);
            }
        }
    }
    if let Some(p) = stopped.take() {
        kill(p, libc::SIGCONT);
    }
    let took = started.elapsed();
    for s in &sites {
        if let Some(c) = &s.cand {
            c.signal(libc::SIGTERM);
        }
    }
    for s in sites.iter_mut() {
        if let Some(c) = s.cand.as_mut() {
            assert!(
                c.wait(Duration::from_secs(15)).is_some(),
                "elector {} did not stop\n{}",
                s.id,
                c.log()
            );
        }
    }

    // The audit table: terms in increasing epoch order, each with a start
    // and an end.
    let m0 = &sites[0].m;
    let h = history(m0, "el");
    let elected = events(&h, "elected");
    let mut by_epoch: HashMap<u64, String> = HashMap::new();
    let mut prev = 0;
    for e in &elected {
        let epoch = e["epoch"].as_u64().expect("epoch");
        assert!(epoch > prev, "terms out of order: {epoch} after {prev}");
        prev = epoch;
        by_epoch.insert(epoch, e["who"].as_str().unwrap_or("").to_string());
    }
    let ended: HashSet<u64> = h
        .iter()
        .filter(|e| is_end(e))
        .filter_map(|e| e["epoch"].as_u64())
        .collect();
    let open: Vec<&u64> = by_epoch.keys().filter(|e| !ended.contains(e)).collect();
    assert!(
        open.is_empty(),
        "terms without an end: {open:?}\n{:#?}",
        &h[h.len().saturating_sub(12)..]
    );
    assert!(
        elected.len() > want,
        "{} terms for {want} handovers",
        elected.len()
    );

    // The journal: terms in increasing epoch order, nothing of an old term
    // after a newer one's first action, every term's actions its leader's.
    let lines = journal_of(m0);
    let mut prev = 0;
    for (i, (epoch, id, what)) in lines.iter().enumerate() {
        assert!(
            *epoch >= prev,
            "journal line {i}: `{epoch} {id} {what}` after epoch {prev}"
        );
        prev = *epoch;
        assert_eq!(
            by_epoch.get(epoch).map(String::as_str),
            Some(id.as_str()),
            "journal line {i}: epoch {epoch} by {id}, not its elected leader"
        );
    }
    let terms: HashSet<u64> = lines.iter().map(|l| l.0).collect();
    let kinds: HashSet<&str> = lines.iter().map(|l| l.2.as_str()).collect();
    assert!(
        kinds.contains("r") && kinds.contains("d") && kinds.contains("w"),
        "{kinds:?}"
    );
    eprintln!(
        "{changes} handovers in {took:?} ({tally:?}; {respawned} electors respawned); {} terms, {} acted in the journal ({} lines)",
        elected.len(),
        terms.len(),
        lines.len()
    );
}

// ---- spouts -----------------------------------------------------------------

/// A consumer for one file, chosen at random: most take every line (some
/// after a pause, so that the chaos meets instances in the middle of
/// files); some die after a few, some buffer everything and write only at
/// the end (and may be killed before), some stop reading early, some
/// acknowledge as they go. What a consumer wrote to its output file was
/// delivered.
fn consumer(out: &Path) -> String {
    let o = out.display();
    format!(
        "f={o}/$(od -An -N4 -tu4 /dev/urandom | tr -d ' ').$$
         echo $$ > $f.pid
         case $(( $(od -An -N1 -tu1 /dev/urandom) % 10 )) in
           0) head -n 5 > $f; exit 1 ;;
           1) n=0; while IFS= read -r l; do printf '%s\\n' \"$l\" >> $f; n=$((n+1));
                [ $n -ge 7 ] && exit 0; done ;;
           2) sort > $f.tmp && mv $f.tmp $f ;;
           3) n=0; while IFS= read -r l; do printf '%s\\n' \"$l\" >> $f; n=$((n+1));
                echo $n >&3; done ;;
           4|5) sleep 1; cat > $f ;;
           *) cat > $f ;;
         esac"
    )
}

/// Every line the consumers delivered (their finished output files).
fn delivered(out: &Path) -> HashSet<String> {
    let mut all = HashSet::new();
    for e in std::fs::read_dir(out).expect("out dir").flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.ends_with(".tmp") || n.ends_with(".pid") {
            continue;
        }
        if let Ok(t) = std::fs::read_to_string(e.path()) {
            all.extend(t.lines().map(str::to_string));
        }
    }
    all
}

/// Consumers still running (by the pid files they left).
fn consumers(out: &Path) -> Vec<u32> {
    std::fs::read_dir(out)
        .expect("out dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pid"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .filter(|p| alive(*p))
        .collect()
}

#[test]
fn spout_chaos_every_line_reaches_a_consumer() {
    let m = Mount::with_o("soft_limit=1,monitor_interval=0.2");
    setup(&m);
    let out = m.dir.path().join("delivered");
    std::fs::create_dir(&out).expect("mkdir out");
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..200 {
        let name = format!("f{i:03}");
        let n = 50 + (i * 97) % 1500;
        files.insert(name.clone(), lines_of(&name, n));
        publish(&m, &name, &files[&name]);
    }
    let cmd = consumer(&out);
    let args = [
        "--exec",
        cmd.as_str(),
        "--lock-timeout",
        "1",
        // Its consumers sleep before reading: not stalled ones.
        "--progress-timeout",
        "10",
        "--commit-count",
        "20",
        "--commit-sec",
        "0.2",
        "--renew-ms",
        "250",
    ];
    let mut seq = 0;
    let mut spawn = |m: &Mount| {
        seq += 1;
        Inst::spawn(m, &format!("s{seq}"), &args)
    };
    let mut insts: Vec<Inst> = (0..4).map(|_| spawn(&m)).collect();
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let started = Instant::now();
    let mut round = 0u64;
    let mut stopped: Vec<(usize, Instant)> = Vec::new();
    while names_in(&m, "done").len() < files.len() && started.elapsed() < Duration::from_secs(60) {
        round += 1;
        // One chaos action every 150 ms: the rounds are paced in time.
        let_time_pass(Duration::from_millis(150));
        // Resume instances stopped for longer than the soft limit.
        stopped.retain(|(i, at)| {
            if at.elapsed() > Duration::from_millis(1500) {
                insts[*i].signal(libc::SIGCONT);
                false
            } else {
                true
            }
        });
        // Instances that exited (their consumer failed) come back.
        for inst in insts.iter_mut() {
            if matches!(inst.child.try_wait(), Ok(Some(_))) {
                *tally.entry("respawned").or_default() += 1;
                *inst = spawn(&m);
            }
        }
        let i = (round as usize * 7) % insts.len();
        match round % 6 {
            1 | 4 => {
                insts[i].signal(libc::SIGKILL);
                *tally.entry("kill -9").or_default() += 1;
            }
            2 if !stopped.iter().any(|(s, _)| *s == i) => {
                insts[i].signal(libc::SIGSTOP);
                stopped.push((i, Instant::now()));
                *tally.entry("sigstop").or_default() += 1;
            }
            3 | 5 => {
                if let Some(p) = consumers(&out).first() {
                    kill(*p, libc::SIGKILL);
                    *tally.entry("consumer killed").or_default() += 1;
                }
            }
            _ => {}
        }
    }
    let chaos = started.elapsed();
    for (i, _) in stopped.drain(..) {
        insts[i].signal(libc::SIGCONT);
    }
    // What is left: instances with consumers that take everything finish it.
    for i in insts.iter() {
        i.signal(libc::SIGTERM);
    }
    for i in insts.iter_mut() {
        i.wait(Duration::from_secs(30));
    }
    let all_in = format!("cat > {}/final.$$", out.display());
    let mut last: Vec<Inst> = (0..2)
        .map(|k| {
            Inst::spawn(
                &m,
                &format!("final{k}"),
                &[
                    "--exec",
                    &all_in,
                    "--lock-timeout",
                    "1",
                    "--renew-ms",
                    "250",
                    "--once",
                ],
            )
        })
        .collect();
    for i in last.iter_mut() {
        i.wait_ok(Duration::from_secs(120));
    }

    assert_eq!(
        names_in(&m, "done").len(),
        files.len(),
        "not every file is done: {:?}",
        names_in(&m, "in")
    );
    assert!(names_in(&m, "in/.bad").is_empty());
    assert!(
        names_in(&m, "in/.lock").is_empty(),
        "{:?}",
        names_in(&m, "in/.lock")
    );
    let got = delivered(&out);
    let mut missing = 0;
    for (name, lines) in &files {
        let done = m.read_string(&format!("done/{name}"));
        assert_eq!(done.lines().count(), lines.len(), "done/{name} changed");
        for l in lines {
            if !got.contains(l) {
                missing += 1;
                if missing < 5 {
                    eprintln!("{name}: `{l}` never reached a consumer");
                }
            }
        }
    }
    assert_eq!(missing, 0, "lines of files in done never delivered");
    let total: usize = files.values().map(Vec::len).sum();
    eprintln!(
        "{total} lines of {} files delivered; chaos {chaos:?} ({round} rounds: {tally:?})",
        files.len()
    );
}

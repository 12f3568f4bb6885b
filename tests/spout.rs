//! `leasefs spout` (docs/SEMANTICS.md "Spout") with real processes on a real
//! mount (`soft_limit=2`, so a stopped instance's leases expire in 2 s, and
//! `--lock-timeout 3`): several instances on many files, one killed with
//! -9 and one stopped with SIGSTOP mid-file; every line emitted at least
//! once, duplicates only after takeover points, every file done, no lock
//! left; Storm's empty-lock-file crash (STORM-2356); `.ignore` files;
//! bad files; `--exec`; clean stop on SIGTERM and SIGINT; the writers' two safe ways
//! to publish a file.

mod common;
use common::spout::*;
use common::*;

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

const MOUNT_O: &str = "soft_limit=2,monitor_interval=0.2";

/// Item 7 of the issue: 4 instances, 2 big files and 120 small ones; one
/// instance is killed with -9 in the middle of a big file, another is
/// stopped in the middle of the other big file and resumed after its file
/// was taken over.
#[test]
fn instances_killed_and_stopped_mid_file_lose_no_line() {
    const BIG: usize = 300_000;
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in ["big-a", "big-b"] {
        files.insert(name.into(), lines_of(name, BIG));
        publish(&m, name, &files[name]);
    }
    for i in 0..120 {
        let name = format!("small-{i:03}");
        files.insert(name.clone(), lines_of(&name, 40 + i));
        publish(&m, &name, &files[&name]);
    }
    let common_args = [
        "--lock-timeout",
        "3",
        "--commit-count",
        "5000",
        "--commit-sec",
        "1",
        "--once",
    ];

    // Commits every 5000 records (70 KB) while output is flushed every
    // 64 KiB into a slowly read pipe: a killed or stopped owner has usually
    // emitted records past its last commit, which its successor emits
    // again. The victim of kill -9 takes the oldest file, big-a.
    let mut killed = Inst::spawn_slow(&m, "killed", &common_args, 1024);
    let committed = wait_committed(&m, "in/.lock/big-a", "killed");
    killed.signal(libc::SIGSTOP);
    assert!(
        m.path("in/big-a.inprogress").exists(),
        "big-a is not in progress"
    );
    killed.signal(libc::SIGKILL);
    killed.wait(Duration::from_secs(10));
    let (_, killed_at) = last_entry(&m, "in/.lock/big-a").expect("big-a's lock entry");
    assert!(
        killed_at >= committed && (killed_at as usize) < BIG * 14,
        "killed at {killed_at}"
    );

    // The one to be stopped takes the next oldest, big-b.
    let mut stopped = Inst::spawn_slow(&m, "stopped", &common_args, 1024);
    wait_committed(&m, "in/.lock/big-b", "stopped");
    stopped.signal(libc::SIGSTOP);
    assert!(
        m.path("in/big-b.inprogress").exists(),
        "big-b is not in progress"
    );
    let (_, stopped_at) = last_entry(&m, "in/.lock/big-b").expect("big-b's lock entry");

    let mut others: Vec<Inst> = ["c1", "c2"]
        .iter()
        .map(|id| Inst::spawn(&m, id, &common_args))
        .collect();

    // big-b is taken over once its lock is idle for 3 s and the stopped
    // owner's lease expired (2 s); then the owner is resumed.
    let taken = wait_until(Duration::from_secs(30), || {
        matches!(last_entry(&m, "in/.lock/big-b"), Some((id, _)) if id != "stopped")
            || m.path("done/big-b").exists()
    });
    assert!(taken, "big-b was never taken over");
    stopped.signal(libc::SIGCONT);

    for i in others.iter_mut().chain([&mut stopped]) {
        i.wait_ok(Duration::from_secs(60));
    }

    // Every file done, nothing left behind.
    let mut want: Vec<String> = files.keys().cloned().collect();
    want.sort();
    assert_eq!(names_in(&m, "done"), want);
    assert_eq!(
        names_in(&m, "in"),
        [".bad", ".lock"],
        "left in the source directory"
    );
    assert!(
        names_in(&m, "in/.lock").is_empty(),
        "lock files left: {:?}",
        names_in(&m, "in/.lock")
    );
    assert!(names_in(&m, "in/.bad").is_empty());
    for (name, lines) in &files {
        let done = m.read_string(&format!("done/{name}"));
        assert_eq!(done.lines().count(), lines.len(), "done/{name} changed");
    }

    // Every line at least once, nothing else.
    let all: Vec<Inst> = vec![killed, stopped].into_iter().chain(others).collect();
    for i in &all[1..] {
        assert_eq!(i.stdout_split().1, None, "{}: torn last line", i.id);
    }
    if let Some(torn) = all[0].stdout_split().1 {
        // kill -9 in the middle of a pipe write: the consumer got part of
        // a line, and the whole line again from the successor.
        assert!(
            files["big-a"].iter().any(|l| l.starts_with(&torn)),
            "`{torn}`"
        );
    }
    let emitted: Vec<String> = all.iter().flat_map(|i| i.stdout_lines()).collect();
    let c = every_line_at_least_once(&emitted, &files);

    // Duplicates only after takeover points, at or after the resumed offset.
    let mut resumed: HashMap<String, Vec<u64>> = HashMap::new();
    for i in &all {
        for (name, off) in i.takeovers() {
            resumed.entry(name).or_default().push(off);
        }
    }
    assert_eq!(
        resumed.get("big-a"),
        Some(&vec![killed_at]),
        "big-a resumed at its last entry"
    );
    let b = resumed.get("big-b").expect("big-b was taken over");
    assert!(
        b.iter().all(|&o| o >= stopped_at),
        "big-b resumed at {b:?}, before {stopped_at}"
    );
    let mut dups = 0;
    for (line, n) in &c {
        if *n > 1 {
            dups += n - 1;
            let (name, off) = line_offset(line);
            let from = resumed.get(&name).and_then(|v| v.iter().min()).copied();
            assert!(
                from.is_some_and(|f| off >= f),
                "`{line}` (offset {off}) emitted {n} times, but {name} was resumed at {from:?}"
            );
        }
    }
    // At-least-once by construction: what big-a's killed owner committed,
    // it had emitted.
    let k = all[0].stdout_lines();
    let k: std::collections::HashSet<&str> = k.iter().map(String::as_str).collect();
    for l in &files["big-a"][..(killed_at as usize / 14)] {
        assert!(
            k.contains(l.as_str()),
            "`{l}` is covered by the killed owner's commit but it never emitted it"
        );
    }
    eprintln!(
        "{} lines emitted, {dups} duplicates, takeovers {resumed:?}",
        emitted.len()
    );
    for i in &all {
        for l in i.stderr().lines().filter(|l| !l.contains(" INFO ")) {
            eprintln!("{}: {l}", i.id);
        }
    }
}

/// Storm's STORM-2356: a lock file left empty (its owner died right after
/// creating it) crashed the spout. Here it is taken over from offset 0, a
/// lock file whose last line was cut short resumes at the last complete
/// entry, and a garbled one from 0. A lock left by an owner that died
/// between moving its file to done and deleting the lock is deleted; a new
/// file of the same name published since is consumed from its start.
#[test]
fn empty_truncated_and_garbled_lock_files_are_taken_over() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let e = lines_of("empty", 5);
    let t = lines_of("trunc", 5);
    let g = lines_of("garbl", 5);
    let r = lines_of("reborn", 5);
    publish(&m, "empty", &e);
    publish(&m, "trunc", &t);
    publish(&m, "garbl", &g);
    publish(&m, "reborn", &r);
    // Owners died after locking: `empty` was not even renamed yet.
    m.sh_ok(
        "mkdir -p in/.lock && mv in/trunc in/trunc.inprogress && mv in/garbl in/garbl.inprogress \
         && : > in/.lock/empty \
         && printf '1000,old,0\\n2000,old,28\\n3000,old,4' > in/.lock/trunc \
         && printf 'x\\0y,,\\n' > in/.lock/garbl \
         && printf '1000,old,0\\n2000,old,75\\n' > in/.lock/reborn \
         && printf '1000,old,0\\n2000,old,75\\n' > in/.lock/finished \
         && touch -d '-1 hour' in/.lock/*",
    );
    let mut s = Inst::spawn(&m, "s", &["--lock-timeout", "3", "--once"]);
    s.wait_ok(Duration::from_secs(30));
    let out = s.stdout_lines();
    let mut want: Vec<String> = e
        .iter()
        .chain(&t[2..])
        .chain(&g)
        .chain(&r)
        .cloned()
        .collect();
    want.sort();
    let mut got = out.clone();
    got.sort();
    assert_eq!(got, want, "stderr:\n{}", s.stderr());
    let mut tk = s.takeovers();
    tk.sort();
    let want_tk = [("empty", 0), ("garbl", 0), ("reborn", 0), ("trunc", 28)];
    assert_eq!(tk, want_tk.map(|(n, o)| (n.to_string(), o)));
    assert!(s.stderr().contains("finished is gone"), "{}", s.stderr());
    assert_eq!(names_in(&m, "done"), ["empty", "garbl", "reborn", "trunc"]);
    assert!(names_in(&m, "in/.lock").is_empty());
}

/// Writers publish `NAME.ignore` and rename it when complete: until then
/// the spout leaves it alone.
#[test]
fn ignore_file_is_skipped_until_renamed() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let x = lines_of("x", 3);
    std::fs::write(m.path("in/x.ignore"), x.join("\n") + "\n").unwrap();
    let mut s = Inst::spawn(&m, "s1", &["--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert!(s.stdout_lines().is_empty());
    assert_eq!(names_in(&m, "in"), [".bad", ".lock", "x.ignore"]);
    std::fs::rename(m.path("in/x.ignore"), m.path("in/x")).unwrap();
    let mut s = Inst::spawn(&m, "s2", &["--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert_eq!(s.stdout_lines(), x);
    assert_eq!(names_in(&m, "done"), ["x"]);
}

/// Files that are not UTF-8 text go to the bad directory once their good
/// prefix (the lines before the first that is not text) was emitted, as
/// Storm does; good files around them are consumed.
#[test]
fn nul_bytes_and_invalid_utf8_go_to_the_bad_directory() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let good = lines_of("good", 4);
    publish(&m, "good", &good);
    std::fs::write(m.path("stage/nul"), b"fine\nnot\0fine\n").unwrap();
    std::fs::rename(m.path("stage/nul"), m.path("in/nul")).unwrap();
    std::fs::write(m.path("stage/latin1"), b"ok\ncaf\xe9\n").unwrap();
    std::fs::rename(m.path("stage/latin1"), m.path("in/latin1")).unwrap();
    std::fs::write(m.path("in/empty"), b"").unwrap();
    let mut s = Inst::spawn(&m, "s", &["--bad", "bad", "--once"]);
    s.wait_ok(Duration::from_secs(20));
    // Storm's rule: a bad file's good prefix is emitted (oldest file
    // first); the first line that is not text ends it.
    let mut want = good.clone();
    want.extend(["fine".to_string(), "ok".to_string()]);
    assert_eq!(s.stdout_lines(), want, "stderr:\n{}", s.stderr());
    assert_eq!(names_in(&m, "bad"), ["latin1", "nul"]);
    assert_eq!(names_in(&m, "done"), ["empty", "good"]);
    assert_eq!(m.read("bad/nul"), b"fine\nnot\0fine\n", "bad file changed");
    assert!(
        s.stderr().contains("NUL byte") && s.stderr().contains("invalid UTF-8"),
        "{}",
        s.stderr()
    );
}

/// A file whose every replica is corrupt cannot be read (EIO): it goes to
/// the bad directory instead of stopping the spout or looping on it.
#[test]
fn unreadable_file_goes_to_the_bad_directory() {
    let mut m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "broken", &lines_of("broken", 100));
    m.unmount();
    let mut corrupted = 0;
    for dn in &m.datanodes {
        for e in std::fs::read_dir(dn.join("finalized")).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("blk_") && !n.ends_with(".meta") {
                let mut b = std::fs::read(e.path()).unwrap();
                b[0] ^= 0xff;
                std::fs::write(e.path(), b).unwrap();
                corrupted += 1;
            }
        }
    }
    assert_eq!(corrupted, 3, "expected one block on each of 3 datanodes");
    m.mount();
    publish(&m, "fine", &lines_of("fine", 3));
    let mut s = Inst::spawn(&m, "s", &["--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert_eq!(
        s.stdout_lines(),
        lines_of("fine", 3),
        "stderr:\n{}",
        s.stderr()
    );
    assert_eq!(names_in(&m, "in/.bad"), ["broken"]);
    assert_eq!(names_in(&m, "done"), ["fine"]);
}

/// `--exec CMD` feeds every line to the command's stdin.
#[test]
fn exec_command_receives_every_line() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let mut all = Vec::new();
    for i in 0..20 {
        let name = format!("f{i:02}");
        let l = lines_of(&name, 500);
        publish(&m, &name, &l);
        all.extend(l);
    }
    let out = m.dir.path().join("exec.out");
    let cmd = format!("cat >> '{}'", out.display());
    let mut s = Inst::spawn(
        &m,
        "s",
        &["--exec", &cmd, "--commit-count", "100", "--once"],
    );
    s.wait_ok(Duration::from_secs(30));
    assert!(s.stdout_lines().is_empty(), "records went to stdout too");
    let got: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got, all, "in order, oldest file first, each line once");
}

/// A command that dies stops the spout with one error line and a
/// non-zero exit; the file's lock stays for a later takeover.
#[test]
fn exec_command_that_dies_stops_the_spout() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "f", &lines_of("f", 100_000));
    let mut s = Inst::spawn(
        &m,
        "s",
        &["--exec", "head -c 10 > /dev/null; exit 7", "--once"],
    );
    let st = s.wait(Duration::from_secs(20));
    assert!(!st.success());
    let err = s.stderr();
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("leasefs: output:") && last.contains("exit"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(names_in(&m, "in/.lock"), ["f"]);
}

/// Never while the owner is alive and renewing: a spout blocked on a slow
/// consumer writes no progress for longer than the lock timeout, yet its
/// lease is renewed, so another instance cannot take its file.
#[test]
fn idle_lock_of_a_live_renewing_owner_is_not_taken_over() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("slow", 50_000);
    publish(&m, "slow", &lines);
    let out = m.dir.path().join("slow.out");
    let cmd = format!("sleep 7; cat > '{}'", out.display());
    let mut owner = Inst::spawn(
        &m,
        "owner",
        &[
            "--exec",
            &cmd,
            "--commit-count",
            "1000",
            "--lock-timeout",
            "3",
            "--progress-timeout",
            "30",
            "--once",
        ],
    );
    // The owner claimed the file (its first entry) and, with a consumer
    // that acknowledges nothing for 7 s, commits nothing more.
    assert!(wait_until(Duration::from_secs(20), || last_entry(
        &m,
        "in/.lock/slow"
    )
    .is_some_and(|(who, _)| who == "owner")));
    let mut other = Inst::spawn(&m, "other", &["--lock-timeout", "3", "--once"]);
    owner.wait_ok(Duration::from_secs(40));
    other.wait_ok(Duration::from_secs(20));
    assert!(other.takeovers().is_empty(), "{}", other.stderr());
    assert!(other.stdout_lines().is_empty());
    let got: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got, lines);
    assert_eq!(names_in(&m, "done"), ["slow"]);
    assert!(names_in(&m, "in/.lock").is_empty());
}

/// SIGTERM: the current record is finished, its offset committed, the
/// lock file closed (not deleted: it records where to resume) and DIRLOCK
/// not left behind; exit 0. Another instance resumes exactly there.
#[test]
fn sigterm_commits_and_another_instance_resumes_without_duplicates() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("long", 200_000);
    publish(&m, "long", &lines);
    let out1 = m.dir.path().join("first.out");
    // A slow consumer keeps the spout inside the file.
    let cmd = format!(
        "while IFS= read -r l; do printf '%s\\n' \"$l\"; done > '{}'",
        out1.display()
    );
    let mut first = Inst::spawn(
        &m,
        "first",
        &["--exec", &cmd, "--commit-count", "500", "--once"],
    );
    assert!(wait_until(Duration::from_secs(20), || std::fs::metadata(
        &out1
    )
    .is_ok_and(|m| m.len() > 0)));
    first.signal(libc::SIGTERM);
    first.wait_ok(Duration::from_secs(20));
    let (who, at) = last_entry(&m, "in/.lock/long").expect("lock entry after SIGTERM");
    assert_eq!(who, "first");
    assert_eq!(
        names_in(&m, "in/.lock"),
        ["long"],
        "DIRLOCK or other lock left"
    );
    let got1: Vec<String> = std::fs::read_to_string(&out1)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        !got1.is_empty() && got1.len() < lines.len(),
        "{} lines before SIGTERM",
        got1.len()
    );
    assert_eq!(
        at,
        got1.len() as u64 * 13,
        "committed offset is not what was emitted: {}",
        first.stderr()
    );
    assert_eq!(m.lease_state("in/.lock/long"), "free");
    // Storm reads the same entry: its last line, the offset as
    // `{char=C:line=L:...}` (characters and lines before the offset).
    let (storm_id, storm_off) = storm_last_entry(&m, "in/.lock/long").expect("a Storm entry");
    assert_eq!(storm_id, "first");
    assert_eq!(
        storm_offset(&storm_off),
        Some((at, at / 13)),
        "Storm would not resume where leasefs does: {storm_off}"
    );

    let mut second = Inst::spawn(&m, "second", &["--lock-timeout", "3", "--once"]);
    second.wait_ok(Duration::from_secs(30));
    assert_eq!(second.takeovers(), [("long".to_string(), at)]);
    let mut all = got1;
    all.extend(second.stdout_lines());
    assert_eq!(all, lines, "not every line exactly once");
    assert!(names_in(&m, "in/.lock").is_empty());
}

/// A DIRLOCK left by an instance killed mid-scan does not block new files,
/// and is recovered (deleted) once stale.
#[test]
fn stale_dirlock_is_recovered() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "a", &lines_of("a", 3));
    m.sh_ok("mkdir -p in/.lock && : > in/.lock/DIRLOCK");
    let t0 = Instant::now();
    let mut s = Inst::spawn(&m, "s", &["--lock-timeout", "3", "--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert_eq!(s.stdout_lines(), lines_of("a", 3));
    assert!(
        t0.elapsed() >= Duration::from_millis(2500),
        "DIRLOCK taken before it was stale"
    );
    assert!(
        names_in(&m, "in/.lock").is_empty(),
        "{:?}",
        names_in(&m, "in/.lock")
    );
    assert!(s.stderr().contains("stale DIRLOCK"), "{}", s.stderr());
}

/// The writers' side: the two safe ways to publish (write elsewhere and
/// rename in; write NAME.ignore and rename), against a running spout that
/// polls all the while. A file written in place is not consumed while its
/// writer holds it open either (its lease is visible), but only the two
/// rename protocols are promised.
#[test]
fn files_published_by_rename_are_consumed_whole() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let mut s = Inst::spawn(&m, "s", &[]);
    let mut staged = Agent::spawn(&m.mnt);
    staged.ok("open stage/one wac");
    staged.ok("rep 1000 one");
    let mut ignored = Agent::spawn(&m.mnt);
    ignored.ok("open in/two.ignore wac");
    ignored.ok("rep 1000 two");
    let mut inplace = Agent::spawn(&m.mnt);
    inplace.ok("open in/three wac");
    inplace.ok("rep 1000 three");
    inplace.ok("fsync");
    // The spout polls meanwhile: that it takes none of the three before
    // they are complete is shown only by letting it try for a while.
    let_time_pass(Duration::from_millis(1500));
    for a in [&mut staged, &mut ignored, &mut inplace] {
        a.ok("rep 1000 end");
        a.ok("close");
    }
    std::fs::rename(m.path("stage/one"), m.path("in/one")).unwrap();
    std::fs::rename(m.path("in/two.ignore"), m.path("in/two")).unwrap();
    let all_done = || names_in(&m, "done").len() == 3;
    assert!(wait_until(Duration::from_secs(20), all_done));
    s.signal(libc::SIGINT);
    s.wait_ok(Duration::from_secs(10));
    let c = counts_owned(&s.stdout_lines());
    for w in ["one", "two", "three"] {
        assert_eq!(c.get(w), Some(&1000), "{w}: {c:?}");
    }
    assert_eq!(c.get("end"), Some(&3000));
    assert!(names_in(&m, "in/.lock").is_empty());
}

fn counts_owned(lines: &[String]) -> HashMap<String, usize> {
    counts(lines)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// On a terminal a long run prints a periodic progress line.
#[test]
fn progress_line_on_a_terminal() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "p", &lines_of("p", 10));
    let cmd = format!(
        "{} spout in --done done --once --exec 'sleep 3; cat > /dev/null'",
        bin().display()
    );
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(&m.mnt)
        .output()
        .expect("script(1) runs the spout on a pseudo-terminal");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("files done"),
        "no progress line on a terminal: {text}"
    );
    // Not on a pipe: stderr stays quiet.
    let mut s = Inst::spawn(&m, "quiet", &["--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert!(
        !s.stderr().lines().any(|l| l.starts_with("spout quiet:")),
        "{}",
        s.stderr()
    );
}

/// Bad arguments and places: one `leasefs: ...` line, non-zero exit.
#[test]
fn bad_arguments_give_one_line_errors() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let plain = tempfile::tempdir().unwrap();
    std::fs::create_dir(plain.path().join("in")).unwrap();
    std::fs::write(plain.path().join("in/f"), "x\n").unwrap();
    let p = plain.path().display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["nowhere".into(), "--done".into(), "done".into()],
            "source directory",
        ),
        (
            vec![
                "in".into(),
                "--done".into(),
                "done".into(),
                "--lock-timeout".into(),
                "0".into(),
            ],
            "lock-timeout",
        ),
        (
            vec![
                "in".into(),
                "--done".into(),
                "done".into(),
                "--id".into(),
                "a,b".into(),
            ],
            "id",
        ),
        (
            vec!["in".into(), "--done".into(), format!("{p}/done")],
            "same filesystem",
        ),
        (
            vec![
                "in".into(),
                "--done".into(),
                "done".into(),
                "--renew-ms".into(),
                "1500".into(),
                "--once".into(),
            ],
            "soft limit",
        ),
        (
            vec![
                format!("{p}/in"),
                "--done".into(),
                format!("{p}/done"),
                "--once".into(),
            ],
            "not on a leasefs mount",
        ),
    ];
    for (args, what) in cases {
        let o = Command::new(bin())
            .arg("spout")
            .args(&args)
            .current_dir(&m.mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("leasefs: ") && err.contains(what),
            "{args:?}: {err}"
        );
    }
    assert!(
        plain.path().join("in/f").exists(),
        "the file off leasefs was touched"
    );
    let made = |d: &str| plain.path().join(d).exists();
    assert!(
        !made("in/.lock") && !made("done"),
        "directories made off leasefs"
    );
}

/// A DIRLOCK whose holder is alive and renewing is never taken, however
/// old; once the holder stops renewing (SIGSTOP), it is recovered after the
/// soft limit, and the stopped holder is fenced.
#[test]
fn dirlock_of_a_renewing_holder_is_kept_until_its_lease_expires() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "a", &lines_of("a", 3));
    std::fs::create_dir_all(m.path("in/.lock")).unwrap();
    let mut holder = Agent::spawn(&m.mnt);
    holder.ok("open in/.lock/DIRLOCK wac");
    holder.ok("client-renewal");
    let mut s = Inst::spawn(&m, "s", &["--lock-timeout", "3", "--once"]);
    for _ in 0..10 {
        // Renewals paced in time: that they outlast the lock timeout is the point.
        let_time_pass(Duration::from_millis(500));
        holder.ok("renew");
    }
    // 5 s: DIRLOCK is older than the lock timeout, but its lease is renewed.
    assert!(s.child.try_wait().unwrap().is_none(), "{}", s.stderr());
    assert_eq!(
        s.stdout_lines(),
        lines_of("a", 3),
        "new files need no DIRLOCK"
    );
    assert!(m.path("in/.lock/DIRLOCK").exists());
    holder.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    s.wait_ok(Duration::from_secs(15));
    assert!(
        stopped.elapsed() >= Duration::from_millis(1500),
        "DIRLOCK taken {:?} after its holder stopped renewing (soft limit 2 s)",
        stopped.elapsed()
    );
    assert!(s.stderr().contains("stale DIRLOCK"), "{}", s.stderr());
    assert!(names_in(&m, "in/.lock").is_empty());
    holder.signal(libc::SIGCONT);
    assert_eq!(err_name(&holder.cmd("write late")), Some("EIO"));
}

//! `leasefs spout` at the edges of delivery (docs/SEMANTICS.md "Spout"),
//! with real processes on a real mount (`soft_limit=2`): commits never pass
//! what the consumer took, Apache Storm's lock files are resumed where
//! Storm left them, a file being consumed cannot grow, a live owner's lock
//! does not hold up the scan on mounts with `lease_wait`, names need
//! not be UTF-8, and the timing rules (issue 31): idleness by observation
//! with `--clocks-insync false`, a consumer without progress killed and
//! its file released, SIGTERM at once, `--max-outstanding`, the count
//! commit on acknowledged records.

mod common;
use common::spout::*;
use common::*;

use std::time::{Duration, Instant};

const MOUNT_O: &str = "soft_limit=2,monitor_interval=0.2";

/// At-least-once reaches the consumer, not just its pipe: a consumer that
/// takes ten lines and exits (after sleeping, so that the spout has filled
/// its pipe meanwhile) acknowledged ten lines, so nothing past them is
/// committed; the spout stops with an error, and the next instance emits
/// every line the first consumer never took.
#[test]
fn lines_a_consumer_never_took_are_emitted_again() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("f", 100_000);
    publish(&m, "f", &lines);
    let a = m.dir.path().join("a");
    let cmd = format!("sleep 2; head -n 10 > '{}'", a.display());
    let mut first = Inst::spawn(&m, "first", &["--exec", &cmd, "--commit-count", "100"]);
    let st = first.wait(Duration::from_secs(60));
    assert_eq!(st.code(), Some(1), "{}", first.stderr());
    let mut second = Inst::spawn(
        &m,
        "second",
        &["--lock-timeout", "1", "--renew-ms", "400", "--once"],
    );
    second.wait_ok(Duration::from_secs(60));
    let took: Vec<String> = std::fs::read_to_string(&a)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(took.len(), 10, "{}", first.stderr());
    let mut all: std::collections::HashSet<String> = took.into_iter().collect();
    all.extend(second.stdout_lines());
    assert_eq!(
        all.len(),
        lines.len(),
        "lines committed by the first instance never reached a consumer"
    );
    assert_eq!(names_in(&m, "done"), ["f"]);
}

/// Lock files are Storm's in both directions: a lock left by Storm (its
/// offsets are `{char=C:line=L:}`, a newline before each entry but the
/// first) is taken over at the line Storm recorded, and what leasefs
/// writes into it is what Storm's reader parses.
#[test]
fn a_storm_lock_file_resumes_at_its_line() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines: Vec<String> = (0..100).map(|i| format!("rec {i:03}")).collect();
    publish(&m, "x.txt", &lines);
    m.sh_ok(
        "mkdir -p in/.lock && mv in/x.txt in/x.txt.inprogress \
         && printf '1000,storm-7,0\\n2000,storm-7,{char=480:line=60:}' > in/.lock/x.txt \
         && touch -d '-1 hour' in/.lock/x.txt",
    );
    let mut s = Inst::spawn(&m, "s", &["--lock-timeout", "3", "--once"]);
    s.wait_ok(Duration::from_secs(30));
    assert_eq!(s.stdout_lines(), lines[60..].to_vec(), "{}", s.stderr());
    assert_eq!(s.takeovers(), [("x.txt".to_string(), 480)]);
    assert_eq!(names_in(&m, "done"), ["x.txt"]);
}

/// A file being consumed cannot grow: the spout holds its write lease
/// until it has moved it to the done directory, so an append is refused
/// (EBUSY) instead of landing after the last line was read. Every line of
/// the file in done reached the consumer.
#[test]
fn a_file_being_consumed_cannot_grow() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("g", 20_000);
    publish(&m, "g", &lines);
    let out = m.dir.path().join("g.out");
    let cmd = format!("sleep 2; cat > '{}'", out.display());
    let mut s = Inst::spawn(&m, "s", &["--exec", &cmd, "--once"]);
    assert!(wait_until(Duration::from_secs(20), || m
        .path("in/g.inprogress")
        .exists()));
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("in/g.inprogress"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"late line\n"));
    s.wait_ok(Duration::from_secs(30));
    assert_eq!(
        append.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::EBUSY)),
        "an append to a file being consumed was not refused"
    );
    let got: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got, lines);
    assert_eq!(m.read_string("done/g").lines().count(), lines.len());
}

/// With `lease_wait`, a write open of a held file waits; the spout's
/// takeover and stale-DIRLOCK opens do not (O_NONBLOCK): a live owner's
/// idle lock does not hold up new files for the wait.
#[test]
fn a_live_owners_idle_lock_does_not_stall_other_files_with_lease_wait() {
    let m = Mount::with_o("soft_limit=2,monitor_interval=0.2,lease_wait=20");
    setup(&m);
    publish(&m, "slow", &lines_of("slow", 50_000));
    let mut owner = Inst::spawn(
        &m,
        "owner",
        &[
            "--exec",
            "sleep 12; cat > /dev/null",
            "--lock-timeout",
            "1",
            "--progress-timeout",
            "60",
            "--renew-ms",
            "400",
        ],
    );
    assert!(wait_until(Duration::from_secs(20), || m
        .path("in/slow.inprogress")
        .exists()));
    // The owner's lock is idle after 1 s; its lease is renewed. Idle is a
    // matter of time only.
    let_time_pass(Duration::from_millis(1500));
    publish(&m, "quick", &lines_of("quick", 3));
    let started = Instant::now();
    let mut other = Inst::spawn(&m, "other", &["--lock-timeout", "1", "--renew-ms", "400"]);
    assert!(
        wait_until(Duration::from_secs(30), || m.path("done/quick").exists()),
        "{}",
        other.stderr()
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "a new file waited {took:?} behind a live owner's lock (lease_wait=20)"
    );
    for i in [&mut other, &mut owner] {
        i.signal(libc::SIGTERM);
        i.wait_ok(Duration::from_secs(30));
    }
}

/// File names need not be UTF-8: such a file is consumed, moved to done
/// under its own name, and its lock file has that name too.
#[test]
fn files_with_names_that_are_not_utf8_are_consumed() {
    use std::os::unix::ffi::OsStrExt;
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.log");
    let lines = lines_of("latin", 5);
    std::fs::write(m.path("stage").join(name), lines.join("\n") + "\n").unwrap();
    std::fs::rename(m.path("stage").join(name), m.path("in").join(name)).unwrap();
    let mut s = Inst::spawn(&m, "s", &["--once"]);
    s.wait_ok(Duration::from_secs(20));
    assert_eq!(s.stdout_lines(), lines, "{}", s.stderr());
    assert!(
        m.path("done").join(name).exists(),
        "{:?}",
        names_in(&m, "done")
    );
    assert!(names_in(&m, "in/.lock").is_empty());
}

/// The pid written into `path` by a consumer, once it is there.
fn pid_in(path: &std::path::Path) -> u32 {
    let mut pid = None;
    assert!(
        wait_until(Duration::from_secs(20), || {
            pid = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        }),
        "no pid in {}",
        path.display()
    );
    pid.unwrap_or(0)
}

/// Storm's `clocks.insync=false`: a lock file whose entry is dated a day
/// ahead (a writer's clock off, or ours stepped back) is idle once it was
/// seen unchanged for the lock timeout, by the observer's own monotonic
/// clock; with clocks in sync (the default) it would not be for a day.
#[test]
fn a_lock_dated_a_day_ahead_is_taken_over_when_clocks_are_not_in_sync() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("ahead", 100);
    publish(&m, "ahead", &lines);
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 86_400_000;
    m.sh_ok(&format!(
        "mkdir -p in/.lock && mv in/ahead in/ahead.inprogress \
         && printf '{ahead},ghost,0' > in/.lock/ahead"
    ));
    // With clocks in sync the entry is not idle for a day: nothing moves.
    let mut insync = Inst::spawn(&m, "insync", &["--lock-timeout", "2"]);
    let_time_pass(Duration::from_secs(3));
    insync.signal(libc::SIGTERM);
    insync.wait_ok(Duration::from_secs(20));
    assert!(insync.takeovers().is_empty(), "{}", insync.stderr());
    let started = Instant::now();
    let mut s = Inst::spawn(
        &m,
        "s",
        &["--lock-timeout", "2", "--clocks-insync", "false", "--once"],
    );
    s.wait_ok(Duration::from_secs(30));
    assert_eq!(s.takeovers(), [("ahead".to_string(), 0)], "{}", s.stderr());
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "taken before it was seen unchanged for the lock timeout"
    );
    assert_eq!(s.stdout_lines(), lines);
    assert_eq!(names_in(&m, "done"), ["ahead"]);
}

/// A consumer that neither takes nor acknowledges a record for the
/// progress timeout is killed, with every process it started (one that
/// left its process group included), and its file is released at once for
/// another instance, which consumes it; the stalled instance goes on.
#[test]
fn a_consumer_without_progress_is_killed_and_its_file_released() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("pinned", 200);
    publish(&m, "pinned", &lines);
    let pid = m.dir.path().join("escaped.pid");
    let cmd = format!(
        "setsid sleep 600 & echo $! > '{}'; sleep 600",
        pid.display()
    );
    let mut a = Inst::spawn(
        &m,
        "a",
        &[
            "--exec",
            &cmd,
            "--lock-timeout",
            "1",
            "--progress-timeout",
            "2",
            "--once",
        ],
    );
    let escaped = pid_in(&pid);
    let mut b = Inst::spawn(&m, "b", &["--lock-timeout", "1", "--once"]);
    b.wait_ok(Duration::from_secs(40));
    assert_eq!(b.stdout_lines(), lines, "{}\n{}", b.stderr(), a.stderr());
    assert_eq!(b.takeovers(), [("pinned".to_string(), 0)]);
    a.wait_ok(Duration::from_secs(20));
    assert!(a.stderr().contains("made no progress"), "{}", a.stderr());
    assert!(
        wait_until(Duration::from_secs(5), || !alive(escaped)),
        "the consumer's setsid child survived"
    );
    assert_eq!(names_in(&m, "done"), ["pinned"]);
}

/// SIGTERM is handled at once even while the consumer takes nothing: no
/// more records, the command is killed once the grace (here the progress
/// timeout, shorter than 10 s) is over, the lock's lease is released and
/// its entry kept, exit 0.
#[test]
fn sigterm_stops_at_once_with_a_consumer_that_reads_nothing() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "f", &lines_of("f", 100));
    let pid = m.dir.path().join("consumer.pid");
    let cmd = format!("echo $$ > '{}'; exec sleep 600", pid.display());
    let mut s = Inst::spawn(
        &m,
        "s",
        &["--exec", &cmd, "--progress-timeout", "3", "--once"],
    );
    let consumer = pid_in(&pid);
    let_time_pass(Duration::from_millis(500));
    let sent = Instant::now();
    s.signal(libc::SIGTERM);
    s.wait_ok(Duration::from_secs(15));
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "took {:?}",
        sent.elapsed()
    );
    assert!(!alive(consumer), "the consumer outlived the spout");
    assert_eq!(names_in(&m, "in/.lock"), ["f"]);
    assert_eq!(last_entry(&m, "in/.lock/f"), Some(("s".to_string(), 0)));
    assert_eq!(m.lease_state("in/.lock/f"), "free");
}

/// `--max-outstanding N`: never more than N records handed on and not
/// acknowledged. A consumer that acknowledges only after 20 records gets
/// exactly 10 with N = 10 (and is then killed for making no progress).
#[test]
fn max_outstanding_bounds_unacknowledged_records() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "f", &lines_of("f", 1000));
    let out = m.dir.path().join("took");
    let cmd = format!(
        "n=0; while IFS= read -r l; do printf '%s\\n' \"$l\" >> '{}'; n=$((n+1)); \
         [ $n -ge 20 ] && echo $n >&3; done",
        out.display()
    );
    let mut s = Inst::spawn(
        &m,
        "s",
        &[
            "--exec",
            &cmd,
            "--max-outstanding",
            "10",
            "--progress-timeout",
            "2",
            "--lock-timeout",
            "60",
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || s
            .stderr()
            .contains("made no progress")),
        "{}",
        s.stderr()
    );
    s.signal(libc::SIGTERM);
    s.wait_ok(Duration::from_secs(20));
    let took = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(took.lines().count(), 10, "{}", s.stderr());
}

/// The count commit counts acknowledged records: a consumer that
/// acknowledges every record and then hangs has all of them committed
/// while it still runs, and after a crash the next instance resumes after
/// them (emits nothing again).
#[test]
fn the_count_commit_counts_acknowledged_records() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("f", 1000);
    publish(&m, "f", &lines);
    let pid = m.dir.path().join("consumer.pid");
    let cmd = format!(
        "echo $$ > '{}'; n=0; while IFS= read -r l; do n=$((n+1)); echo $n >&3; done; exec sleep 600",
        pid.display()
    );
    let mut first = Inst::spawn(
        &m,
        "first",
        &[
            "--exec",
            &cmd,
            "--commit-count",
            "100",
            "--commit-sec",
            "1000",
            "--progress-timeout",
            "120",
        ],
    );
    let consumer = pid_in(&pid);
    let end = line_offset(&lines[999]).1 + lines[999].len() as u64 + 1;
    let mut last = None;
    let all_committed = wait_until(Duration::from_secs(30), || {
        last = last_entry(&m, "in/.lock/f");
        last == Some(("first".to_string(), end))
    });
    first.signal(libc::SIGKILL);
    first.wait(Duration::from_secs(10));
    kill(consumer, libc::SIGKILL);
    assert!(all_committed, "last entry {last:?}, want offset {end}");
    let mut second = Inst::spawn(&m, "second", &["--lock-timeout", "1", "--once"]);
    second.wait_ok(Duration::from_secs(30));
    assert_eq!(second.takeovers(), [("f".to_string(), end)]);
    assert!(
        second.stdout_lines().is_empty(),
        "acknowledged records emitted again"
    );
}

/// SIGTERM reaches a spout whose stdout is a pipe nobody reads (it waits
/// for room with `poll`, not in a blocking write): it exits 0 at once, and
/// its commit covers exactly the whole lines that went into the pipe.
#[test]
fn sigterm_stops_a_spout_whose_stdout_nobody_reads() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    let lines = lines_of("f", 100_000);
    publish(&m, "f", &lines);
    let err = m.dir.path().join("s.err");
    let mut child = Command::new(bin())
        .args(["spout", "in", "--done", "done", "--id", "s", "--once"])
        .current_dir(&m.mnt)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).expect("create err"))
        .spawn()
        .expect("spawn leasefs spout");
    let stderr = || std::fs::read_to_string(&err).unwrap_or_default();
    // The pipe is full and stays so: the spout waits for room.
    assert!(
        wait_until(Duration::from_secs(20), || m
            .path("in/f.inprogress")
            .exists()),
        "{}",
        stderr()
    );
    let_time_pass(Duration::from_secs(1));
    kill(child.id(), libc::SIGTERM);
    let mut status = None;
    let exited = wait_until(Duration::from_secs(10), || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    if !exited {
        kill(child.id(), libc::SIGKILL);
        let _ = child.wait();
        panic!("SIGTERM not acted on while stdout was full\n{}", stderr());
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        stderr()
    );
    let mut got = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut got)
        .expect("read the pipe");
    assert!(got.ends_with('\n'), "a torn line in the pipe");
    let n = got.lines().count();
    assert!(n > 0 && n < lines.len(), "{n} lines");
    assert_eq!(got.lines().collect::<Vec<_>>(), lines[..n].to_vec());
    assert_eq!(
        last_entry(&m, "in/.lock/f"),
        Some(("s".to_string(), n as u64 * 10)),
        "the commit is not what went into the pipe"
    );
}

/// A client-renewed spout stops acting on its file by its own clock when
/// its daemon stalls (here stopped with SIGSTOP, as a paused VM): its
/// renewal thread blocks in the daemon, but the lease the daemon last
/// vouched for runs out on the spout's boot clock, and by then it has
/// abandoned the file: the consumer's input is closed (it sees EOF) while
/// the daemon is still stopped, within the soft limit (2 s) of the stop.
/// Another instance could be granted the file only after that.
#[test]
fn a_stalled_daemon_cannot_hold_a_spout_past_its_lease() {
    let m = Mount::with_o(MOUNT_O);
    setup(&m);
    publish(&m, "f", &lines_of("f", 1000));
    let took = m.dir.path().join("took");
    let eof = m.dir.path().join("eof");
    // Takes records, acknowledges none; writes when its input ends.
    let cmd = format!(
        "cat > '{}'; date +%s%N > '{}'",
        took.display(),
        eof.display()
    );
    let mut s = Inst::spawn(
        &m,
        "s",
        &[
            "--exec",
            &cmd,
            "--max-outstanding",
            "10",
            "--progress-timeout",
            "60",
            "--lock-timeout",
            "60",
            "--renew-ms",
            "400",
        ],
    );
    assert!(
        wait_until(Duration::from_secs(20), || std::fs::read_to_string(&took)
            .is_ok_and(|t| t.lines().count() == 10)),
        "the consumer never got its 10 records: {}",
        s.stderr()
    );
    // Renewals have run for a while: the lease is vouched for 2 s at most.
    let_time_pass(Duration::from_secs(1));
    let daemon = m.pid.expect("daemon pid");
    let stopped = Instant::now();
    let stop_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let guard = Stopped::stop(daemon);
    let ended = wait_until(Duration::from_secs(5), || eof.exists());
    let held_for = stopped.elapsed();
    drop(guard);
    assert!(
        ended,
        "the spout still fed its consumer {held_for:?} after its daemon stopped (soft limit 2 s): {}",
        s.stderr()
    );
    let at: u128 = std::fs::read_to_string(&eof)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        at.saturating_sub(stop_ns) < 2_000_000_000,
        "the consumer's input ended {} ms after the stop, past the soft limit",
        at.saturating_sub(stop_ns) / 1_000_000
    );
    assert!(s.stderr().contains("abandoning it"), "{}", s.stderr());
    s.signal(libc::SIGTERM);
    s.wait_ok(Duration::from_secs(20));
}

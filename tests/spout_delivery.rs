//! `leasefs spout` at the edges of delivery (docs/SEMANTICS.md "Spout"),
//! with real processes on a real mount (`soft_limit=2`): commits never pass
//! what the consumer took, Apache Storm's lock files are resumed where
//! Storm left them, a file being consumed cannot grow, a live owner's lock
//! does not hold up the scan on mounts with `lease_wait`, and names need
//! not be UTF-8.

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

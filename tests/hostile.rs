//! A root mount that a hostile local user cannot use (docs/SEMANTICS.md,
//! "Threat model"): each attack runs as `nobody` through `setpriv`, as an
//! ordinary user of the machine would run it, against a mount made by
//! root; over etcd with two daemons where that is where it shows.

mod common;

use std::path::Path;
use std::process::Output;

use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::*;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A `testkit` subcommand as `nobody:nogroup`, to completion.
fn testkit_as_nobody(args: &[&str]) -> Output {
    let kit = testkit();
    let mut cmd = vec![kit.to_str().expect("testkit path")];
    cmd.extend_from_slice(args);
    as_nobody(&cmd)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// CREATE without `O_EXCL` of a name that another daemon made after this
/// kernel looked it up: the kernel counts a successful CREATE as a new
/// file and skips its own open-permission check, so the daemon must not
/// hand back the existing file. `nobody` swaps root's 0600 file in and
/// out of a name in its own directory through one daemon while opening
/// that name with `O_RDWR|O_APPEND|O_CREAT` through the other: it must
/// never get the file open (before the fix it read it and appended to it
/// within a few hundred tries).
#[test]
fn create_never_opens_an_existing_file_without_a_permission_check() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "create-race", &dns, &[]);
    let b = daemon(&etcd, "create-race", &dns, &[]);
    a.open_to_all();
    b.open_to_all();
    a.sh_ok(
        "mkdir n && chown nobody:nogroup n && printf TOPSECRET > n/secret && chmod 600 n/secret",
    );
    wait_for(
        std::time::Duration::from_secs(5),
        "B sees the secret",
        || b.path("n/secret").exists(),
    );
    let swapper = {
        let (from, to) = (a.path("n/secret"), a.path("n/x"));
        std::thread::spawn(move || testkit_as_nobody(&["swap", p(&from), p(&to), "8"]))
    };
    let race = testkit_as_nobody(&["create-race", p(&b.path("n/x")), "8"]);
    let swaps = swapper.join().expect("swapper");
    let (race, swaps) = (stdout(&race), stdout(&swaps));
    assert!(
        !race.starts_with("breach"),
        "nobody opened root's 0600 file through CREATE: {race} ({swaps})"
    );
    // Root's file is whole, under one of the two names.
    let content: Vec<String> = ["n/secret", "n/x"]
        .iter()
        .filter_map(|n| {
            let path = a.path(n);
            let md = std::fs::metadata(&path).ok()?;
            (md.len() > 0 || std::os::unix::fs::MetadataExt::uid(&md) == 0)
                .then(|| std::fs::read_to_string(&path).unwrap_or_default())
        })
        .filter(|c| c.starts_with("TOPSECRET"))
        .collect();
    assert_eq!(
        content,
        ["TOPSECRET"],
        "root's file after the race: {race} ({swaps})"
    );
    eprintln!("create race: {race}; {swaps}");
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `testkit hold-and-ask` as `nobody`: holding `leader`'s lease, `n`
/// times `template`; the answers counted by kind.
fn ask_as_leader(m: &Mount, leader: &str, n: usize, template: &str) -> String {
    let sock = m.data.join("control.sock");
    let o = testkit_as_nobody(&[
        "hold-and-ask",
        p(&m.path(leader)),
        p(&sock),
        &n.to_string(),
        template,
    ]);
    let s = stdout(&o);
    assert!(
        s.ends_with("done"),
        "hold-and-ask: {s} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    s
}

/// How many of the answers `out` counts began with `prefix`.
fn answered(out: &str, prefix: &str) -> u64 {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, a)| a.starts_with(prefix))
        .filter_map(|(n, _)| n.parse::<u64>().ok())
        .sum()
}

/// What an ordinary user's election requests cost the daemon is bounded:
/// a term's fields are short (500 `fence` requests with 30 KB ids and
/// hosts are refused; before, they took 33 MB for good), one user's terms
/// and fenced commands are few at once, an audit event must name the
/// caller's real term (300 forged events with 60 KB reasons are refused;
/// before, they took 16 MB of meta.db), the table keeps 1,000 events of
/// one user, and `history` answers a page (the last 100 by default).
#[test]
fn election_requests_of_a_user_cost_a_bounded_amount() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("mkdir e && chown nobody:nogroup e");
    let pid = m.pid.expect("daemon pid");
    let rss0 = rss_kib(pid);

    let big_fence = r#"{"op":"fence","path":"/e/LEADER","epoch":{epoch},"pid":{pid},"who":"{pad:30000}","host":"{pad:30000}","pgid":{child}}"#;
    let out = ask_as_leader(&m, "e/LEADER", 500, big_fence);
    assert_eq!(answered(&out, r#"{"ok""#), 0, "long fields taken: {out}");
    let fence = r#"{"op":"fence","path":"/e/LEADER","epoch":{epoch},"pid":{pid},"who":"n{i}","host":"h","pgid":{child}}"#;
    let out = ask_as_leader(&m, "e/LEADER", 80, fence);
    assert_eq!(
        answered(&out, r#"{"ok""#),
        64,
        "fenced commands of one user: {out}"
    );
    assert_eq!(
        answered(&out, r#"{"error":"too many fenced commands"#),
        16,
        "{out}"
    );

    let forged = r#"{"op":"audit","event":{"election":"/e","event":"elected","who":"root","host":"h","pid":1,"epoch":999999,"at_ms":0,"why":"{pad:60000}"}}"#;
    let out = ask_as_leader(&m, "e/LEADER", 300, forged);
    assert_eq!(
        answered(&out, r#"{"id""#),
        0,
        "forged events recorded: {out}"
    );
    let host = hostname();
    let own = format!(
        r#"{{"op":"audit","event":{{"election":"/e","event":"resigned","who":"n","host":"{host}","pid":{{pid}},"epoch":{{epoch}},"at_ms":{{i}},"why":"round {{i}}"}}}}"#
    );
    let out = ask_as_leader(&m, "e/LEADER", 1100, &own);
    assert_eq!(
        answered(&out, r#"{"id""#),
        1100,
        "the caller's own events: {out}"
    );
    let dir = m.path("e");
    let history = |args: &[&str]| -> usize {
        let mut a = vec!["elect", p(&dir), "--history", "--json"];
        a.extend_from_slice(args);
        let o = m.leasefs(&a);
        assert!(
            o.status.success(),
            "elect --history: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("history JSON");
        v.as_array().expect("events").len()
    };
    assert_eq!(history(&[]), 100, "the default page");
    assert_eq!(history(&["--last", "250"]), 250);
    assert_eq!(history(&["--all"]), 1000, "events one user keeps");
    let grown = rss_kib(pid).saturating_sub(rss0);
    assert!(grown < 16 << 10, "the daemon grew by {grown} KiB");
    eprintln!("daemon RSS grew by {grown} KiB");
}

/// Refused writes, each of which the daemon logs, cost a user only their
/// budget of log lines (a burst of 50, then 5 a second), and one line
/// says how many were left out; before, every refusal was a line.
#[test]
fn a_users_refusals_cost_a_bounded_log() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("touch mine && chown nobody:nogroup mine");
    let mut w = Agent::spawn_as_nobody(&m.mnt);
    w.ok("open mine w");
    w.ok("write x");
    for _ in 0..3000 {
        let r = w.cmd("pwrite 100000 y");
        assert_eq!(err_name(&r), Some("EINVAL"), "{r}");
    }
    let lines = m.log().matches("refused write").count();
    assert!(lines <= 120, "{lines} lines for 3000 refused writes");
    wait_for(
        std::time::Duration::from_secs(10),
        "the report of lines left out",
        || m.log().contains("left out"),
    );
}

/// The log is rotated past `log_size`: at most that much in
/// `leasefs.log` (and a line), three older files kept, none more.
#[test]
fn the_log_is_rotated_past_its_size() {
    let m = Mount::with_env(
        Opts {
            o: vec!["log_size=64K".into()],
            ..Opts::default()
        },
        &[("RUST_LOG", "debug")],
    );
    for i in 0..4000 {
        let _ = std::fs::metadata(m.path(&format!("missing-{i}")));
    }
    let log = m.data.join("leasefs.log");
    let size = std::fs::metadata(&log).expect("log").len();
    assert!(size < (64 << 10) + 4096, "leasefs.log is {size} bytes");
    for i in 1..=3 {
        assert!(
            m.data.join(format!("leasefs.log.{i}")).exists(),
            "leasefs.log.{i} is missing"
        );
    }
    assert!(
        !m.data.join("leasefs.log.4").exists(),
        "more than three kept"
    );
}

/// One user's opens that wait for a lease cannot take the transport from
/// everyone else. `nobody` holds its file and starts 1,100 threads on CPU
/// 0 that open it for writing (each would wait `lease_wait`, 30 s); over
/// io_uring each waiting open would keep an entry of CPU 0's ring, which
/// has at most 1,024. Meanwhile root's lookups from CPU 0 are answered
/// within 100 ms: past 64 opens under way, a user's next open does not
/// wait (`EBUSY` at once). Before, they waited for an entry for seconds.
#[test]
fn a_users_waiting_opens_cannot_starve_other_users_requests() {
    let m = Mount::with_o("lease_wait=30");
    m.open_to_all();
    m.sh_ok("touch held && chown nobody:nogroup held");
    let mut holder = Agent::spawn_as_nobody(&m.mnt);
    holder.ok("open held w");
    let kit = testkit();
    let held = m.path("held");
    let pile = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(&kit)
        .args(["pile", p(&held), "1100", "0", "10"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the pile");
    // The threads are in open(2) within a second or two; the probe's 150
    // lookups then span the next 3 s or more, while the pile stands.
    let_time_pass(std::time::Duration::from_secs(2));
    let probe = std::process::Command::new(&kit)
        .args(["probe", p(&m.mnt), "150", "0"])
        .output()
        .expect("probe");
    let out = pile.wait_with_output().expect("the pile");
    let piled = stdout(&out);
    let probed = stdout(&probe);
    let slowest: u64 = probed
        .strip_prefix("slowest_us ")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(
        slowest < 100_000,
        "root's lookup waited {slowest} µs behind nobody's waiting opens ({piled})"
    );
    let busy: u64 = piled
        .split_whitespace()
        .skip_while(|w| *w != "EBUSY")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(busy >= 1000, "opens past the bound must not wait: {piled}");
    holder.ok("close");
}

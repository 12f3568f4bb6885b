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

/// Names and holders stay hidden across daemons (item 6): root writes
/// `secret/held` (under a 0700 directory) and `open/held` through daemon
/// A; `nobody` asks daemon B, which learns of both from etcd alone. B's
/// `leases` names only `open/held` (and counts the other), and the lease
/// xattr of `open/held` on B shows that it is held, not by whom.
#[test]
fn another_daemon_shows_a_user_no_more_names_or_holders_than_ls_would() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "sight", &dns, &[]);
    let b = daemon(&etcd, "sight", &dns, &[]);
    a.open_to_all();
    b.open_to_all();
    a.sh_ok("mkdir -m 700 secret && mkdir -m 755 open");
    let mut writers = Vec::new();
    for rel in ["secret/held", "open/held"] {
        let mut w = Agent::spawn(&a.mnt);
        w.ok(&format!("open {rel} wc"));
        w.ok("write x");
        w.ok("fsync");
        writers.push(w);
    }
    let leases_as_nobody = |m: &Mount| {
        let bin = bin();
        as_nobody(&[p(&bin), "leases", p(&m.mnt), "--json"])
    };
    // Root sees both through B: B does know of them.
    wait_for(
        std::time::Duration::from_secs(10),
        "B lists both held files to root",
        || {
            let o = b.leasefs(&["leases", p(&b.mnt), "--json"]);
            let s = stdout(&o);
            s.contains("secret/held") && s.contains("open/held")
        },
    );
    let o = leases_as_nobody(&b);
    let listed = stdout(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "leases as nobody on B: {listed} {said}");
    assert!(
        listed.contains("open/held") && !listed.contains("secret"),
        "B's leases as nobody: {listed}"
    );
    assert!(said.contains("1 more leases not shown"), "{said}");
    let o = as_nobody(&[
        "getfattr",
        "--only-values",
        "-n",
        "user.leasefs.lease",
        p(&b.path("open/held")),
    ]);
    let lease: serde_json::Value = serde_json::from_slice(&o.stdout).expect("lease JSON");
    assert_eq!(lease["state"], "held", "{lease}");
    assert!(
        lease["holder"].is_null() && lease["comm"].is_null(),
        "root's holder shown to nobody by B: {lease}"
    );
    for mut w in writers {
        w.ok("close");
    }
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

/// `chmod` as root (test setup: an administrator's mistake).
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A root-only directory (0700) at `path`, holding the file `precious`.
fn root_only_dir(path: &Path) {
    std::fs::create_dir_all(path).expect("mkdir");
    chmod(path, 0o700);
    std::fs::write(path.join("precious"), b"root's").expect("write precious");
}

/// What `root_only_dir` holds now, `precious` aside.
fn planted(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .expect("read vault")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "precious")
        .collect();
    names.sort();
    names
}

/// The content the test's writers give file `i`.
fn content(i: usize) -> Vec<u8> {
    format!("line {i}\n").repeat(200_000 / 7).into_bytes()
}

/// A datanode directory left writable by everyone after the mount: `nobody`
/// replaces its `rbw/`, `finalized/` and `tmp/` by symbolic links to
/// root-only directories, then writes and fsyncs files through the mount.
/// Nothing may be created or deleted in those directories (before the fix
/// the daemon, as root, created the replicas of `nobody`'s files there),
/// every file reads back whole, and once the heartbeat has refused the
/// datanode the mount goes on with the others.
#[test]
fn a_datanode_subdirectory_replaced_by_a_link_is_never_followed() {
    let m = Mount::with(Opts {
        datanodes: 4,
        replication: Some(3),
        ..Opts::default()
    });
    m.open_to_all();
    m.sh_ok("mkdir pub && chown nobody:nogroup pub");
    let dn1 = m.datanodes[0].clone();
    let vault = m.dir.path().join("vault");
    for d in ["rbw", "finalized", "tmp"] {
        root_only_dir(&vault.join(d));
    }
    chmod(&dn1, 0o777);
    let swap = format!(
        "cd {dn} && for d in rbw finalized tmp; do mv $d $d.x && ln -s {v}/$d $d; done",
        dn = p(&dn1),
        v = p(&vault)
    );
    let o = as_nobody(&["sh", "-c", &swap]);
    assert!(o.status.success(), "swap as nobody: {o:?}");
    let write = |from: usize, to: usize| {
        let script = (from..to)
            .map(|i| {
                format!(
                    "yes 'line {i}' | head -c {n} | dd of={f} conv=fsync status=none",
                    n = content(i).len(),
                    f = p(&m.path(&format!("pub/f{i}")))
                )
            })
            .collect::<Vec<_>>()
            .join(" && ");
        let o = as_nobody(&["sh", "-c", &script]);
        assert!(o.status.success(), "writes as nobody: {o:?}");
    };
    write(0, 8);
    for d in ["rbw", "finalized", "tmp"] {
        assert_eq!(
            planted(&vault.join(d)),
            Vec::<String>::new(),
            "the daemon wrote into the root-only directory {d}/ links to"
        );
    }
    wait_for(
        std::time::Duration::from_secs(10),
        "the heartbeat refuses the datanode",
        || {
            let log = m.log();
            log.contains("datanode heartbeat failed") && log.contains("refused")
        },
    );
    write(8, 12);
    for d in ["rbw", "finalized", "tmp"] {
        assert_eq!(planted(&vault.join(d)), Vec::<String>::new(), "{d}/");
    }
    for i in 0..12 {
        let got = std::fs::read(m.path(&format!("pub/f{i}"))).expect("read back");
        assert!(got == content(i), "pub/f{i} differs ({} bytes)", got.len());
    }
}

/// A datanode or data directory that another user could change is refused
/// at mount with one line naming it and why, and a non-zero exit; so is a
/// link in place of `tmp/`, which the mount would have cleaned (before the
/// fix the mount went ahead and deleted the files of the root-only
/// directory `tmp/` pointed to). `datanode add` refuses the same.
#[test]
fn a_datanode_or_data_directory_others_can_change_is_refused_at_mount() {
    let mut m = Mount::with(Opts {
        datanodes: 2,
        ..Opts::default()
    });
    m.open_to_all();
    m.sh_ok("echo kept > kept");
    m.unmount();
    let dn1 = m.datanodes[0].clone();
    let vault = m.dir.path().join("vault");
    root_only_dir(&vault);
    chmod(&dn1, 0o777);
    let swap = format!("cd {} && mv tmp tmp.x && ln -s {} tmp", p(&dn1), p(&vault));
    let o = as_nobody(&["sh", "-c", &swap]);
    assert!(o.status.success(), "swap as nobody: {o:?}");
    let refused = |m: &mut Mount, why: &str| {
        let o = m.try_mount();
        let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
        assert!(
            vault.join("precious").exists(),
            "the mount deleted a file of the root-only directory tmp/ links to"
        );
        assert!(!o.status.success(), "mounted; wanted refused: {why}");
        assert!(
            err.contains(why) && err.contains("refused") && err.lines().count() == 1,
            "wanted one line with {why:?}: {err}"
        );
    };
    refused(&mut m, &format!("{} refused: mode 0777", p(&dn1)));
    chmod(&dn1, 0o755);
    refused(&mut m, "tmp refused: a symbolic link");
    std::fs::remove_file(dn1.join("tmp")).expect("rm link");
    std::fs::rename(dn1.join("tmp.x"), dn1.join("tmp")).expect("mv tmp back");
    std::os::unix::fs::chown(&dn1, Some(65534), None).expect("chown");
    refused(&mut m, "owned by uid 65534");
    std::os::unix::fs::chown(&dn1, Some(0), None).expect("chown");
    chmod(&m.data, 0o777);
    refused(&mut m, "data directory");
    chmod(&m.data, 0o755);
    m.mount();
    assert_eq!(m.sh_ok("cat kept").trim(), "kept");
    let open = m.dir.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    chmod(&open, 0o777);
    let o = m.leasefs(&["datanode", "add", p(&m.mnt), p(&open)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("refused: mode 0777"),
        "datanode add of a 0777 directory: {o:?}"
    );
}

/// A user's flood of durable small files goes through the block journal
/// (docs/SEMANTICS.md, "The block journal"): what the daemon holds for it
/// stays within the journal's bound (1,024 blocks, and one more per fsync
/// under way; past it an fsync syncs its replicas itself), and it cannot
/// make the root daemon outlive its unmount by the checkpoint's window
/// (ten minutes here): the unmount checkpoints everything at once, and
/// the next mount replays nothing.
#[test]
fn a_users_flood_of_durable_small_files_is_bounded_and_does_not_hold_up_an_unmount() {
    let journal = !etcd_backend();
    let mut m = Mount::with_o("journal_checkpoint=600");
    m.open_to_all();
    m.sh_ok("mkdir u && chown nobody:nogroup u");
    let (writers, each) = (4, 300);
    let flood = m.sh_as_nobody(&format!(
        "for w in $(seq 1 {writers}); do \
           (for i in $(seq 1 {each}); do \
              echo \"$w $i\" | dd of=u/f$w-$i conv=fsync status=none || exit 1; \
            done) & \
         done; wait"
    ));
    assert!(
        flood.status.success(),
        "the flood as nobody failed: {}",
        String::from_utf8_lossy(&flood.stderr)
    );
    if journal {
        let journaled = m.dn_counter("journaled");
        // Three replicas a block. The bound is in blocks, checked as an
        // fsync starts: each writer's fsync under way may pass it once.
        assert!(
            journaled > 0 && journaled <= 3 * (1024 + writers as u64),
            "replicas journaled: {journaled} of {} files",
            writers * each
        );
    }
    m.remount_after_a_prompt_unmount_with_no_journal_left();
    let owned = m.sh_ok("find u -type f -user nobody | wc -l");
    assert_eq!(
        owned.trim(),
        (writers * each).to_string(),
        "files of nobody's"
    );
    assert_eq!(m.sh_ok("find u -type f ! -user nobody | wc -l").trim(), "0");
    for w in 1..=writers {
        for i in [1, each / 2, each] {
            let got = m.read(&format!("u/f{w}-{i}"));
            assert_eq!(got, format!("{w} {i}\n").as_bytes(), "u/f{w}-{i}");
        }
    }
}

//! The control socket as an interface for every user of a root mount
//! (docs/SEMANTICS.md, "The control socket"): `leasefs leases`, `fsck`,
//! `recover-lease` and an election round work as `nobody`; each request
//! is authorized from the peer's credentials (nobody cannot recover a file
//! it cannot write, drop or set another election's fences, write its
//! audit rows, or repair); holder details are shown to their own user
//! only, and paths only where the user could list every directory;
//! requests and connections are bounded.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// One raw request to the control socket as `nobody` (so that the test
/// can send what the CLI never would); the answer line.
fn raw_as_nobody(sock: &Path, req: &Value) -> String {
    let tk = testkit();
    let o = as_nobody(&[
        tk.to_str().expect("testkit path"),
        "control",
        sock.to_str().expect("socket path"),
        &req.to_string(),
    ]);
    assert!(
        o.status.success(),
        "raw request failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn leasefs_as_nobody(args: &[&str]) -> std::process::Output {
    let b = bin();
    let mut cmd = vec![b.to_str().expect("bin path")];
    cmd.extend_from_slice(args);
    as_nobody(&cmd)
}

fn out(o: &std::process::Output) -> String {
    format!(
        "{:?}: {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A process of `nobody` holding `path` open for append until dropped,
/// having written `mine` to it.
fn nobody_writer(m: &Mount, path: &Path) -> Agent {
    let mut w = Agent::spawn_as_nobody(m.dir.path());
    w.ok(&format!("open {} wac", path.display()));
    w.ok("write mine");
    w
}

fn pub_dir(m: &Mount, name: &str) {
    std::fs::create_dir(m.path(name)).expect("mkdir");
    std::fs::set_permissions(m.path(name), std::fs::Permissions::from_mode(0o777))
        .expect("chmod 777");
}

#[test]
fn an_ordinary_user_lists_leases_and_checks_a_root_mount_but_sees_only_its_own_holders() {
    let m = Mount::new();
    m.open_to_all();
    let sock = m.data.join("control.sock");
    let mode = std::fs::metadata(&sock)
        .expect("control.sock")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666, "control socket mode {mode:o}");
    pub_dir(&m, "pub");
    let mut root_writer = Agent::spawn(&m.mnt);
    root_writer.ok("open rootfile wc");
    root_writer.ok("write x");
    root_writer.ok("fsync");
    let _mine = nobody_writer(&m, &m.path("pub/mine"));

    let o = leasefs_as_nobody(&["leases", m.mnt.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "leases as nobody: {}", out(&o));
    let list: Value = serde_json::from_slice(&o.stdout).expect("leases JSON");
    let by_path = |l: &Value, name: &str| {
        l.as_array()
            .and_then(|a| {
                a.iter()
                    .find(|x| x["path"].as_str().is_some_and(|p| p.ends_with(name)))
            })
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed in {l}"))
    };
    let theirs = by_path(&list, "/rootfile");
    assert_eq!(theirs["state"], "held");
    assert!(
        theirs["holder"].is_null(),
        "root's holder shown to nobody: {theirs}"
    );
    assert!(theirs["comm"].is_null(), "{theirs}");
    let own = by_path(&list, "/pub/mine");
    assert!(
        own["holder"].as_str().is_some_and(|h| h.contains(':')),
        "nobody does not see its own holder: {own}"
    );
    // Root sees every holder.
    let o = m.leasefs(&["leases", m.mnt.to_str().unwrap(), "--json"]);
    let list: Value = serde_json::from_slice(&o.stdout).expect("leases JSON");
    assert_eq!(
        by_path(&list, "/rootfile")["holder"],
        format!("{}:{}", hostname(), root_writer.pid)
    );

    // fsck: anybody may check (shallow); only root (the mount's owner
    // here) repairs.
    let o = leasefs_as_nobody(&["fsck", m.mnt.to_str().unwrap(), "--json", "--shallow"]);
    assert!(o.status.code() == Some(0), "fsck as nobody: {}", out(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("fsck JSON");
    let open = report["open_for_write"].as_array().expect("open_for_write");
    assert!(
        open.iter().any(
            |f| f["path"].as_str().is_some_and(|p| p.ends_with("/rootfile")) && f["comm"] == "-"
        ),
        "root's holder hidden in fsck: {report}"
    );
    let o = leasefs_as_nobody(&["fsck", m.mnt.to_str().unwrap(), "--repair"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "fsck --repair as nobody: {}",
        out(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("permission denied"),
        "{}",
        out(&o)
    );
    let o = m.leasefs(&["fsck", m.mnt.to_str().unwrap(), "--repair"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "fsck --repair as root: {}",
        out(&o)
    );
    root_writer.ok("close");
}

/// A deep fsck reads every replica's checksums (R times the data) as
/// root: root and the mounter only. Any user gets the shallow check.
#[test]
fn a_deep_fsck_is_for_root_and_the_mounter_the_shallow_one_for_everybody() {
    let m = Mount::new();
    m.open_to_all();
    std::fs::write(m.path("data"), vec![7u8; 300_000]).expect("write");
    let mnt = m.mnt.to_str().unwrap();
    let o = leasefs_as_nobody(&["fsck", mnt]);
    assert_eq!(o.status.code(), Some(2), "deep fsck as nobody: {}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("permission denied") && err.contains("--shallow") && err.lines().count() == 1,
        "{}",
        out(&o)
    );
    let o = leasefs_as_nobody(&["fsck", mnt, "--shallow", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "shallow fsck as nobody: {}",
        out(&o)
    );
    let report: Value = serde_json::from_slice(&o.stdout).expect("fsck JSON");
    assert_eq!(report["blocks"], 1, "{report}");
    // Root's deep check reads the checksums: it finds a flipped byte that
    // the shallow one (presence, stamp, length) does not.
    let o = m.leasefs(&["fsck", mnt]);
    assert_eq!(o.status.code(), Some(0), "deep fsck as root: {}", out(&o));
    let finalized: Vec<_> = m
        .datanodes
        .iter()
        .flat_map(|d| std::fs::read_dir(d.join("finalized")).expect("finalized/"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_none())
        .collect();
    let victim = &finalized[0];
    let mut bytes = std::fs::read(victim).expect("replica");
    bytes[1000] ^= 0xff;
    std::fs::write(victim, bytes).expect("flip a byte");
    let o = leasefs_as_nobody(&["fsck", mnt, "--shallow"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "shallow fsck as nobody: {}",
        out(&o)
    );
    let o = m.leasefs(&["fsck", mnt]);
    assert_eq!(o.status.code(), Some(1), "deep fsck as root: {}", out(&o));
}

/// Root's writer holding `rel` (created 0644), having written and synced.
fn root_writer(m: &Mount, rel: &str) -> Agent {
    let mut w = Agent::spawn(&m.mnt);
    w.ok(&format!("open {rel} wc"));
    w.ok("write x");
    w.ok("fsync");
    w
}

/// A closed file `rel` with one replica's files removed: fsck reports it.
fn damaged(m: &Mount, rel: &str) {
    use common::faults::{replica, wait_closed};
    std::fs::write(m.path(rel), vec![5u8; 100_000]).expect("write");
    let b = wait_closed(m, rel);
    let r = replica(&m.datanodes[b[0].replicas[0]], b[0].id).expect("a replica");
    std::fs::remove_file(&r.data).expect("rm replica");
    std::fs::remove_file(&r.meta).expect("rm checksums");
}

/// Names and holders go no further than `ls` and `stat` would: as
/// `nobody`, `leases` and `fsck` leave out (and count) the files under a
/// 0700 directory of root's, and `user.leasefs.lease` of a file that
/// `nobody` may read, held by root's writer, shows no pid or command;
/// root sees all of it. Before, nobody was shown `secret/held` and
/// `secret/damaged` by both commands and the holder by the xattr.
#[test]
fn leases_fsck_and_the_lease_xattr_show_a_user_only_what_it_could_list() {
    let m = Mount::new();
    m.open_to_all();
    for (dir, mode) in [("secret", 0o700), ("open", 0o755)] {
        std::fs::create_dir(m.path(dir)).expect("mkdir");
        std::fs::set_permissions(m.path(dir), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
        damaged(&m, &format!("{dir}/damaged"));
    }
    let _hidden = root_writer(&m, "secret/held");
    let shown = root_writer(&m, "open/held");
    let mnt = m.mnt.to_str().unwrap();
    let no_secret = |o: &std::process::Output| {
        assert!(
            !out(o).contains("secret"),
            "a hidden name leaked: {}",
            out(o)
        );
    };

    // leases: the file under secret/ is counted, not named.
    let o = leasefs_as_nobody(&["leases", mnt, "--json"]);
    assert!(o.status.success(), "leases as nobody: {}", out(&o));
    no_secret(&o);
    let list: Value = serde_json::from_slice(&o.stdout).expect("leases JSON");
    let paths: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|l| l["path"].as_str())
        .collect();
    assert_eq!(paths, [format!("{mnt}/open/held")], "{list}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("1 more leases not shown"),
        "{}",
        out(&o)
    );
    let o = leasefs_as_nobody(&["leases", mnt]);
    assert!(
        o.status.success() && out(&o).contains("/open/held"),
        "{}",
        out(&o)
    );
    no_secret(&o);

    // fsck: the status, exit code and totals are the filesystem's; the
    // names under secret/ are left out.
    let o = m.leasefs(&["fsck", mnt, "--shallow", "--json"]);
    assert_eq!(o.status.code(), Some(1), "fsck as root: {}", out(&o));
    let all: Value = serde_json::from_slice(&o.stdout).expect("fsck JSON");
    assert!(all.get("hidden").is_none(), "{all}");
    assert!(out(&o).contains("/secret/damaged") && out(&o).contains("/secret/held"));
    let o = leasefs_as_nobody(&["fsck", mnt, "--shallow", "--json"]);
    assert_eq!(o.status.code(), Some(1), "fsck as nobody: {}", out(&o));
    no_secret(&o);
    let mine: Value = serde_json::from_slice(&o.stdout).expect("fsck JSON");
    let len = |v: &Value, k: &str| v[k].as_array().map_or(0, Vec::len) as u64;
    assert_eq!(mine["hidden"]["open_for_write"], 1, "{mine}");
    assert!(mine["hidden"]["faults"].as_u64() >= Some(1), "{mine}");
    assert_eq!(
        len(&mine, "problems") + mine["hidden"]["problems"].as_u64().unwrap_or(0),
        len(&all, "problems"),
        "{mine}\n{all}"
    );
    assert!(out(&o).contains("/open/damaged") && out(&o).contains("/open/held"));
    let o = leasefs_as_nobody(&["fsck", mnt, "--shallow"]);
    assert_eq!(o.status.code(), Some(1), "fsck as nobody: {}", out(&o));
    no_secret(&o);
    assert!(out(&o).contains("Not shown: 1 open files"), "{}", out(&o));

    // The lease xattr of a file `nobody` may read: state, no holder.
    let path = m.path("open/held");
    let o = as_nobody(&[
        "getfattr",
        "--only-values",
        "-n",
        "user.leasefs.lease",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "getfattr as nobody: {}", out(&o));
    let lease: Value = serde_json::from_slice(&o.stdout).expect("lease JSON");
    assert_eq!(lease["state"], "held", "{lease}");
    assert!(
        lease["holder"].is_null() && lease["comm"].is_null(),
        "root's holder shown to nobody: {lease}"
    );
    assert_eq!(
        m.lease("open/held")["holder"],
        format!("{}:{}", hostname(), shown.pid)
    );
}

#[test]
fn recover_lease_needs_write_permission_on_the_file() {
    let m = Mount::new();
    m.open_to_all();
    pub_dir(&m, "pub");
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open private wc");
    w.ok("write a");
    let o = leasefs_as_nobody(&["recover-lease", m.path("private").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "recover-lease of root's 0644 file: {}",
        out(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("permission denied"),
        "{}",
        out(&o)
    );
    // Nothing happened to the holder.
    w.ok("write b");
    w.ok("close");
    assert_eq!(m.read_string("private"), "a\nb\n");

    // A file nobody may write: recovered, and its holder fenced.
    w.ok("open pub/shared wc");
    w.ok("write c");
    std::fs::set_permissions(m.path("pub/shared"), std::fs::Permissions::from_mode(0o666))
        .expect("chmod 666");
    let o = leasefs_as_nobody(&["recover-lease", m.path("pub/shared").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "recover-lease of a 0666 file: {}",
        out(&o)
    );
    let r = w.cmd("write d");
    assert_eq!(err_name(&r), Some("EIO"), "the old holder is fenced: {r}");

    // A 0600 file of root that an access ACL lets nobody write.
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open pub/acl wc");
    w.ok("write e");
    m.sh_ok("chmod 600 pub/acl && setfacl -m u:nobody:rw pub/acl");
    let o = leasefs_as_nobody(&["recover-lease", m.path("pub/acl").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "recover-lease granted by an ACL: {}",
        out(&o)
    );
    let r = w.cmd("write f");
    assert_eq!(err_name(&r), Some("EIO"), "the old holder is fenced: {r}");
}

#[test]
fn an_election_round_works_for_nobody_and_fences_stay_with_their_election() {
    let m = Mount::new();
    m.open_to_all();
    pub_dir(&m, "e");
    let mark = m.path("e/ran");
    let script = format!("echo $LEASEFS_EPOCH > {}", mark.display());
    let o = leasefs_as_nobody(&[
        "elect",
        m.path("e").to_str().unwrap(),
        "--id",
        "n1",
        "--once",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(o.status.code(), Some(0), "elect as nobody: {}", out(&o));
    assert!(!m.read_string("e/ran").trim().is_empty());
    let o = leasefs_as_nobody(&[
        "elect",
        m.path("e").to_str().unwrap(),
        "--history",
        "--json",
    ]);
    assert!(o.status.success(), "history as nobody: {}", out(&o));
    let events: Value = serde_json::from_slice(&o.stdout).expect("history JSON");
    let kinds: Vec<&str> = events
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert_eq!(kinds, ["elected", "resigned"], "{events}");

    // Root leads another election with a command that keeps running: its
    // group is fenced under root's term.
    std::fs::create_dir(m.path("r")).expect("mkdir r");
    let mut leader = Command::new(bin())
        .arg("elect")
        .arg(m.path("r"))
        .args(["--id", "root1", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn elector");
    let ok = wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(m.path("r/LEADER")).is_ok_and(|s| s.contains("\"pgid\""))
    });
    assert!(ok, "root's elector never led");
    let rec: Value =
        serde_json::from_str(m.read_string("r/LEADER").lines().last().expect("record"))
            .expect("record JSON");
    let pgid = rec["pgid"].as_u64().expect("pgid");
    let epoch = rec["epoch"].as_u64().expect("epoch");
    let sock = m.data.join("control.sock");
    let a = raw_as_nobody(&sock, &json!({"op": "unfence", "pgid": pgid}));
    assert!(
        a.contains("permission denied"),
        "nobody unfenced root's group: {a}"
    );
    let a = raw_as_nobody(
        &sock,
        &json!({"op": "fence", "pgid": 1, "path": "/r/LEADER", "epoch": epoch}),
    );
    assert!(
        a.contains("permission denied"),
        "nobody fenced under root's term: {a}"
    );
    let ev = json!({"election": "/r", "event": "lost", "who": "root1", "host": "h",
                    "pid": 1, "epoch": epoch, "at_ms": 0, "why": "forged"});
    let a = raw_as_nobody(&sock, &json!({"op": "audit", "event": ev}));
    assert!(
        a.contains("permission denied"),
        "nobody forged an audit row: {a}"
    );
    let a = raw_as_nobody(&sock, &json!({"op": "no-such-op"}));
    assert!(a.contains("unknown op"), "{a}");
    kill(leader.id(), libc::SIGTERM);
    if !wait_until(Duration::from_secs(20), || {
        leader.try_wait().ok().flatten().is_some()
    }) {
        kill(leader.id(), libc::SIGKILL);
    }
    let _ = leader.wait();
    let o = m.leasefs(&[
        "elect",
        m.path("r").to_str().unwrap(),
        "--history",
        "--json",
    ]);
    let events: Value = serde_json::from_slice(&o.stdout).expect("history JSON");
    assert!(
        !events.to_string().contains("forged"),
        "a forged row reached the table: {events}"
    );
}

#[test]
fn a_private_data_directory_still_lets_users_reach_the_daemon() {
    // Root's default data directory is under /root (0700): users reach the
    // daemon through the abstract socket the mount root names.
    let private = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod 700");
    let m = Mount::with_data_dir(Opts::default(), private.path().join("data"));
    m.open_to_all();
    let o = leasefs_as_nobody(&["leases", m.mnt.to_str().unwrap()]);
    assert!(o.status.success(), "leases as nobody: {}", out(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("PATH"));
}

#[test]
fn requests_and_connections_are_bounded() {
    let m = Mount::new();
    m.open_to_all();
    let sock = m.data.join("control.sock");
    // A request line over 64 KiB is refused, and the connection closed.
    let big = format!("{{\"op\":\"leases\",\"pad\":\"{}\"}}", "x".repeat(70_000));
    let a = raw_as_nobody(&sock, &serde_json::from_str(&big).expect("json"));
    assert!(a.contains("longer than"), "{a}");

    // A user holding idle connections gets no more than its share and
    // never blocks anybody else; idle connections are dropped.
    let mut idle = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(testkit())
        .args(["control-idle", sock.to_str().expect("socket path"), "4"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn idle client");
    let stdout = idle.stdout.take().expect("stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(
        first.contains("too many control connections"),
        "a fifth idle connection of one user: {first}"
    );
    // Meanwhile root is served at once.
    let t0 = Instant::now();
    let o = m.leasefs(&["leases", m.mnt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "root waited {:?}",
        t0.elapsed()
    );
    let second = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(
        second.starts_with("dropped after"),
        "idle connections: {second}"
    );
    let _ = idle.wait();
}

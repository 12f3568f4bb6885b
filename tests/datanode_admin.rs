//! Datanode administration through the command line (docs/SEMANTICS.md,
//! "Datanode administration"): `leasefs datanode list | add | decommission
//! | remove | balance` on a running mount, a decommission that survives
//! kill -9 of the daemon, a failed disk replaced at mount, and daemons over
//! etcd sharing the registry.

mod common;
use common::etcd::EtcdServer;
use common::faults::*;
use common::*;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const MIB: usize = 1 << 20;

/// One MiB of data that differs for every `i` (no sparse or repeated
/// pages), without a scratch copy on disk.
fn mib(i: u64, buf: &mut [u8]) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// Writes `n` MiB of [`mib`] data to `path` and fsyncs it.
fn write_mib(path: &Path, n: u64) {
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = vec![0u8; MIB];
    for i in 0..n {
        mib(i, &mut buf);
        f.write_all(&buf).expect("write");
    }
    f.sync_all().expect("fsync");
}

/// Whether `path` holds exactly the `n` MiB [`write_mib`] wrote.
fn check_mib(path: &Path, n: u64) -> Result<(), String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (mut want, mut got) = (vec![0u8; MIB], vec![0u8; MIB]);
    for i in 0..n {
        mib(i, &mut want);
        f.read_exact(&mut got)
            .map_err(|e| format!("{}: MiB {i}: {e}", path.display()))?;
        if got != want {
            return Err(format!(
                "{}: MiB {i} reads back other bytes",
                path.display()
            ));
        }
    }
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).map_err(|e| e.to_string())?;
    if rest.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {} bytes too many", path.display(), rest.len()))
    }
}

fn out(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `leasefs datanode ...` against a mount.
impl Mount {
    fn dn(&self, args: &[&str]) -> Output {
        let mut a = vec!["datanode", args[0], self.mnt.to_str().unwrap()];
        a.extend_from_slice(&args[1..]);
        self.leasefs(&a)
    }

    fn dn_ok(&self, args: &[&str]) -> String {
        let o = self.dn(args);
        assert!(o.status.success(), "datanode {args:?}: {}", out(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `datanode list --json`.
    fn datanodes(&self) -> Vec<Value> {
        let s = self.dn_ok(&["list", "--json"]);
        serde_json::from_str::<Value>(s.trim())
            .unwrap_or_else(|e| panic!("list --json printed no JSON ({e}): {s}"))
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The `list --json` object of the datanode at `dir`.
    fn datanode(&self, dir: &Path) -> Value {
        let all = self.datanodes();
        all.iter()
            .find(|d| d["path"].as_str() == dir.to_str())
            .cloned()
            .unwrap_or_else(|| panic!("no datanode at {}: {all:?}", dir.display()))
    }
}

/// fsck exits 0 with no problem at all.
fn assert_healthy(m: &Mount, what: &str) -> Value {
    let f = m.fsck(&[]);
    assert!(
        f.code == 0 && f.stdout.contains("Status: HEALTHY"),
        "{what}: {f:?}\nlog:\n{}",
        m.log()
    );
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "{what}: {r}");
    assert!(problems(&r).is_empty(), "{what}: {r}");
    r
}

fn dirs(dir: &tempfile::TempDir, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| dir.path().join(n)).collect()
}

#[test]
fn list_shows_every_datanode_with_its_usage_and_state() {
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(2),
        o: vec!["block_size=1M".into()],
        ..Opts::default()
    });
    write_mib(&m.path("f"), 4);
    wait_closed(&m, "f");
    let all = m.datanodes();
    assert_eq!(all.len(), 3, "{all:?}");
    let (mut blocks, mut used) = (0, 0);
    for d in &all {
        for k in [
            "id",
            "storage_id",
            "path",
            "state",
            "used_bytes",
            "free_bytes",
            "blocks",
        ] {
            assert!(!d[k].is_null(), "{k} missing: {d}");
        }
        assert_eq!(d["state"], "live", "{d}");
        assert!(d["storage_id"].as_str().unwrap().starts_with("DS-"), "{d}");
        assert!(d["last_heartbeat_ms"].as_u64().is_some(), "{d}");
        blocks += d["blocks"].as_u64().unwrap();
        used += d["used_bytes"].as_u64().unwrap();
    }
    // Four blocks of 1 MiB, two replicas each.
    assert_eq!((blocks, used), (8, 8 * MIB as u64), "{all:?}");
    let table = m.dn_ok(&["list"]);
    assert!(table.starts_with(" ID STORAGE"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");
    // Every user may list; changes (each refused with exit 2, changing
    // nothing) are for root and the mount's owner.
    m.open_to_all();
    // The binary is run directly, not through a shell: a shell of nobody's
    // cannot run a binary under /root (0700), as on a fresh clone there.
    let b = bin();
    let (b, mnt) = (b.to_str().unwrap(), m.mnt.to_str().unwrap());
    let o = as_nobody(&[b, "datanode", "list", mnt, "--json"]);
    assert!(o.status.success(), "{}", out(&o));
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");
    let first = all[0]["path"].as_str().unwrap();
    for change in [
        "add /tmp/leasefs-nobody-dn".to_string(),
        format!("decommission {first} --no-wait"),
        format!("remove {first}"),
        "balance --no-wait".to_string(),
    ] {
        let (verb, rest) = change.split_once(' ').unwrap();
        let mut argv = vec![b, "datanode", verb, mnt];
        argv.extend(rest.split_whitespace());
        let o = as_nobody(&argv);
        assert_eq!(o.status.code(), Some(2), "{change}: {}", out(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("permission denied"),
            "{change}: {}",
            out(&o)
        );
    }
    assert!(m.datanodes().iter().all(|d| d["state"] == "live"));
    assert!(
        !std::path::Path::new("/tmp/leasefs-nobody-dn").exists(),
        "a refused add left the directory it created"
    );
}

/// A datanode added while a file is being written takes the file's next
/// blocks (placement is random, weighted by free space; the new one has as
/// much as the others, so 12 blocks all missing it would be a 1 in 500,000
/// chance).
#[test]
fn a_datanode_added_while_a_writer_runs_takes_its_next_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c]: [PathBuf; 3] = dirs(&dir, &["a", "b", "c"]).try_into().unwrap();
    let m = Mount::with_datanode_paths(
        Opts {
            datanodes: 2,
            replication: Some(2),
            o: vec!["block_size=1M".into()],
            ..Opts::default()
        },
        vec![a, b],
    );
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wca");
    let line = "x".repeat(1023);
    // Four blocks before the add, acknowledged by both replicas.
    w.ok(&format!("rep {} {line}", 4 * 1024));
    w.ok("fsync");
    let before = blocks_of(&m, "f").len();
    let added = m.dn_ok(&["add", c.to_str().unwrap()]);
    assert!(added.contains("attached as id 2"), "{added}");
    w.ok(&format!("rep {} {line}", 12 * 1024));
    w.ok("close");
    let blocks = wait_closed(&m, "f");
    assert_eq!(blocks.len(), 16, "{blocks:?}");
    assert!(
        blocks[..before].iter().all(|b| !b.replicas.contains(&2)),
        "{blocks:?}"
    );
    assert!(
        blocks[before + 1..].iter().any(|b| b.replicas.contains(&2)),
        "no block after the add went to the new datanode: {blocks:?}"
    );
    assert_eq!(m.read("f").len(), 16 * MIB);
    assert_eq!(m.datanode(&c)["state"], "live");
    assert_healthy(&m, "after the add");
}

/// The decommission of a datanode holding a whole file (1 GiB with
/// `LEASEFS_TEST_DECOMMISSION_MIB=1024`; CI writes 256 MiB): the daemon
/// is killed with -9 half-way through the copying, the remount resumes it,
/// the command attaches to it and reports the directory safe to remove;
/// after `remove` fsck is healthy and every byte reads back.
#[test]
fn a_decommission_killed_half_way_resumes_after_remount_and_loses_nothing() {
    let size: u64 = std::env::var("LEASEFS_TEST_DECOMMISSION_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let dir = tempfile::tempdir().unwrap();
    let [a]: [PathBuf; 1] = dirs(&dir, &["a"]).try_into().unwrap();
    let t0 = Instant::now();
    // Sixteen blocks. Copies onto b (id 1, added below) take about 250 ms
    // each (b is a slow disk: its 32 writes of a block, 1 MiB of data and
    // 8 KiB of checksums each, are answered 8 ms late), so there is time
    // to kill the daemon half-way.
    let disk = powercut::Disk::new();
    let b = disk.path("b");
    std::fs::create_dir(&b).unwrap();
    disk.slow("b", 8);
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 1,
            replication: Some(1),
            o: vec![format!("block_size={}M", size / 16)],
            ..Opts::default()
        },
        vec![a.clone()],
    );
    write_mib(&m.path("big"), size);
    wait_closed(&m, "big");
    let wrote = t0.elapsed();
    m.dn_ok(&["add", b.to_str().unwrap()]);
    assert_eq!(m.datanode(&a)["used_bytes"].as_u64(), Some(size << 20));

    // The waiting command, as an operator would run it.
    let mut waiting = Command::new(bin())
        .args(["datanode", "decommission"])
        .arg(&m.mnt)
        .arg(&a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run leasefs datanode decommission");
    let t1 = Instant::now();
    let progress = |m: &Mount| {
        let o = m.dn(&["decommission", a.to_str().unwrap(), "--no-wait"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let left = |s: &str| -> Option<u64> { s.split(": ").nth(1)?.split(' ').next()?.parse().ok() };
    let mut seen = String::new();
    let half = wait_until(Duration::from_secs(120), || {
        seen = progress(&m);
        left(&seen).is_some_and(|n| n <= 8)
    });
    assert!(half, "no progress: {seen}\nlog:\n{}", m.log());
    assert!(
        left(&seen).is_some_and(|n| n > 0),
        "finished before the kill: {seen}"
    );
    assert_eq!(m.datanode(&a)["state"], "decommissioning");
    m.crash();
    let st = waiting.wait().expect("wait for the command");
    let mut err = String::new();
    waiting
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!st.success(), "{err}");
    assert!(err.contains("run this command again"), "{err}");

    // Remount with both: the state is durable, housekeeping resumes.
    m.set_datanodes(vec![a.clone(), b.clone()], Some(1));
    m.mount();
    assert_eq!(m.datanode(&a)["state"], "decommissioning");
    let done = m.dn_ok(&["decommission", a.to_str().unwrap()]);
    assert!(
        done.contains("is decommissioned") && done.contains("safe to remove"),
        "{done}"
    );
    let decommissioned = t1.elapsed();
    // Decommissioned datanodes still serve reads; every block is on b.
    assert_eq!(m.datanode(&a)["state"], "decommissioned");
    assert!(blocks_of(&m, "big").iter().all(|b| b.replicas.contains(&1)));
    m.dn_ok(&["remove", a.to_str().unwrap()]);
    assert_eq!(m.datanodes().len(), 1);
    drop_caches();
    check_mib(&m.path("big"), size).unwrap_or_else(|e| panic!("{e}"));
    assert_healthy(&m, "after remove");
    // remove never deletes the directory's files.
    assert!(std::fs::read_dir(a.join("finalized")).unwrap().count() >= 32);
    eprintln!(
        "decommission of {size} MiB: written in {wrote:?}, decommissioned (16 x 250 ms of injected delay, one kill -9 and a remount included) in {decommissioned:?}, whole test {:?}",
        t0.elapsed()
    );
}

/// A failed disk: the daemon stops, the directory is wiped (`rm -rf`),
/// and the filesystem is mounted with an empty directory in its place: the
/// old datanode is dead, fsck shows the blocks still to copy, and
/// housekeeping restores R. Then another disk fails so that its directory
/// cannot even be read: the mount goes on without it.
#[test]
fn a_failed_datanode_replaced_at_mount_gets_r_restored() {
    let dir = tempfile::tempdir().unwrap();
    let [a, c, d]: [PathBuf; 3] = dirs(&dir, &["a", "c", "d"]).try_into().unwrap();
    // b, replaced below, is on a disk that is made slow for the
    // replacement.
    let disk = powercut::Disk::new();
    let b = disk.path("b");
    std::fs::create_dir(&b).unwrap();
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 3,
            replication: Some(2),
            o: vec!["block_size=1M".into(), "housekeeping_interval=2".into()],
            ..Opts::default()
        },
        vec![a.clone(), b.clone(), c.clone()],
    );
    for k in 0..3 {
        write_mib(&m.path(&format!("f{k}")), 4);
        wait_closed(&m, &format!("f{k}"));
    }
    let on_b = m.datanode(&b)["blocks"].as_u64().unwrap();
    assert!(on_b > 0);
    m.unmount();
    std::fs::remove_dir_all(&b).unwrap();
    std::fs::create_dir(&b).unwrap();
    // Copies onto the replacement (id 3) take about 150 ms each (a 1 MiB
    // block is two writes, answered 75 ms late): fsck right after the
    // mount sees the work still to do.
    disk.slow("b", 75);
    m.mount();
    let r = m.fsck_json().1;
    assert!(
        r["under_replicated"].as_u64().is_some_and(|n| n > 0),
        "fsck shows nothing to copy: {r}"
    );
    let f = m.fsck(&[]);
    assert!(f.stdout.contains("Under-replicated:"), "{f:?}");
    let restored = wait_until(Duration::from_secs(60), || {
        m.fsck_json().1["under_replicated"].as_u64() == Some(0)
    });
    assert!(restored, "R not restored:\n{}", m.log());
    let r = assert_healthy(&m, "after re-replication");
    assert_eq!(datanode_state(&r, 1), "dead", "{r}");
    let old = r["datanode_states"][1]["detail"].as_str().unwrap_or("");
    assert!(old.contains("replaced"), "{r}");
    for k in 0..3 {
        check_mib(&m.path(&format!("f{k}")), 4).unwrap_or_else(|e| panic!("{e}"));
    }
    // The dead one is gone for good: the operator removes it, by storage
    // ID since its path now names the replacement.
    let dead = m.datanodes();
    let dead = dead
        .iter()
        .find(|d| d["state"] == "dead")
        .expect("dead one");
    m.dn_ok(&["remove", dead["storage_id"].as_str().unwrap()]);
    let listed = m.datanodes();
    assert_eq!(listed.len(), 3, "{listed:?}");
    m.unmount();

    // Another disk fails: its directory cannot be read (here: a file in
    // its place). The mount leaves it out and says so.
    std::fs::remove_dir_all(&c).unwrap();
    std::fs::write(&c, b"not a directory\n").unwrap();
    m.set_datanodes(vec![a.clone(), b.clone(), c.clone(), d.clone()], Some(2));
    m.mount();
    let listed = m.datanodes();
    let cd = listed
        .iter()
        .find(|x| x["path"].as_str() == c.to_str())
        .unwrap_or_else(|| panic!("{listed:?}"));
    assert_eq!(cd["state"], "dead", "{cd}");
    assert!(
        cd["detail"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be read"),
        "{cd}"
    );
    let restored = wait_until(Duration::from_secs(60), || {
        m.fsck_json().1["under_replicated"].as_u64() == Some(0)
    });
    assert!(restored, "R not restored:\n{}", m.log());
    assert_healthy(&m, "without the unreadable datanode");
    for k in 0..3 {
        check_mib(&m.path(&format!("f{k}")), 4).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `remove` is refused while the datanode holds the only good replica of a
/// block; `--force` removes it and names the files that lost data; the
/// removed directory is refused at the next mount, and never emptied.
#[test]
fn remove_is_refused_for_an_only_replica_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b]: [PathBuf; 2] = dirs(&dir, &["a", "b"]).try_into().unwrap();
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 1,
            replication: Some(1),
            o: vec!["housekeeping_interval=3600".into()],
            ..Opts::default()
        },
        vec![a.clone()],
    );
    m.put("only-on-a", b"a's only copy\n");
    m.dn_ok(&["add", b.to_str().unwrap()]);
    let refused = m.dn(&["remove", a.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2), "{}", out(&refused));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.starts_with("leasefs: ")
            && err.contains("only good replica")
            && err.contains("/only-on-a"),
        "{err}"
    );
    assert_eq!(m.datanodes().len(), 2);
    let forced = m.dn_ok(&["remove", a.to_str().unwrap(), "--force"]);
    assert_eq!(forced.trim(), "/only-on-a");
    let (code, r) = m.fsck_json();
    assert_eq!(code, 1, "{r}");
    assert!(problems(&r).iter().any(|p| p.0 == "missing_block"), "{r}");
    m.unmount();
    assert!(std::fs::read_dir(a.join("finalized")).unwrap().count() > 0);
    let o = m.try_mount();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("was removed from this filesystem"), "{err}");
    m.set_datanodes(vec![b.clone()], Some(1));
    m.mount();
    assert_eq!(m.datanodes().len(), 1);
}

/// The balancer moves replicas from the fullest datanode to an empty one
/// until their used fractions are within the threshold; blocks keep R
/// replicas and read back.
#[test]
fn balance_evens_used_fractions_within_the_threshold() {
    let t: Vec<Tmpfs> = (0..3).map(|_| Tmpfs::new("64m")).collect();
    let m = Mount::with_datanode_paths(
        Opts {
            datanodes: 2,
            replication: Some(2),
            o: vec!["block_size=1M".into()],
            ..Opts::default()
        },
        vec![t[0].path.clone(), t[1].path.clone()],
    );
    write_mib(&m.path("f"), 24);
    wait_closed(&m, "f");
    m.dn_ok(&["add", t[2].path.to_str().unwrap()]);
    let frac = |d: &Value| {
        d["used_bytes"].as_f64().unwrap() / d["capacity_bytes"].as_f64().unwrap() * 100.0
    };
    let spread = |m: &Mount| {
        let f: Vec<f64> = m.datanodes().iter().map(frac).collect();
        f.iter().cloned().fold(f64::MIN, f64::max) - f.iter().cloned().fold(f64::MAX, f64::min)
    };
    assert!(spread(&m) > 30.0, "{:?}", m.datanodes());
    let said = m.dn_ok(&["balance", "--threshold", "10"]);
    assert!(said.contains("balanced"), "{said}");
    let s = spread(&m);
    assert!(
        s <= 10.0,
        "spread {s} after balancing: {said}\n{:?}",
        m.datanodes()
    );
    assert!(m.datanode(&t[2].path)["blocks"].as_u64().unwrap() > 0);
    for b in wait_closed(&m, "f") {
        assert_eq!(b.replicas.len(), 2, "{b:?}");
    }
    drop_caches();
    check_mib(&m.path("f"), 24).unwrap_or_else(|e| panic!("{e}"));
    assert_healthy(&m, "after balancing");
}

/// Over etcd the registry is shared: a datanode added on one daemon is
/// attached by the other, and a decommission started on one daemon, which
/// is then killed, is seen and finished by the other.
#[test]
fn daemons_over_etcd_share_adds_and_finish_each_others_decommissions() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ds = dirs(&dir, &["d1", "d2", "d3", "d4"]);
    let daemon = |list: Vec<PathBuf>| {
        Mount::with_datanode_paths(
            Opts {
                datanodes: list.len(),
                replication: Some(2),
                o: vec!["block_size=1M".into(), "housekeeping_interval=2".into()],
                args: vec![
                    "--meta".into(),
                    format!("etcd://{}", etcd.endpoint()),
                    "--prefix".into(),
                    "dnadmin".into(),
                ],
            },
            list,
        )
    };
    let mut x = daemon(ds[..3].to_vec());
    let y = daemon(vec![ds[2].clone(), ds[0].clone(), ds[1].clone()]);
    write_mib(&x.path("f"), 6);
    let closed = wait_until(Duration::from_secs(10), || {
        x.fsck_json().1["open_for_write"]
            .as_array()
            .is_some_and(|a| a.is_empty())
    });
    assert!(closed, "f not closed");
    y.dn_ok(&["add", ds[3].to_str().unwrap()]);
    let seen = wait_until(Duration::from_secs(15), || {
        x.datanodes()
            .iter()
            .any(|d| d["path"].as_str() == ds[3].to_str() && d["state"] == "live")
    });
    assert!(
        seen,
        "x did not attach y's new datanode: {:?}",
        x.datanodes()
    );
    let started = x.dn_ok(&["decommission", ds[0].to_str().unwrap(), "--no-wait"]);
    assert!(
        started.contains("being decommissioned") || started.contains("is decommissioned"),
        "{started}"
    );
    x.crash();
    // y sees the decommission and, leading housekeeping once x's election
    // lease is gone, finishes it.
    let done = y.dn_ok(&["decommission", ds[0].to_str().unwrap()]);
    assert!(done.contains("is decommissioned"), "{done}");
    y.dn_ok(&["remove", ds[0].to_str().unwrap()]);
    check_mib(&y.path("f"), 6).unwrap_or_else(|e| panic!("{e}"));
    assert_healthy(&y, "after remove on y");
    assert_eq!(y.datanodes().len(), 3);
}

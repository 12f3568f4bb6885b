//! Datanode identity (docs/SEMANTICS.md, "Replication and faults"): each
//! datanode directory is recognised by its identity file (`DN/VERSION`),
//! never by its place in the `--datanode` list. The list may be reordered,
//! extended or shortened between mounts and nothing is lost; a directory of
//! another filesystem is refused; a recorded datanode left out is dead and
//! housekeeping restores the replication factor from the others; data
//! directories written by the previous release (replicas recorded by
//! position, no identity files) are upgraded in place.

mod common;
use common::faults::*;
use common::*;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Every file in a datanode's `rbw/` and `finalized/`.
fn replica_files(dn: &Path) -> BTreeSet<PathBuf> {
    ["rbw", "finalized"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(dn.join(d))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .collect()
}

/// The `key=` line of a datanode's identity file.
fn identity(dn: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(dn.join("VERSION"))
        .unwrap_or_else(|e| panic!("no identity file in {}: {e}", dn.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {}: {text}", dn.display()))
        .to_string()
}

fn dirs(dir: &tempfile::TempDir, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| dir.path().join(n)).collect()
}

/// fsck exits 0 with no problem: every block whole.
fn assert_healthy(m: &Mount, what: &str) -> serde_json::Value {
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

fn assert_reads(m: &Mount, files: &[(&str, Vec<u8>)], what: &str) {
    drop_caches();
    for (name, data) in files {
        let got =
            std::fs::read(m.path(name)).unwrap_or_else(|e| panic!("{what}: read {name}: {e}"));
        assert!(got == *data, "{what}: {name} reads back other bytes");
    }
}

/// The reported loss: a file written on `A B` (R=2) was gone after a
/// mount with `C D B A`. Then the list is shortened and extended again.
#[test]
fn reordering_extending_and_shortening_the_datanode_list_loses_no_replica() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c, d]: [PathBuf; 4] = dirs(&dir, &["a", "b", "c", "d"]).try_into().unwrap();
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 2,
            replication: Some(2),
            ..Opts::default()
        },
        vec![a.clone(), b.clone()],
    );
    let files = vec![
        ("big", pattern(5 * MIB, 14)),
        ("small", b"a few bytes\n".to_vec()),
    ];
    for (name, data) in &files {
        m.put(name, data);
        wait_closed(&m, name);
    }
    m.unmount();
    let (on_a, on_b) = (replica_files(&a), replica_files(&b));
    assert!(!on_a.is_empty() && !on_b.is_empty());

    m.set_datanodes(vec![c.clone(), d.clone(), b.clone(), a.clone()], Some(2));
    m.mount();
    assert_reads(&m, &files, "on C D B A");
    let r = assert_healthy(&m, "on C D B A");
    for id in 0..4 {
        assert_eq!(datanode_state(&r, id), "live", "{r}");
    }
    m.unmount();
    assert!(replica_files(&a).is_superset(&on_a), "replicas gone from A");
    assert!(replica_files(&b).is_superset(&on_b), "replicas gone from B");
    let ids = (identity(&a, "storageID"), identity(&b, "storageID"));

    // Shortened: C and D (recorded now) are left out, and dead.
    m.set_datanodes(vec![b.clone(), a.clone()], Some(2));
    m.mount();
    assert_reads(&m, &files, "on B A");
    let r = assert_healthy(&m, "on B A");
    assert_eq!(
        (datanode_state(&r, 2), datanode_state(&r, 3)),
        ("dead".into(), "dead".into()),
        "{r}"
    );
    m.unmount();

    // Extended again, in yet another order.
    m.set_datanodes(vec![d, a.clone(), c, b.clone()], Some(2));
    m.mount();
    assert_reads(&m, &files, "on D A C B");
    assert_healthy(&m, "on D A C B");
    m.unmount();
    assert!(replica_files(&a).is_superset(&on_a), "replicas gone from A");
    assert!(replica_files(&b).is_superset(&on_b), "replicas gone from B");
    assert_eq!(
        (identity(&a, "storageID"), identity(&b, "storageID")),
        ids,
        "identity files changed"
    );
}

#[test]
fn a_datanode_of_another_filesystem_or_with_unknown_replicas_is_refused_at_mount() {
    let mut x = Mount::with(Opts {
        datanodes: 2,
        replication: Some(2),
        ..Opts::default()
    });
    let data = pattern(200_000, 3);
    x.put("f", &data);
    wait_closed(&x, "f");
    x.unmount();
    let x_dns = x.datanodes.clone();
    let on_x0 = replica_files(&x_dns[0]);

    let mut y = Mount::with(Opts {
        datanodes: 1,
        replication: Some(1),
        ..Opts::default()
    });
    y.unmount();
    y.set_datanodes(vec![y.datanodes[0].clone(), x_dns[0].clone()], Some(1));
    let out = y.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "mounted with another filesystem's datanode"
    );
    assert!(!is_mounted(&y.mnt));
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("leasefs: ")
            && err.contains("belongs to another leasefs filesystem")
            && err.contains(&x_dns[0].display().to_string()),
        "{err}"
    );

    // Replica files without an identity file that this filesystem never
    // recorded are not taken for a new, empty datanode.
    let stray = x.dir.path().join("stray");
    std::fs::create_dir_all(&stray).unwrap();
    let o = std::process::Command::new("cp")
        .arg("-a")
        .arg(x_dns[1].join("finalized"))
        .arg(&stray)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let mut with_stray = x_dns.clone();
    with_stray.push(stray);
    x.set_datanodes(with_stray, Some(2));
    let out = x.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted with stray replica files");
    assert!(
        err.starts_with("leasefs: ") && err.contains("no identity file"),
        "{err}"
    );

    // Neither refusal touched anything.
    assert_eq!(replica_files(&x_dns[0]), on_x0);
    x.set_datanodes(x_dns, Some(2));
    x.mount();
    assert_reads(&x, &[("f", data)], "after the refusals");
}

#[test]
fn a_missing_datanode_is_reported_dead_and_housekeeping_restores_replication() {
    let dir = tempfile::tempdir().unwrap();
    let all = dirs(&dir, &["a", "b", "c"]);
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 3,
            replication: Some(2),
            o: vec!["housekeeping_interval=1".into()],
            args: Vec::new(),
        },
        all.clone(),
    );
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("f{i}"), pattern(100_000, 40 + i)))
        .collect();
    for (name, data) in &files {
        m.put(name, data);
        wait_closed(&m, name);
    }
    m.unmount();
    let on_b = replica_files(&all[1]);
    assert!(!on_b.is_empty(), "no block was placed on b");

    // b (id 1) is left out.
    m.set_datanodes(vec![all[2].clone(), all[0].clone()], Some(2));
    m.mount();
    let files: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    assert_reads(&m, &files, "without b");
    let (_, r) = m.fsck_json();
    assert_eq!(datanode_state(&r, 1), "dead", "{r}");
    let mut last = serde_json::Value::Null;
    let restored = wait_until(Duration::from_secs(30), || {
        let (code, r) = m.fsck_json();
        last = r;
        code == 0
    });
    assert!(
        restored,
        "replication not restored: {last}\nlog:\n{}",
        m.log()
    );
    for blk in all_blocks(&m.data) {
        let mut reps = blk.replicas.clone();
        reps.sort();
        assert_eq!(
            reps,
            vec![0, 2],
            "block {} is on {:?}",
            blk.id,
            blk.replicas
        );
    }
    m.unmount();
    assert_eq!(replica_files(&all[1]), on_b, "b was touched while left out");

    // b comes back, as after a long absence (its copies dated 20 minutes
    // back: over a shared namespace a young copy may be another daemon's
    // copy in flight, kept for the grace period): its copies are excess,
    // listed but no fault, and a repair removes them.
    let then = std::time::SystemTime::now() - Duration::from_secs(1200);
    for f in std::fs::read_dir(all[1].join("finalized")).unwrap() {
        let f = std::fs::File::options()
            .write(true)
            .open(f.unwrap().path())
            .unwrap();
        f.set_modified(then).unwrap();
    }
    m.set_datanodes(all.clone(), Some(2));
    m.mount();
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "{r}");
    assert!(
        problems(&r)
            .iter()
            .all(|(k, _, dn)| k == "excess_replica" && *dn == Some(1)),
        "{r}"
    );
    let f = m.fsck(&["--repair"]);
    assert_eq!(f.code, 0, "{f:?}");
    assert!(replica_files(&all[1]).is_empty(), "excess copies kept");
    assert_reads(&m, &files, "with b back");
    assert_healthy(&m, "with b back");
}

/// The previous release's layout, from tests/fixtures (see its README):
/// upgraded in place at the first mount, found again in another order at
/// the next, and nothing lost or moved.
#[test]
fn a_data_directory_of_the_previous_release_is_upgraded_in_place() {
    let dir = fixture("prev-release-layout.tar.gz");
    let old = dirs(&dir, &["dn1", "dn2", "dn3"]);
    let before: Vec<BTreeSet<PathBuf>> = old.iter().map(|d| replica_files(d)).collect();
    let sums = dir.path().join("SHA256SUMS");
    let check = |m: &Mount, what: &str| {
        drop_caches();
        m.sh_ok(&format!("sha256sum --quiet -c {}", sums.display()));
        assert_eq!(m.sh_ok("readlink link").trim(), "hello.txt", "{what}");
        let r = assert_healthy(m, what);
        assert_eq!(r["datanodes_alive"], 3, "{what}: {r}");
        for (d, want) in old.iter().zip(&before) {
            assert_eq!(
                &replica_files(d),
                want,
                "{what}: replica files of {}",
                d.display()
            );
        }
    };
    // The database recorded dn1 dn2 dn3 at paths that no longer exist.
    let mut m = mount_fixture(dir, vec![old[2].clone(), old[0].clone(), old[1].clone()]);
    check(&m, "first mount");
    m.unmount();
    let fsid = identity(&old[0], "filesystemID");
    let sids: Vec<String> = old.iter().map(|d| identity(d, "storageID")).collect();
    assert!(old.iter().all(|d| identity(d, "filesystemID") == fsid));
    // Each directory took the id of its old place: dn1 was 0, and so on.
    let db = rusqlite::Connection::open(m.data.join("meta.db")).unwrap();
    let reg: Vec<(i64, String, String)> = db
        .prepare("SELECT id, storage_id, state FROM datanodes ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    drop(db);
    let want: Vec<(i64, String, String)> = sids
        .iter()
        .enumerate()
        .map(|(i, s)| (i as i64, s.clone(), "normal".into()))
        .collect();
    assert_eq!(reg, want);

    m.set_datanodes(
        vec![old[1].clone(), old[2].clone(), old[0].clone()],
        Some(2),
    );
    m.mount();
    check(&m, "second mount, another order");
    let later = pattern(50_000, 9);
    m.put("later", &later);
    wait_closed(&m, "later");
    assert_reads(&m, &[("later", later)], "a new file");
    m.unmount();
    let again: Vec<String> = old.iter().map(|d| identity(d, "storageID")).collect();
    assert_eq!(again, sids, "the upgrade ran twice");
}

/// Mounts an extracted fixture (SQLite metadata, R=2) with its datanode
/// directories in the order given.
fn mount_fixture(dir: tempfile::TempDir, datanodes: Vec<PathBuf>) -> Mount {
    Mount::in_dir(
        Opts {
            datanodes: 3,
            replication: Some(2),
            o: Vec::new(),
            args: vec!["--meta".into(), "sqlite".into()],
        },
        dir,
        datanodes,
    )
}

/// Extracts a fixture of tests/fixtures (see its README) into a new test
/// directory.
fn fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("leasefs-test")
        .tempdir()
        .unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let o = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    dir
}

/// Layout 1 (the release before zero-filled replicas and small files
/// written straight into `finalized/`), from tests/fixtures: upgraded in
/// place at the first mount (only the identity files change, each keeping
/// its IDs), its file left open by a crashed daemon recovered with every
/// fsynced byte, and written to the new way afterwards.
#[test]
fn a_data_directory_of_layout_1_is_upgraded_in_place() {
    let dir = fixture("layout1-release.tar.gz");
    let dns = dirs(&dir, &["dn1", "dn2", "dn3"]);
    let ids: Vec<String> = dns.iter().map(|d| identity(d, "storageID")).collect();
    let fsid = identity(&dns[0], "filesystemID");
    assert!(dns.iter().all(|d| identity(d, "layoutVersion") == "1"));
    let before: Vec<BTreeSet<PathBuf>> = dns.iter().map(|d| replica_files(d)).collect();
    let sums = dir.path().join("SHA256SUMS");
    let mut m = mount_fixture(dir, vec![dns[1].clone(), dns[2].clone(), dns[0].clone()]);
    for (d, id) in dns.iter().zip(&ids) {
        assert_eq!(identity(d, "layoutVersion"), "2", "{}", d.display());
        assert_eq!(&identity(d, "storageID"), id);
        assert_eq!(identity(d, "filesystemID"), fsid);
    }
    assert!(m.log().contains("upgraded in place to 2"), "{}", m.log());
    // Every file, the one the crashed daemon left open with its fsynced
    // 20,000 bytes included; the closed files' replicas untouched.
    wait_closed(&m, "open.bin");
    drop_caches();
    m.sh_ok(&format!("sha256sum --quiet -c {}", sums.display()));
    assert_eq!(m.sh_ok("readlink link").trim(), "hello.txt");
    assert_healthy(&m, "upgraded");
    for (d, want) in dns.iter().zip(&before) {
        let now = replica_files(d);
        let kept: BTreeSet<PathBuf> = want
            .iter()
            .filter(|p| p.parent().is_some_and(|p| p.ends_with("finalized")))
            .cloned()
            .collect();
        assert!(now.is_superset(&kept), "{}: {now:?}", d.display());
    }
    // Written the new way: a writer that fsyncs often, and a small file.
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open synced.log wc");
    for i in 0..12 {
        w.ok(&format!("fill 4096 {}", (b'a' + i as u8) as char));
        w.ok("fsync");
    }
    w.ok("close");
    let want: Vec<u8> = (0..12).flat_map(|i| vec![b'a' + i as u8; 4096]).collect();
    m.put("small.new", b"a small file");
    wait_closed(&m, "synced.log");
    assert_reads(
        &m,
        &[
            ("synced.log", want),
            ("small.new", b"a small file".to_vec()),
        ],
        "written after the upgrade",
    );
    m.unmount();
    m.mount();
    m.sh_ok(&format!("sha256sum --quiet -c {}", sums.display()));
    assert_healthy(&m, "mounted again");
}

/// A file left open by a crashed daemon whose last block lives only on
/// datanodes the next mount leaves out: recovery cannot read the block,
/// and must not take that for an empty block (it would drop the block and
/// its fsynced bytes). The file stays open until they are back.
#[test]
fn recovery_waits_for_a_last_block_that_lives_only_on_datanodes_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let all = dirs(&dir, &["a", "b", "c"]);
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 3,
            replication: Some(2),
            ..Opts::default()
        },
        all.clone(),
    );
    let data = pattern(3 * MIB, 21);
    let src = m.dir.path().join("f.src");
    std::fs::write(&src, &data).unwrap();
    // Writes 1 MiB at a time with an fsync after each, then holds the file.
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wc");
    for off in (0..data.len()).step_by(MIB) {
        w.ok(&format!("write-from {} {off} {MIB}", src.display()));
        w.ok("fsync");
    }
    m.crash();
    drop(w);
    let blocks = all_blocks(&m.data);
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let on = &blocks[0].replicas;
    let other = (0..3).find(|i| !on.contains(i)).unwrap();

    m.set_datanodes(vec![all[other].clone()], Some(1));
    m.mount();
    let (code, r) = m.fsck_json();
    assert_eq!(code, 1, "{r}");
    assert_eq!(r["open_for_write"].as_array().map(Vec::len), Some(1), "{r}");
    m.unmount();

    m.set_datanodes(all, Some(2));
    m.mount();
    assert_reads(&m, &[("f", data)], "with every datanode back");
    assert_healthy(&m, "with every datanode back");
}

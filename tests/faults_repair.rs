//! Corruption and housekeeping (docs/SEMANTICS.md "Replication and
//! faults", "Datanode health, housekeeping and fsck"): a replica whose checksum fails (a flipped
//! byte) or whose file was cut short is skipped on read, reported, and
//! repaired; a lost replica is copied back up to the replication factor;
//! block files that no file references are reported as orphans and
//! removed (by `fsck --repair` at once, by housekeeping after a grace
//! period).

mod common;
use common::faults::*;
use common::*;

use std::time::Duration;

fn mount(o: &str) -> Mount {
    Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        o: if o.is_empty() {
            vec![]
        } else {
            vec![o.to_string()]
        },
        args: Vec::new(),
    })
}

/// Writes `rel` (one block) and returns its data and block once closed.
fn one_block_file(m: &Mount, rel: &str, len: usize, seed: u64) -> (Vec<u8>, Block) {
    let data = pattern(len, seed);
    m.put(rel, &data);
    let b = wait_closed(m, rel);
    assert_eq!(b.len(), 1, "{rel}: {b:?}");
    assert_eq!(b[0].replicas.len(), 3, "{rel}: {b:?}");
    (data, b[0].clone())
}

fn read_cold(m: &Mount, rel: &str) -> Vec<u8> {
    drop_caches();
    m.read(rel)
}

/// Waits until fsck of the mount exits 0; panics with the last report.
fn wait_fsck_clean(m: &Mount, max: Duration) {
    let mut last = None;
    let ok = wait_until(max, || {
        let f = m.fsck(&["--json"]);
        let clean = f.code == 0;
        last = Some(f);
        clean
    });
    assert!(
        ok,
        "fsck not clean within {max:?}: {last:?}\nlog:\n{}",
        m.log()
    );
}

#[test]
fn a_flipped_byte_in_a_finalized_replica_is_skipped_on_read_reported_and_repaired_by_housekeeping()
{
    let m = mount("housekeeping_interval=1");
    let (src, b) = one_block_file(&m, "f", 300_000, 31);
    // The reader tries the replicas in the block's order: corrupt the first.
    let dn = b.replicas[0];
    let r = replica(&m.datanodes[dn], b.id).expect("replica");
    assert_eq!(r.state, "finalized");
    flip_byte(&r.data, 100_000);

    assert!(
        read_cold(&m, "f") == src,
        "the read served the corrupt replica"
    );
    let reported = m.log_lines(&["bad replica", &format!("datanode={dn}")]);
    assert!(
        !reported.is_empty(),
        "the corrupt replica was not reported:\n{}",
        m.log()
    );
    assert!(
        reported.iter().any(|l| l.contains("checksum")),
        "the report does not say the checksum failed: {reported:?}"
    );

    // Housekeeping (every second) repairs the replica it was told about.
    let ok = wait_until(Duration::from_secs(8), || {
        verify_replica(&m.datanodes[dn], b.id, None, &src).is_ok()
    });
    assert!(
        ok,
        "the corrupt replica on datanode {dn} was not repaired: {:?}\nlog:\n{}",
        verify_replica(&m.datanodes[dn], b.id, None, &src),
        m.log()
    );
    wait_fsck_clean(&m, Duration::from_secs(5));
    let now = blocks_of(&m, "f");
    assert_eq!(now[0].replicas.len(), 3, "{now:?}");
    for &d in &now[0].replicas {
        verify_replica(&m.datanodes[d], now[0].id, Some(now[0].gs), &src)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(read_cold(&m, "f") == src);
}

#[test]
fn a_truncated_replica_file_is_skipped_on_read_reported_by_fsck_and_repaired_by_fsck_repair() {
    let m = mount("");
    let (src, b) = one_block_file(&m, "f", 300_000, 32);
    let dn = b.replicas[0];
    let r = replica(&m.datanodes[dn], b.id).expect("replica");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&r.data)
        .unwrap()
        .set_len(100_000)
        .unwrap();

    assert!(
        read_cold(&m, "f") == src,
        "the read did not get the whole file"
    );
    assert!(
        !m.log_lines(&["bad replica", &format!("datanode={dn}")])
            .is_empty(),
        "the short replica was not reported:\n{}",
        m.log()
    );
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 1, "{rep}");
    assert!(
        problems(&rep).contains(&("bad_length".into(), Some(b.id), Some(dn as u64))),
        "fsck does not name the cut replica: {rep}"
    );

    let f = m.fsck(&["--repair"]);
    assert_eq!(
        f.code, 0,
        "fsck --repair should repair everything it found: {f:?}"
    );
    assert!(f.stdout.contains("[repaired]"), "{f:?}");
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 0, "{rep}");
    let now = blocks_of(&m, "f");
    assert_eq!(now[0].replicas.len(), 3, "{now:?}");
    for &d in &now[0].replicas {
        verify_replica(&m.datanodes[d], now[0].id, Some(now[0].gs), &src)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(read_cold(&m, "f") == src);
}

#[test]
fn a_deleted_replica_is_copied_back_by_housekeeping_up_to_the_replication_factor() {
    let m = mount("housekeeping_interval=1");
    let (src, b) = one_block_file(&m, "f", 200_000, 33);
    let dn = b.replicas[1];
    let r = replica(&m.datanodes[dn], b.id).expect("replica");
    std::fs::remove_file(&r.data).unwrap();
    std::fs::remove_file(&r.meta).unwrap();

    // Housekeeping checks presence without being told: R=3 on 3
    // datanodes, so the copy goes back to the same one.
    let ok = wait_until(Duration::from_secs(8), || {
        verify_replica(&m.datanodes[dn], b.id, Some(b.gs), &src).is_ok()
    });
    assert!(ok, "replica on datanode {dn} not copied back:\n{}", m.log());
    let now = blocks_of(&m, "f");
    let mut reps = now[0].replicas.clone();
    reps.sort();
    assert_eq!(reps, vec![0, 1, 2], "{now:?}");
    wait_fsck_clean(&m, Duration::from_secs(5));
    assert!(
        !m.log_lines(&["re-replicated", &format!("datanode={dn}")])
            .is_empty(),
        "re-replication not logged:\n{}",
        m.log()
    );
}

/// Drops an unreferenced replica (data and checksum file) of block `id`
/// into `DN/finalized/`.
fn plant_orphan(dn: &std::path::Path, id: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = pattern(5000, id);
    let d = dn.join("finalized").join(format!("blk_{id}"));
    let meta = dn.join("finalized").join(format!("blk_{id}_5.meta"));
    std::fs::write(&d, &data).unwrap();
    std::fs::write(&meta, meta_bytes(&data)).unwrap();
    (d, meta)
}

/// Dates the files' last change `by` back.
fn age(paths: &[&std::path::Path], by: Duration) {
    let then = std::time::SystemTime::now() - by;
    for p in paths {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(then)
            .unwrap();
    }
}

#[test]
fn an_unreferenced_block_file_is_reported_as_orphan_by_fsck_and_removed_by_fsck_repair() {
    let m = mount("");
    let (src, _) = one_block_file(&m, "f", 100_000, 34);
    let (d, meta) = plant_orphan(&m.datanodes[0], 999_999);
    if etcd_backend() {
        // Over a shared namespace a young unknown replica may be another
        // daemon's block in flight: kept for the grace period.
        // (not even reported: it may be another daemon's block in flight).
        let f = m.fsck(&["--repair"]);
        assert_eq!(f.code, 0, "{f:?}");
        assert!(d.exists() && meta.exists(), "a young replica was removed");
        age(&[&d, &meta], Duration::from_secs(1200));
    }

    let (code, rep) = m.fsck_json();
    assert_eq!(code, 1, "{rep}");
    assert!(
        problems(&rep).contains(&("orphan_replica".into(), Some(999_999), Some(0))),
        "the orphan is not reported: {rep}"
    );
    assert!(
        d.exists() && meta.exists(),
        "plain fsck must not remove anything"
    );

    let f = m.fsck(&["--repair"]);
    assert_eq!(f.code, 0, "{f:?}");
    assert!(
        !d.exists() && !meta.exists(),
        "fsck --repair left the orphan's files"
    );
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 0, "{rep}");
    // Moved aside, not deleted: an unknown replica is a guess.
    let q = rep["quarantined"].as_array().cloned().unwrap_or_default();
    assert!(
        q.iter()
            .any(|e| e["block"] == 999_999 && e["datanode"] == 0),
        "the orphan is not in the quarantine: {rep}"
    );
    assert!(read_cold(&m, "f") == src);
}

#[test]
fn housekeeping_removes_unreferenced_block_files_only_after_the_grace_period() {
    let m = mount("housekeeping_interval=1");
    let (src, _) = one_block_file(&m, "f", 100_000, 35);
    // An old orphan (its files last changed 20 minutes ago) and a fresh one.
    let old = plant_orphan(&m.datanodes[1], 999_001);
    let twenty_min_ago = std::time::SystemTime::now() - Duration::from_secs(1200);
    for p in [&old.0, &old.1] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(twenty_min_ago)
            .unwrap();
    }
    let fresh = plant_orphan(&m.datanodes[1], 999_002);
    let fresh_rbw = {
        let data = pattern(5000, 3);
        let d = m.datanodes[2].join("rbw").join("blk_999003");
        let meta = m.datanodes[2].join("rbw").join("blk_999003_5.meta");
        std::fs::write(&d, &data).unwrap();
        std::fs::write(&meta, meta_bytes(&data)).unwrap();
        (d, meta)
    };

    let gone = wait_until(Duration::from_secs(6), || {
        !old.0.exists() && !old.1.exists()
    });
    assert!(
        gone,
        "housekeeping did not remove the 20-minute-old orphan:\n{}",
        m.log()
    );
    // More rounds (every 0.2 s): that they leave the fresh replicas alone
    // is shown only by letting them run; a round leaves no outward sign.
    let_time_pass(Duration::from_secs(2));
    let mut kept = Vec::new();
    for (what, (d, meta)) in [("finalized/", &fresh), ("rbw/", &fresh_rbw)] {
        if !(d.exists() && meta.exists()) {
            kept.push(what);
        }
    }
    assert!(
        kept.is_empty(),
        "housekeeping removed a fresh unreferenced replica in {kept:?} within its grace period (10 min)\nlog:\n{}",
        m.log()
    );
    assert!(read_cold(&m, "f") == src);
}

/// Writes `n` small files `PREFIX{i}`, one after the other.
fn many_files(m: &Mount, prefix: &str, n: usize) {
    for i in 0..n {
        let p = m.path(&format!("{prefix}{i}"));
        std::fs::write(&p, format!("{i} ").repeat(300))
            .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    }
}

#[test]
fn files_closed_while_housekeeping_runs_keep_their_replicas() {
    let m = mount("housekeeping_interval=0.2");
    many_files(&m, "old", 400);
    let t0 = std::time::Instant::now();
    many_files(&m, "new", 400);
    eprintln!("400 new files in {:?}", t0.elapsed());
    // Rounds (every 0.2 s) after the files closed: that they keep every
    // replica is shown only by letting them run.
    let_time_pass(Duration::from_secs(1));
    let mut bad = Vec::new();
    for i in 0..400 {
        let want = format!("{i} ").repeat(300).into_bytes();
        match std::fs::read(m.path(&format!("new{i}"))) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!("new{i}: {} bytes, other content", got.len())),
            Err(e) => bad.push(format!("new{i}: {e}")),
        }
    }
    let f = m.fsck(&[]);
    assert!(
        bad.is_empty() && f.code == 0,
        "{} of 400 files written while housekeeping ran lost data: {:?}\nfsck: {}\nlog:\n{}",
        bad.len(),
        &bad[..bad.len().min(10)],
        f.stdout.lines().take(20).collect::<Vec<_>>().join("\n"),
        m.log_lines(&["housekeeping repaired"])
            .into_iter()
            .take(10)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn files_written_while_housekeeping_runs_are_never_recovered_under_their_writer() {
    // Housekeeping took its list of live leases, then, later in the same
    // round, recovered every file under construction missing from that
    // list: a file opened in between (or closing, its lease still held)
    // was recovered under its writer, and its replicas got a generation
    // stamp its close then overwrote. Files whose packets stream while
    // rounds run make the window wide.
    let m = mount("housekeeping_interval=0.05");
    many_files(&m, "old", 300);
    let chunk = 64 * 1024;
    let mut bad = Vec::new();
    for i in 0..60 {
        let data = pattern(chunk * 6, i);
        let path = m.path(&format!("w{i}"));
        let r = (|| -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&path)?;
            for c in data.chunks(chunk) {
                f.write_all(c)?;
                // Packets stream while rounds run: a workload paced in time.
                let_time_pass(Duration::from_millis(2));
            }
            Ok(())
        })();
        if let Err(e) = r {
            bad.push(format!("w{i}: write: {e}"));
        }
    }
    for i in 0..60 {
        match std::fs::read(m.path(&format!("w{i}"))) {
            Ok(got) if got == pattern(chunk * 6, i) => {}
            Ok(got) => bad.push(format!("w{i}: {} bytes, other content", got.len())),
            Err(e) => bad.push(format!("w{i}: {e}")),
        }
    }
    let recovered = m.log_lines(&["housekeeping repaired", "no live lease"]);
    let f = m.fsck(&[]);
    assert!(
        bad.is_empty() && recovered.is_empty() && f.code == 0,
        "files written while housekeeping ran: {bad:?}\nrecovered by housekeeping: {recovered:?}\nfsck: {}",
        f.stdout.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

/// Issue 27, defect 7: a `meta.db` restored from a backup forgets every
/// block written since; the sweep at mount used to delete their replicas
/// at once. They go to the quarantine, whole, and fsck lists them.
#[test]
fn a_restored_meta_db_costs_no_replica_newer_than_it() {
    if etcd_backend() {
        // No meta.db to restore: the namespace is in etcd.
        return;
    }
    let mut m = mount("");
    let (old, _) = one_block_file(&m, "old", 100_000, 40);
    m.unmount();
    let backup = tempfile::tempdir().unwrap();
    let db_files = ["meta.db", "meta.db-wal", "meta.db-shm"];
    for f in db_files {
        let from = m.data.join(f);
        if from.exists() {
            std::fs::copy(&from, backup.path().join(f)).unwrap();
        }
    }
    m.mount();
    let (new, b) = one_block_file(&m, "new", 100_000, 41);
    m.unmount();
    for f in db_files {
        let _ = std::fs::remove_file(m.data.join(f));
        let from = backup.path().join(f);
        if from.exists() {
            std::fs::copy(&from, m.data.join(f)).unwrap();
        }
    }
    m.mount();
    assert_eq!(read_cold(&m, "old"), old);
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 0, "{rep}");
    let kept = rep["quarantined"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        kept.iter().filter(|q| q["block"] == b.id).count(),
        3,
        "every replica of the newer block kept: {rep}"
    );
    for q in kept.iter().filter(|q| q["block"] == b.id) {
        let dir = std::path::PathBuf::from(q["path"].as_str().unwrap());
        let data = std::fs::read(dir.join(format!("blk_{}", b.id))).unwrap();
        assert_eq!(data, new, "{}", dir.display());
    }
}

/// What a power cut just after a `close` (no fsync) can leave: one replica
/// torn inside (a page of it never reached the disk) while its siblings
/// are whole. The next mount has housekeeping check the replicas written
/// since each datanode's flush mark, so the torn one is found and repaired
/// without anyone reading it; a crash before that check leaves the mark
/// where it was, and a clean unmount leaves nothing to check
/// (docs/SEMANTICS.md, "Durability", *What a crash may have torn*).
#[test]
fn a_replica_torn_by_a_crash_after_close_is_checked_at_the_next_mount_and_repaired() {
    if etcd_backend() {
        // Daemons sharing a namespace do not check (SEMANTICS).
        return;
    }
    // No housekeeping round while this daemon runs.
    let mut m = mount("housekeeping_interval=3600");
    one_block_file(&m, "old", 200_000, 7);
    m.unmount();
    m.mount();
    assert_eq!(
        m.dn_counter("unflushed_checked"),
        0,
        "a clean unmount left replicas to check"
    );
    let (src, b) = one_block_file(&m, "f", 300_000, 31);
    m.crash();
    let dn = b.replicas[1];
    let r = replica(&m.datanodes[dn], b.id).expect("replica");
    assert_eq!(r.state, "finalized");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&r.data)
            .expect("open replica");
        f.write_all_at(&[0u8; 4096], 131_072).expect("tear");
    }
    m.mount();
    assert_eq!(
        m.dn_counter("unflushed_checked"),
        3,
        "the replicas of f (and not those of old, below the marks) are to be checked:\n{}",
        m.log()
    );
    // Crashed again before housekeeping checked them: the marks stayed.
    m.crash();
    let m = Mount::with_paths(
        Opts {
            datanodes: 3,
            replication: Some(3),
            o: vec!["housekeeping_interval=1".into()],
            args: Vec::new(),
        },
        m.data.clone(),
        m.datanodes.clone(),
    );
    assert_eq!(m.dn_counter("unflushed_checked"), 3, "{}", m.log());
    let ok = wait_until(Duration::from_secs(10), || {
        verify_replica(&m.datanodes[dn], b.id, None, &src).is_ok()
    });
    assert!(
        ok,
        "the torn replica on datanode {dn} was not repaired: {:?}\nlog:\n{}",
        verify_replica(&m.datanodes[dn], b.id, None, &src),
        m.log()
    );
    wait_fsck_clean(&m, Duration::from_secs(5));
    assert!(read_cold(&m, "f") == src);
    let mut m = m;
    m.unmount();
    m.mount();
    assert_eq!(
        m.dn_counter("unflushed_checked"),
        0,
        "checked and unmounted cleanly, yet replicas left to check"
    );
}

/// The flush marks move after housekeeping rounds in which anything was
/// written (docs/SEMANTICS.md, "Durability", *What a crash may have
/// torn*): files closed a round before a crash are below them, so the
/// next mount checks none of their replicas.
#[test]
fn files_closed_a_housekeeping_round_before_a_crash_are_not_checked_at_the_next_mount() {
    if etcd_backend() {
        // Daemons sharing a namespace keep no marks (SEMANTICS).
        return;
    }
    let marks = |m: &Mount| -> Vec<u64> {
        m.datanodes
            .iter()
            .map(|d| {
                std::fs::read_to_string(d.join("FLUSHED"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    };
    let mut m = mount("housekeeping_interval=1");
    let before = marks(&m);
    let mut files = Vec::new();
    for i in 0..3 {
        files.push(one_block_file(&m, &format!("f{i}"), 100_000, 40 + i));
    }
    let stamps: Vec<u64> = files.iter().map(|(_, b)| b.gs).collect();
    let moved = wait_until(Duration::from_secs(10), || {
        marks(&m).iter().all(|&k| stamps.iter().all(|&s| k > s))
    });
    assert!(
        moved,
        "the marks did not move past the files' stamps {stamps:?}: {before:?} -> {:?}\n{}",
        marks(&m),
        m.log()
    );
    // A file whose block opens before a move and closes after it: the
    // mark is past its stamp by then, so its close syncs it. The wait is
    // for the marks to pass the open block's own stamp: a move whose
    // stamp was taken before the block opened (its syncs still running
    // when the write returned) may land after the write and says nothing
    // of the block. The writer is a process of its own: a descriptor of
    // this test process is inherited by every program another test of
    // this binary starts meanwhile, and that copy's close at `exec` is a
    // close of the file (FUSE's FLUSH), which finalizes the block early
    // (CI saw both end the test's premise, and the close then rightly
    // synced nothing).
    let slow = pattern(200_000, 47);
    let src = m.dir.path().join("slow.src");
    std::fs::write(&src, &slow).expect("write slow's source");
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open slow wct");
    w.ok(&format!("write-from {} 0 100000", src.display()));
    let mut open = Vec::new();
    let opened = wait_until(Duration::from_secs(10), || {
        open = blocks_of(&m, "slow");
        open.len() == 1
    });
    assert!(
        opened,
        "slow's block is not recorded open: {open:?}\n{}",
        m.log()
    );
    let gs = open[0].gs;
    let moved = wait_until(Duration::from_secs(10), || {
        marks(&m).iter().all(|&k| k > gs)
    });
    assert!(
        moved,
        "no move past slow's stamp {gs} while it was open: {:?}\n{}",
        marks(&m),
        m.log()
    );
    w.ok(&format!("write-from {} 100000 -", src.display()));
    w.ok("close");
    assert_eq!(
        blocks_of(&m, "slow")[0].gs,
        gs,
        "slow's block was reopened while it was written"
    );
    assert_eq!(
        m.dn_counter("synced_behind_mark"),
        3,
        "slow's replicas were not synced at its close\n{}",
        m.log()
    );
    m.crash();
    m.mount();
    assert_eq!(
        m.dn_counter("unflushed_checked"),
        0,
        "replicas closed before the marks moved were checked:\n{}",
        m.log()
    );
    for (i, (src, _)) in files.iter().enumerate() {
        assert!(read_cold(&m, &format!("f{i}")) == *src);
    }
    assert!(read_cold(&m, "slow") == slow);
}

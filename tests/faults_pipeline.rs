//! Pipeline recovery (docs/SEMANTICS.md "Replication and
//! faults"): a replica that fails mid-write (ENOSPC on a small tmpfs, its
//! directory removed) is dropped, the pipeline is rebuilt from the
//! survivors plus a spare under a new generation stamp, and the writer
//! sees no error; the dropped replica is never served. Only when every
//! replica failed does the writer get EIO, and the acknowledged (fsynced)
//! prefix stays readable.

mod common;
use common::faults::*;
use common::*;

use std::path::PathBuf;
use std::time::Duration;

const MIB: usize = 1 << 20;
const SIZE: usize = 40 * MIB;

/// `n` datanode directories on the local disk, inside `dir`.
fn disk_dns(dir: &tempfile::TempDir, n: usize) -> Vec<PathBuf> {
    (1..=n)
        .map(|i| dir.path().join(format!("disk{i}")))
        .collect()
}

fn scratch(m: &Mount, name: &str, data: &[u8]) -> PathBuf {
    let p = m.dir.path().join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// The whole file, read through the mount with cold caches.
fn read_cold(m: &Mount, rel: &str) -> Vec<u8> {
    drop_caches();
    m.read(rel)
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first wrong byte at offset {i}");
    }
}

/// Turns a stale replica into a self-consistent one that holds other
/// bytes: if a reader ever served it, the read would come back wrong.
fn poison_stale_replica(r: &ReplicaFiles, keep: usize) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&r.data)
        .unwrap();
    f.set_len(keep as u64).unwrap(); // frees room on a full tmpfs first
    drop(f);
    std::fs::write(&r.meta, b"").unwrap();
    let garbage = pattern(keep, 4242);
    std::fs::write(&r.data, &garbage).unwrap();
    std::fs::write(&r.meta, meta_bytes(&garbage)).unwrap();
}

/// A mount on `first` with R = their number, so that the first block's
/// pipeline is all of them, where `rel` starts with the first MiB of
/// `src` (written and closed); then `spares` are added with `leasefs
/// datanode add` (ids following `first`'s). Appending to `rel` reopens its
/// block on the replicas it has, so the spares only come in through
/// pipeline recovery. (A new block's pipeline is drawn weighted by free
/// space: a small tmpfs beside disk directories would hardly ever be in it.)
fn mount_with_spares(
    first: Vec<PathBuf>,
    spares: Vec<PathBuf>,
    o: &[&str],
    rel: &str,
    src: &[u8],
) -> Mount {
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: first.len(),
            replication: Some(first.len()),
            o: o.iter().map(|s| s.to_string()).collect(),
            args: Vec::new(),
        },
        first,
    );
    std::fs::write(m.path(rel), &src[..MIB]).unwrap();
    wait_closed(&m, rel);
    for d in spares {
        let mnt = m.mnt.display().to_string();
        let o = m.leasefs(&["datanode", "add", &mnt, d.to_str().unwrap()]);
        assert!(o.status.success(), "add {}: {o:?}", d.display());
        m.datanodes.push(d);
    }
    m
}

#[test]
fn a_datanode_filling_up_mid_write_is_dropped_and_the_writer_sees_no_error() {
    let tmpfs = Tmpfs::new("8m");
    let disk = tempfile::tempdir().unwrap();
    let d = disk_dns(&disk, 3);
    // The block's pipeline is the tmpfs (datanode 0) and two disks; the
    // third disk is the spare.
    let src = pattern(SIZE, 1);
    let m = mount_with_spares(
        vec![tmpfs.path.clone(), d[0].clone(), d[1].clone()],
        vec![d[2].clone()],
        &[],
        "big",
        &src,
    );
    let srcp = scratch(&m, "big.src", &src);
    let mut w = Writer::start(&m, &srcp, "big", MIB, 0, 8);
    let r = w.result(Duration::from_secs(60));
    assert_eq!(
        r,
        format!("ok {SIZE}"),
        "the writer saw an error; log:\n{}",
        m.log()
    );
    assert_eq!(w.synced(), SIZE as u64);

    assert!(
        !m.log_lines(&["replica write failed", "datanode=0"])
            .is_empty(),
        "the tmpfs datanode never failed a write (was it in the pipeline?):\n{}",
        m.log()
    );
    assert!(
        !m.log_lines(&["pipeline rebuilt"]).is_empty(),
        "no pipeline rebuild logged:\n{}",
        m.log()
    );
    // `leasefs stats` counted the rebuild and the tmpfs's failed write.
    let st = m.leasefs(&["stats", m.mnt.to_str().unwrap(), "--once", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("stats --json");
    assert!(v["pipeline_recoveries"].as_u64() >= Some(1), "{v}");
    let tmp = tmpfs.path.canonicalize().unwrap().display().to_string();
    let dn = v["datanodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == tmp.as_str());
    assert!(dn.is_some_and(|d| d["errors"].as_u64() >= Some(1)), "{v}");

    let blocks = wait_closed(&m, "big");
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let b = &blocks[0];
    assert_eq!(b.len, SIZE as u64, "{b:?}");
    assert!(
        !b.replicas.contains(&0),
        "the full tmpfs is still a replica: {b:?}"
    );
    assert_eq!(
        b.replicas.len(),
        3,
        "a spare datanode should have replaced the tmpfs: {b:?}"
    );
    for &dn in &b.replicas {
        verify_replica(&m.datanodes[dn], b.id, Some(b.gs), &src).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_same(&read_cold(&m, "big"), &src, "big read back");

    // The tmpfs keeps its stale replica (old generation stamp). Make it
    // hold other, self-consistent bytes; reads must still be right.
    let stale = replica(&tmpfs.path, b.id).expect("the dropped replica is still on the tmpfs");
    assert!(
        stale.gs < b.gs,
        "dropped replica gs {} not older than {}",
        stale.gs,
        b.gs
    );
    poison_stale_replica(&stale, 2 * MIB);
    assert_same(
        &read_cold(&m, "big"),
        &src,
        "big read with a poisoned stale replica",
    );
}

#[test]
fn a_datanode_directory_removed_mid_write_is_dropped_and_the_writer_sees_no_error() {
    let m = Mount::with(Opts {
        datanodes: 4,
        replication: Some(3),
        o: vec![],
        args: Vec::new(),
    });
    let src = pattern(SIZE, 2);
    let srcp = scratch(&m, "big.src", &src);
    // 40 pieces of 1 MiB, 150 ms apart: the write spans two heartbeats.
    let mut w = Writer::start(&m, &srcp, "big", MIB, 150, 4);
    assert!(
        wait_until(Duration::from_secs(20), || std::fs::metadata(m.path("big"))
            .map(|md| md.len() >= 6 * MIB as u64)
            .unwrap_or(false)),
        "the writer made no progress"
    );
    let before = blocks_of(&m, "big");
    assert_eq!(before.len(), 1, "{before:?}");
    let victim = before[0].replicas[1];
    remove_live_dir(&m.datanodes[victim]);

    let r = w.result(Duration::from_secs(60));
    assert_eq!(
        r,
        format!("ok {SIZE}"),
        "the writer saw an error; log:\n{}",
        m.log()
    );
    let log = m.log();
    assert!(
        !m.log_lines(&["pipeline rebuilt"]).is_empty(),
        "no pipeline rebuild logged after datanode {victim} was removed:\n{log}"
    );
    let blocks = wait_closed(&m, "big");
    let b = &blocks[0];
    assert!(
        !b.replicas.contains(&victim),
        "removed datanode still a replica: {b:?}"
    );
    assert_eq!(
        b.replicas.len(),
        3,
        "the spare datanode should have joined: {b:?}"
    );
    assert!(
        b.gs > before[0].gs,
        "generation stamp not bumped: {:?} -> {b:?}",
        before[0]
    );
    for &dn in &b.replicas {
        verify_replica(&m.datanodes[dn], b.id, Some(b.gs), &src).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_same(&read_cold(&m, "big"), &src, "big read back");
    // Every block is whole; the missing directory is a dead datanode.
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 0, "{rep}");
    assert!(problems(&rep).is_empty(), "{rep}");
    assert_eq!(datanode_state(&rep, victim as u64), "dead", "{rep}");
}

#[test]
fn when_every_replica_fails_the_writer_gets_eio_and_the_fsynced_prefix_stays_readable() {
    let t1 = Tmpfs::new("8m");
    let t2 = Tmpfs::new("8m");
    let mut m = Mount::with_datanode_paths(
        Opts {
            datanodes: 2,
            replication: Some(2),
            o: vec!["housekeeping_interval=1".into()],
            args: Vec::new(),
        },
        vec![t1.path.clone(), t2.path.clone()],
    );
    let src = pattern(SIZE, 3);
    let srcp = scratch(&m, "big.src", &src);
    let mut w = Writer::start(&m, &srcp, "big", 256 << 10, 0, 4);
    let r = w.result(Duration::from_secs(60));
    assert!(
        r.starts_with("err EIO "),
        "expected EIO once both tmpfs are full, got `{r}`"
    );
    let synced = w.synced() as usize;
    assert!(
        synced >= 4 * MIB,
        "only {synced} bytes were fsynced before the failure"
    );
    eprintln!("writer: {r}; fsynced {synced} bytes");

    // Every stage is checked and reported, so that a failure says where
    // the prefix went missing.
    let mut failures = Vec::new();
    let mut check = |m: &Mount, when: &str| {
        let got = read_cold(m, "big");
        if got.len() < synced {
            failures.push(format!(
                "{when}: the file holds {} bytes, but {synced} were fsynced",
                got.len()
            ));
        } else if got[..] != src[..got.len()] {
            failures.push(format!(
                "{when}: the file holds other bytes than were written"
            ));
        }
    };
    check(&m, "right after the failure (writer gone)");
    // The writer is gone: its file is recovered (housekeeping every 1 s,
    // or at the next mount). Recovery must keep the fsynced prefix. A few
    // rounds are let run: with both datanodes full a round may repair
    // nothing, and then leaves no outward sign to wait for.
    let_time_pass(Duration::from_secs(3));
    check(&m, "after housekeeping rounds");
    m.unmount();
    m.mount();
    check(&m, "after a remount");
    assert!(
        failures.is_empty(),
        "{}\nlog:\n{}",
        failures.join("\n"),
        m.log()
    );
}

#[test]
fn fsync_succeeds_when_a_datanode_holding_an_earlier_block_of_the_file_is_removed() {
    let m = Mount::with(Opts {
        datanodes: 4,
        replication: Some(3),
        o: vec!["block_size=1M".into()],
        args: Vec::new(),
    });
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open big wc");
    // Block 0 full and finalized (the first packet of block 1 closes it),
    // not yet synced.
    a.ok("fill 1300000 x");
    let mut blocks = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            blocks = blocks_of(&m, "big");
            blocks.first().is_some_and(|b| b.finalized)
        }),
        "block 0 not finalized: {blocks:?}"
    );
    let victim = blocks[0].replicas[0];
    remove_live_dir(&m.datanodes[victim]);
    // Two replicas of every block are left: the writer sees no error.
    let r = a.cmd("fsync");
    assert!(
        r.starts_with("ok"),
        "fsync answered `{r}` after datanode {victim} (one of 3 replicas of block 0) was removed\nlog:\n{}",
        m.log()
    );
    a.ok("fill 1000000 y");
    let r = a.cmd("fsync");
    assert!(
        r.starts_with("ok"),
        "second fsync answered `{r}`\nlog:\n{}",
        m.log()
    );
    a.ok("close");
    let mut want = vec![b'x'; 1_300_000];
    want.extend(vec![b'y'; 1_000_000]);
    assert!(read_cold(&m, "big") == want);
}

/// A datanode whose disk filled during a write is full, not dead: it
/// answers heartbeats, takes no new replica, and fsck's status says the
/// blocks are whole (HEALTHY) while listing it as full.
#[test]
fn a_full_datanode_is_alive_out_of_placement_and_fsck_is_healthy_once_repaired() {
    let tmpfs = Tmpfs::new("8m");
    let disk = tempfile::tempdir().unwrap();
    let d = disk_dns(&disk, 3);
    let src = pattern(16 * MIB, 5);
    let m = mount_with_spares(
        vec![tmpfs.path.clone(), d[0].clone(), d[1].clone()],
        vec![d[2].clone()],
        &[],
        "big",
        &src,
    );
    let srcp = scratch(&m, "big.src", &src);
    let mut w = Writer::start(&m, &srcp, "big", MIB, 0, 4);
    assert_eq!(
        w.result(Duration::from_secs(60)),
        format!("ok {}", 16 * MIB)
    );
    wait_closed(&m, "big");

    // Heartbeats (every 3 s) find the disk full.
    let mut last = serde_json::Value::Null;
    let full = wait_until(Duration::from_secs(10), || {
        last = m.fsck_json().1;
        datanode_state(&last, 0) == "full"
    });
    assert!(full, "the full tmpfs is not reported full: {last}");
    let f = m.fsck(&["--repair"]);
    assert_eq!(f.code, 0, "{f:?}");
    let f = m.fsck(&[]);
    assert!(
        f.code == 0 && f.stdout.contains("Status: HEALTHY") && f.stdout.contains("1 full"),
        "{f:?}\nlog:\n{}",
        m.log()
    );
    let (code, r) = m.fsck_json();
    assert_eq!((code, r["datanodes_alive"].as_u64()), (0, Some(4)), "{r}");
    for b in blocks_of(&m, "big") {
        assert_eq!(b.replicas.len(), 3, "{b:?}");
        for &dn in &b.replicas {
            verify_replica(&m.datanodes[dn], b.id, Some(b.gs), &src)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    // Out of placement: new blocks go to the others.
    m.put("small", b"after the disk filled\n");
    let b = wait_closed(&m, "small");
    assert_eq!(b[0].replicas.len(), 3, "{b:?}");
    assert!(
        !b[0].replicas.contains(&0),
        "placed on the full datanode: {b:?}"
    );
}

/// Pipeline recovery after ENOSPC takes a spare with room for the block so
/// far: a datanode too small for it is passed over, so the block does not
/// stay under-replicated until housekeeping.
#[test]
fn pipeline_recovery_after_enospc_takes_a_spare_with_room() {
    let big = Tmpfs::new("8m");
    let small = Tmpfs::new("4m");
    let disk = tempfile::tempdir().unwrap();
    let d = disk_dns(&disk, 3);
    // The block's pipeline is the big tmpfs (0) and two disks (1, 2); the
    // spares are the small tmpfs (3), too small for the block so far, and
    // a disk (4).
    let src = pattern(16 * MIB, 6);
    let m = mount_with_spares(
        vec![big.path.clone(), d[0].clone(), d[1].clone()],
        vec![small.path.clone(), d[2].clone()],
        &["housekeeping_interval=3600"],
        "big",
        &src,
    );
    let srcp = scratch(&m, "big.src", &src);
    let mut w = Writer::start(&m, &srcp, "big", MIB, 0, 4);
    assert_eq!(
        w.result(Duration::from_secs(60)),
        format!("ok {}", 16 * MIB)
    );
    assert!(
        !m.log_lines(&["replica write failed", "datanode=0"])
            .is_empty(),
        "the big tmpfs never filled:\n{}",
        m.log()
    );
    let blocks = wait_closed(&m, "big");
    let b = &blocks[0];
    let mut reps = b.replicas.clone();
    reps.sort();
    assert_eq!(reps, vec![1, 2, 4], "{b:?}\nlog:\n{}", m.log());
    for &dn in &b.replicas {
        verify_replica(&m.datanodes[dn], b.id, Some(b.gs), &src).unwrap_or_else(|e| panic!("{e}"));
    }
}

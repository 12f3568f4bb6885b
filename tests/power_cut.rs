//! Power cuts (docs/SEMANTICS.md "Durability"): leasefs's data directory
//! and datanodes live on the `powercut` test filesystem (tools/powercut),
//! which keeps every change pending until it is made durable and drops
//! what is pending when the test cuts the power. What fsync acknowledged
//! must survive; nothing a cut leaves behind may make a file unreadable or
//! fsck unhealthy. Each test pins one defect and failed before its fix.
//! The random rounds over every workload are `powercut-rounds`
//! (tests/powercut_rounds.rs).

mod common;
use common::faults::*;
use common::powercut::PowerCut;
use common::*;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::time::Duration;

/// `sync_cpus=N`, N the last CPU this process may run on: the power cuts
/// of durable small files make their fsyncs from that CPU, as
/// `sync_cpus=auto` does on a disk whose interrupts are routed there (the
/// datanodes here are loop and FUSE disks, which have none of their own).
/// With one CPU nothing moves.
fn sync_cpus_option() -> (String, bool) {
    let allowed = leasefs::sync_cpus::allowed_cpus();
    let last = allowed.last().copied().unwrap_or(0);
    (format!("sync_cpus={last}"), allowed.len() > 1)
}

/// The fsyncs the daemon made from the CPUs of `sync_cpus`: all `n`, if
/// it could move them.
fn moved_all(pc: &PowerCut, moves: bool, n: u64) {
    let moved = pc.m.stats_counter("syncs_on_completion_cpus");
    eprintln!("one-step fsyncs made from the sync CPUs: {moved}");
    if moves {
        assert!(moved >= n, "{moved} of {n} fsyncs moved");
    }
}

fn power(o: &[&str]) -> PowerCut {
    PowerCut::new(Opts {
        o: o.iter().map(|s| s.to_string()).collect(),
        ..Opts::default()
    })
}

/// Writes `bytes` to a new file and fsyncs it (kept open when returned).
fn write_synced(pc: &PowerCut, rel: &str, bytes: &[u8]) -> File {
    let mut f = File::create(pc.m.path(rel)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    f
}

/// Creates `rel`, writes `bytes` and fsyncs it; the first step that
/// fails, and which.
fn try_durable(pc: &PowerCut, rel: &str, bytes: &[u8]) -> Result<(), String> {
    let mut f = File::create(pc.m.path(rel)).map_err(|e| format!("create: {e}"))?;
    f.write_all(bytes).map_err(|e| format!("write: {e}"))?;
    f.sync_all().map_err(|e| format!("fsync: {e}"))
}

fn append(pc: &PowerCut, rel: &str) -> File {
    OpenOptions::new()
        .append(true)
        .open(pc.m.path(rel))
        .unwrap_or_else(|e| panic!("open {rel} for append: {e}"))
}

/// Reads `rel` after the cut: it must read (no EIO) and be a prefix of
/// `all` at least `min` bytes long.
fn reads_back(pc: &PowerCut, rel: &str, all: &[u8], min: usize) -> Vec<u8> {
    let got = std::fs::read(pc.m.path(rel)).unwrap_or_else(|e| {
        panic!(
            "{rel} cannot be read after the power cut: {e}\nfsck: {}\nlog:\n{}",
            pc.m.fsck(&[]).stdout,
            pc.m.log()
        )
    });
    assert!(
        got.len() >= min && got.len() <= all.len() && got[..] == all[..got.len()],
        "{rel}: {} bytes after the power cut, {min} of them acknowledged; first difference at {:?}",
        got.len(),
        got.iter().zip(all).position(|(a, b)| a != b)
    );
    got
}

fn healthy(pc: &PowerCut) {
    let f = pc.m.fsck(&[]);
    assert_eq!(
        f.code,
        0,
        "fsck after the power cut:\n{}\nlog:\n{}",
        f.stdout,
        pc.m.log()
    );
}

#[test]
fn a_file_fsynced_with_per_file_replica_syncs_survives_a_power_cut() {
    // The metadata's "durable" commit rewrote a counter to its own value:
    // SQLite wrote no frame and synced nothing, so the file's name and
    // blocks were lost with the cut.
    let mut pc = power(&["replica_sync=file"]);
    let data = pattern(300_000, 1);
    drop(write_synced(&pc, "f", &data));
    pc.cut();
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

#[test]
fn replicas_on_a_fuse_datanode_are_synced_file_by_file() {
    // syncfs(2) never reaches a FUSE daemon: with replica_sync=fs (the
    // default) an fsync made nothing durable on such a datanode.
    let mut pc = power(&[]);
    let data = pattern(300_000, 2);
    drop(write_synced(&pc, "f", &data));
    // On ext4 or XFS disks (LEASEFS_TEST_POWERCUT_FS) the datanodes are
    // not FUSE, and syncfs is trusted.
    assert_eq!(
        pc.m.log().contains("syncfs does not reach the daemon"),
        pc.on_fuse(),
        "{}",
        pc.m.log()
    );
    pc.cut();
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

#[test]
fn epochs_after_a_power_cut_are_above_every_epoch_granted_before_it() {
    // Epoch reservations were ordinary (unsynced) commits: after a cut the
    // next grant could repeat an epoch a fenced writer still holds.
    let mut pc = power(&[]);
    let mut before = 0;
    for _ in 0..3 {
        let f = write_synced(&pc, "e", b"x");
        before = before.max(pc.m.epoch("e"));
        drop(f);
    }
    pc.cut();
    let _f = append(&pc, "e");
    let after = pc.m.epoch("e");
    assert!(
        after > before,
        "epoch {after} after the cut, {before} before it"
    );
}

#[test]
fn a_closed_file_reopened_for_append_reads_back_after_a_power_cut() {
    // Reopening for append bumped the replicas' generation stamps before
    // the metadata recorded the bump; a cut in between (the filesystem's
    // journal had committed the renames, not the metadata's log) made
    // every replica "stale": EIO for good.
    let mut pc = power(&[]);
    let mut data = pattern(100_000, 3);
    drop(write_synced(&pc, "f", &data));
    let more = pattern(5_000, 4);
    append(&pc, "f").write_all(&more).unwrap();
    data.extend_from_slice(&more);
    pc.control("commit-namespace");
    pc.cut();
    reads_back(&pc, "f", &data, 100_000);
    healthy(&pc);
    // And it can be appended to again.
    let f = append(&pc, "f");
    f.sync_all().unwrap();
}

#[test]
fn a_truncation_cut_short_by_a_power_cut_leaves_a_readable_file() {
    // A truncation renamed the replicas' checksum files to the new stamp
    // (and synced that) before recording it: after a cut, stale replicas
    // only.
    let mut pc = power(&[]);
    let data = pattern(100_000, 5);
    let f = write_synced(&pc, "f", &data);
    f.set_len(40_000).unwrap();
    drop(f);
    pc.cut();
    // A shrinking truncation is recorded durably before any replica is
    // cut: it is there after the cut, whole.
    let got = reads_back(&pc, "f", &data, 40_000);
    assert_eq!(got.len(), 40_000);
    healthy(&pc);
}

#[test]
fn writes_through_an_o_dsync_descriptor_survive_a_power_cut() {
    // The kernel follows every write on an O_DSYNC (or O_SYNC) descriptor
    // with an fsync, which leasefs makes durable as any other.
    use std::os::unix::fs::OpenOptionsExt;
    let mut pc = power(&[]);
    let data = pattern(70_000, 13);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DSYNC)
        .open(pc.m.path("f"))
        .unwrap();
    for piece in data.chunks(10_000) {
        f.write_all(piece).unwrap();
    }
    pc.cut();
    drop(f);
    reads_back(&pc, "f", &data, data.len());
}

#[test]
fn replicas_of_a_removed_file_go_only_once_the_removal_is_durable() {
    // Replicas were deleted right after the unlink's (unsynced) commit:
    // after a cut the file was back, its blocks on no datanode.
    let mut pc = power(&[]);
    let data = pattern(100_000, 6);
    drop(write_synced(&pc, "f", &data));
    let id = blocks_of(&pc.m, "f")[0].id;
    std::fs::remove_file(pc.m.path("f")).unwrap();
    let gone = wait_until(Duration::from_secs(10), || {
        pc.m.datanodes.iter().all(|dn| {
            ["rbw", "finalized"]
                .iter()
                .all(|d| !dn.join(d).join(format!("blk_{id}")).exists())
        })
    });
    assert!(gone, "the replicas of a removed file were not deleted");
    // The datanodes' directory changes reach the disk on their own.
    pc.control("commit-namespace");
    pc.cut();
    if pc.m.path("f").exists() {
        reads_back(&pc, "f", &data, data.len());
    }
    healthy(&pc);
}

#[test]
fn a_replica_whose_fsync_failed_is_not_counted_by_recovery() {
    // A replica whose sync failed stayed in the block's list: recovery
    // took the minimum over the replicas, its short one included, and
    // cut fsynced bytes off the others.
    let mut pc = power(&["replica_sync=file"]);
    let first = pattern(64_000, 7);
    let mut f = write_synced(&pc, "f", &first);
    let dn = blocks_of(&pc.m, "f")[0].replicas[0];
    pc.control(&format!("fail dn{} EIO --sync", dn + 1));
    let second = pattern(64_000, 8);
    f.write_all(&second).unwrap();
    f.sync_all().unwrap();
    // The fault reached the replica's sync (on ext4 and XFS disks through
    // the loop device's flush), or this test proves nothing.
    let log = pc.m.log();
    assert!(
        log.contains("replica sync failed; the replica leaves the block"),
        "the replica's sync did not fail:\n{log}"
    );
    let mut all = first.clone();
    all.extend_from_slice(&second);
    // The writer is still there at the cut: recovery settles the block.
    pc.cut();
    drop(f);
    reads_back(&pc, "f", &all, all.len());
}

/// The metadata log's sync is where a durable small file's fsync meets
/// the disk (its bytes are journaled there; the log's link count is read
/// before it without its times, `src/fsstat.rs`). When that sync fails
/// the fsync says so, and so does every later one, even once the disk
/// answers again: the pages the failed sync could not write are clean in
/// the page cache now, and a second sync would find nothing to write.
/// What an fsync made durable before the failure survives the cut. (On
/// ext4 and XFS disks the failed flush reaches the WAL's `fdatasync`
/// through the loop device as it would from a disk.)
#[test]
fn a_failed_sync_of_the_metadata_log_fails_that_fsync_and_every_later_one() {
    let mut pc = power(&[]);
    let kept = pattern(4096, 40);
    drop(write_synced(&pc, "kept", &kept));
    pc.control("fail data EIO --sync");
    let e = try_durable(&pc, "lost", &pattern(4096, 41))
        .expect_err("a file made durable over a failed sync of the log");
    assert_eq!(e, "fsync: Input/output error (os error 5)");
    pc.control("heal");
    let e = try_durable(&pc, "later", &pattern(4096, 42))
        .expect_err("a file made durable after a failed sync of the log");
    if pc.on_fuse() {
        assert_eq!(e, "fsync: Input/output error (os error 5)");
    } else {
        // A failed cache flush has already aborted ext4's journal (XFS
        // shuts down): the disk itself refuses the create.
        assert!(e.ends_with("Input/output error (os error 5)"), "{e}");
    }
    pc.cut();
    reads_back(&pc, "kept", &kept, kept.len());
}

#[test]
fn fsync_through_a_read_only_descriptor_makes_what_was_written_durable() {
    // fsync of a descriptor that had not written did nothing.
    let mut pc = power(&[]);
    let data = pattern(300_000, 9);
    std::fs::write(pc.m.path("f"), &data).unwrap();
    File::open(pc.m.path("f")).unwrap().sync_all().unwrap();
    pc.cut();
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

#[test]
fn fsync_covers_blocks_that_earlier_writers_finished() {
    // An fsync synced only the blocks its own descriptor had written.
    let mut pc = power(&["block_size=64K"]);
    let mut data = pattern(200_000, 10);
    std::fs::write(pc.m.path("f"), &data).unwrap();
    let mut f = append(&pc, "f");
    let more = pattern(10, 11);
    f.write_all(&more).unwrap();
    f.sync_all().unwrap();
    drop(f);
    data.extend_from_slice(&more);
    pc.cut();
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

#[test]
fn a_never_fsynced_file_loses_only_its_unsynced_tail_and_fsck_is_clean() {
    // Another file's fsync made the metadata durable, blocks of a file
    // that was never synced included; their replicas' bytes were not, so
    // after a cut the metadata listed blocks no datanode held whole
    // (MissingBlock, EIO, and fsck --repair could not help).
    let mut pc = power(&["block_size=64K"]);
    let data = pattern(200_000, 12);
    std::fs::write(pc.m.path("f"), &data).unwrap();
    drop(write_synced(&pc, "g", b"sync the metadata"));
    pc.cut();
    reads_back(&pc, "f", &data, 0);
    healthy(&pc);
}

#[test]
fn fsync_after_a_copy_of_the_descriptor_was_closed_makes_the_writes_durable() {
    // A close of a copy of the writer's descriptor (a dup, or a child's
    // inherited copy at its exit or exec) closes the file as far as its
    // metadata goes; an fsync through the writer's own descriptor after
    // that made nothing durable.
    let mut pc = power(&[]);
    let data = pattern(300_000, 12);
    let mut f = File::create(pc.m.path("f")).unwrap();
    f.write_all(&data).unwrap();
    drop(f.try_clone().unwrap());
    f.sync_all().unwrap();
    pc.cut();
    drop(f);
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

#[test]
fn fsync_through_a_write_descriptor_that_wrote_nothing_makes_the_file_durable() {
    // The file's earlier writer closed it without an fsync; an fsync
    // through a descriptor opened for writing since, which wrote nothing,
    // made nothing durable.
    let mut pc = power(&[]);
    let data = pattern(300_000, 13);
    std::fs::write(pc.m.path("f"), &data).unwrap();
    let f = append(&pc, "f");
    f.sync_all().unwrap();
    pc.cut();
    drop(f);
    reads_back(&pc, "f", &data, data.len());
    healthy(&pc);
}

/// The power cut: everything not made durable dropped (`None`), or (`Some`
/// seed) the daemon killed, the disks' dirty pages written back without a
/// flush, and a random subset of those pending writes kept: the torn state
/// a real disk can be left in.
fn cut_keeping(pc: &mut PowerCut, seed: Option<u64>) {
    match seed {
        Some(s) => {
            pc.m.crash();
            // The unsynced pages (and their checksums) reach the disk,
            // not its platter: the cut keeps some.
            pc.write_back_unflushed();
            let dropped = pc.control(&format!("cut --subset {s}"));
            eprintln!("cut --subset {s}: {dropped}");
            pc.power_cycle();
        }
        None => drop(pc.cut()),
    }
}

/// The fast-path counters of the mount, summed over its datanodes:
/// (ranged syncs, full syncs, zero fills, one-step replicas).
fn fast_paths(pc: &PowerCut) -> [u64; 4] {
    let [a, b, c, d, _] = counters(pc);
    [a, b, c, d]
}

/// [`fast_paths`], and fsyncs covered by another's `syncfs`.
fn counters(pc: &PowerCut) -> [u64; 5] {
    let [a, b, c, d, e, _] = all_counters(pc);
    [a, b, c, d, e]
}

/// [`counters`], and fsyncs whose metadata a datanode's `syncfs` made
/// durable.
fn all_counters(pc: &PowerCut) -> [u64; 6] {
    sums(
        pc,
        [
            "syncs_ranged",
            "syncs_full",
            "zero_fills",
            "one_step_replicas",
            "syncfs_shared",
            "wal_by_syncfs",
        ],
    )
}

/// Small files whose fsync wrote their replicas whole, before the close.
fn one_step_synced(pc: &PowerCut) -> u64 {
    let [n] = sums(pc, ["one_step_synced"]);
    n
}

/// The datanode counters `keys` of `stats --json`, summed over datanodes.
fn sums<const N: usize>(pc: &PowerCut, keys: [&str; N]) -> [u64; N] {
    let v = pc.m.stats_json();
    let mut sum = [0; N];
    for d in v["datanodes"].as_array().expect("datanodes") {
        for (i, k) in keys.iter().enumerate() {
            sum[i] += d[k].as_u64().expect(k);
        }
    }
    sum
}

#[test]
fn appends_fsynced_by_ranged_syncs_into_zero_filled_replicas_survive_a_power_cut() {
    // The path every writer that fsyncs often takes on ext4 and XFS: the
    // replicas are zero-filled ahead, and each fsync after the first
    // writes back the new pages and flushes the disk's cache, no metadata.
    // Under a random subset of the pending sectors kept, every fsynced
    // byte must read back, and nothing past it may read as zeros.
    // The writer is its own process: a child another test of this binary
    // forks meanwhile would inherit a descriptor of this test's, and its
    // exec would close it, flushing the first piece before its fsync
    // (which then would not be the one-step path this test asserts).
    let src = tempfile::NamedTempFile::new().unwrap();
    let all = pattern(600_000, 21);
    std::fs::write(src.path(), &all).unwrap();
    let src = src.path().display().to_string();
    for seed in [None, Some(11), Some(12)] {
        let mut pc = power(&["block_size=1M"]);
        let mut f = Agent::spawn(&pc.m.path(""));
        f.ok("open f wc");
        let mut synced = 0;
        for piece in all.chunks(7_000).take(60) {
            f.ok(&format!("write-from {src} {synced} {}", piece.len()));
            f.ok("fsync");
            synced += piece.len();
        }
        // Written after the last fsync: may be lost, never zeros.
        f.ok(&format!("write-from {src} {synced} 30000"));
        let [ranged, _, fills, _] = fast_paths(&pc);
        // The first fsync wrote the replicas whole; the appends after it
        // reopened them (docs/SEMANTICS.md, "Durability").
        assert!(one_step_synced(&pc) >= 1, "the first fsync was not whole");
        if pc.on_fuse() {
            assert_eq!(
                (ranged, fills),
                (0, 0),
                "no ranged syncs on a FUSE datanode"
            );
        } else {
            assert!(
                ranged >= 50 && fills >= 1,
                "ranged syncs {ranged}, zero fills {fills}"
            );
        }
        cut_keeping(&mut pc, seed);
        drop(f);
        reads_back(&pc, "f", &all, synced);
        healthy(&pc);
    }
}

#[test]
fn truncate_growth_as_holes_then_fsynced_appends_survive_a_power_cut() {
    // Truncate growth writes no zeros: the replicas grow by holes (and
    // the checksums of zeros). Grown in the middle of a stream that syncs
    // often (its replicas zero-filled ahead on ext4 and XFS), across block
    // boundaries, then fsynced and appended to with fsyncs: after a cut
    // (whole, or keeping a random subset of the pending sectors) the
    // zeros read back as zeros, every fsynced byte is there, and fsck is
    // clean.
    use std::io::{Seek, SeekFrom};
    for seed in [None, Some(31)] {
        let mut pc = power(&["block_size=1M"]);
        let mut f = File::create(pc.m.path("f")).unwrap();
        let head = pattern(200_000, 41);
        for piece in head.chunks(7_001) {
            f.write_all(piece).unwrap();
            f.sync_data().unwrap();
        }
        let grown = head.len() as u64 + (2 << 20) + 333;
        f.set_len(grown).unwrap();
        f.sync_all().unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        let tail = pattern(100_000, 42);
        let mut all = head.clone();
        all.resize(grown as usize, 0);
        let mut synced = all.len();
        for piece in tail.chunks(9_000).take(8) {
            f.write_all(piece).unwrap();
            f.sync_data().unwrap();
            all.extend_from_slice(piece);
            synced = all.len();
        }
        // Not fsynced: may be lost, never zeros.
        f.write_all(&tail[72_000..]).unwrap();
        all.extend_from_slice(&tail[72_000..]);
        cut_keeping(&mut pc, seed);
        drop(f);
        reads_back(&pc, "f", &all, synced);
        healthy(&pc);
    }
}

#[test]
fn a_small_file_written_whole_at_close_and_fsynced_after_survives_a_power_cut() {
    // The one-step path: a file that fits one packet, closed without an
    // fsync, has its replicas written straight into finalized/ with its
    // close; an fsync through a new descriptor makes it durable.
    let mut pc = power(&[]);
    let mut files = Vec::new();
    for i in 0..20u8 {
        let data = pattern(100 + 150 * i as usize, 30 + i as u64);
        let name = format!("s{i}");
        let mut f = File::create(pc.m.path(&name)).unwrap();
        f.write_all(&data).unwrap();
        nix::unistd::close(f.into_raw_fd()).expect("close");
        File::open(pc.m.path(&name)).unwrap().sync_all().unwrap();
        files.push((name, data));
    }
    let [.., one_step] = fast_paths(&pc);
    assert!(one_step >= 20 * 3, "one-step replicas: {one_step}");
    pc.cut();
    for (name, data) in &files {
        reads_back(&pc, name, data, data.len());
    }
    healthy(&pc);
}

/// Agent `a` creates `path` with `data` (passed through the file `from`,
/// outside the mount), fsyncs and closes it.
fn fsynced_by(a: &mut Agent, path: &std::path::Path, data: &[u8], from: &std::path::Path) {
    std::fs::write(from, data).unwrap();
    for cmd in [
        format!("open {} wce", path.display()),
        format!("write-from {} 0 -", from.display()),
        "fsync".into(),
        "close".into(),
    ] {
        let r = a.cmd(&cmd);
        assert!(r.starts_with("ok"), "`{cmd}` answered `{r}`");
    }
}

/// Four writers at once, each creating `files` files under `root` (name
/// and bytes from `file(writer, i)`) with an fsync before the close;
/// returns every file whose fsync returned.
fn fsynced_by_writers(
    root: &std::path::Path,
    files: u64,
    file: impl Fn(u64, u64) -> (String, Vec<u8>) + Sync,
) -> Vec<(String, Vec<u8>)> {
    // Each writer is an agent, a process of its own: a child another test
    // of this binary forks would inherit a descriptor of a writer thread
    // here, and its exec would close it, a FLUSH that streams the file's
    // block before its fsync (which then takes another path).
    let src = tempfile::tempdir().expect("temp dir");
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u64)
            .map(|w| {
                let file = &file;
                let from = src.path().join(format!("w{w}"));
                sc.spawn(move || {
                    let mut a = Agent::spawn(root);
                    let mut done = Vec::new();
                    for i in 0..files {
                        let (name, data) = file(w, i);
                        fsynced_by(&mut a, &root.join(&name), &data, &from);
                        done.push((name, data));
                    }
                    done
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn durable_small_files_of_concurrent_writers_survive_a_power_cut() {
    // Four writers, each creating files of 4 KiB with an fsync before
    // close: their fsyncs meet, and one `syncfs` (and one WAL sync)
    // covers several (grouped, docs/SEMANTICS.md "Durability"). Every
    // file whose fsync returned reads back whole after the cut. Without
    // the block journal (as over etcd, or with its window full), whose
    // own test is `durable_small_files_come_back_from_the_block_journal_*`.
    let (cpus, moves) = sync_cpus_option();
    let mut pc = power(&["journal_checkpoint=0", &cpus]);
    let root = pc.m.path("");
    let acked = fsynced_by_writers(&root, 40, |w, i| {
        (format!("w{w}-{i}"), pattern(4096, 100 * w + i))
    });
    moved_all(&pc, moves, 160);
    let [.., shared] = counters(&pc);
    eprintln!("fsyncs covered by another's syncfs: {shared}");
    // Each file's fsync wrote its replicas whole (docs/SEMANTICS.md,
    // "Durability"): the path this test guards.
    let whole = one_step_synced(&pc);
    assert!(whole >= 160, "replicas written whole by an fsync: {whole}");
    // A close after such an fsync is its one commit, on the request's
    // thread: the cut comes after closes made that way.
    let quiet = pc.m.stats_counter("closes_on_caller");
    eprintln!("closes committed on the caller's thread: {quiet}");
    assert_eq!(quiet, 160, "closes committed on the caller's thread");
    if pc.on_fuse() {
        assert_eq!(shared, 0, "no syncfs on a FUSE datanode");
    } else {
        assert!(
            shared > 0,
            "no two of 160 concurrent fsyncs shared a syncfs"
        );
    }
    pc.cut();
    for (name, data) in &acked {
        reads_back(&pc, name, data, data.len());
    }
    healthy(&pc);
}

#[test]
fn durable_small_files_come_back_from_the_block_journal_after_a_power_cut() {
    // Four writers, each creating files of 4 KiB with an fsync before
    // close, with no checkpoint before the cut (`journal_checkpoint` of
    // ten minutes): every fsync was made durable by the metadata store's
    // WAL holding the block's bytes, and no replica file was synced. The
    // cut takes the replicas (all of them, or a random subset of their
    // sectors); the mount rewrites them from the journal, and every file
    // whose fsync returned reads back whole (docs/SEMANTICS.md,
    // "Durability", "The block journal").
    for seed in [None, Some(17)] {
        let (cpus, moves) = sync_cpus_option();
        let mut pc = power(&["journal_checkpoint=600", &cpus]);
        let root = pc.m.path("");
        let acked = fsynced_by_writers(&root, 20, |w, i| {
            (
                format!("j{w}-{i}"),
                pattern(4096 + 100 * i as usize, 50 * w + i),
            )
        });
        moved_all(&pc, moves, 80);
        let [journaled, whole, deferred] = sums(&pc, ["journaled", "one_step_synced", "deferred"]);
        eprintln!(
            "journaled replicas {journaled}, one-step fsyncs {whole}, held in memory {deferred}"
        );
        // Every journaled replica was held in memory, not written, at its
        // fsync (a few files' worth, far below the datanode's bound).
        assert_eq!(deferred, journaled, "journaled replicas held in memory");
        // Three replicas of each of the 80 files.
        assert_eq!(journaled, 3 * 80, "replicas the journal made durable");
        let [syncs] = sums(&pc, ["syncs_full"]);
        eprintln!("full syncs before the cut: {syncs}");
        cut_keeping(&mut pc, seed);
        let [replayed] = sums(&pc, ["journal_replayed"]);
        eprintln!("replicas rewritten from the journal (cut {seed:?}): {replayed}");
        if seed.is_none() {
            // On the FUSE disk nothing unsynced survives a full cut: every
            // journaled replica is back from the journal alone. On ext4 and
            // XFS a replica written before the cut (housekeeping's listing
            // writes out what the datanode holds) may have reached the disk
            // with a WAL sync (a journal commit writes out ordered data),
            // never all of them.
            if pc.on_fuse() {
                assert_eq!(replayed, journaled, "rewritten from the journal");
            } else {
                assert!(replayed > 0, "no replica rewritten from the journal");
            }
        }
        for (name, data) in &acked {
            reads_back(&pc, name, data, data.len());
        }
        healthy(&pc);
    }
}

#[test]
fn durable_small_files_with_the_wal_beside_the_datanode_survive_a_power_cut() {
    // The data directory and the datanode on one disk, as most mounts
    // have them: each fsync's `syncfs` also makes the metadata store's WAL
    // durable, with no sync of its own (docs/SEMANTICS.md, "One `syncfs`
    // for the replicas and the metadata"). Every file whose fsync
    // returned, its name and its bytes, is back after the cut, half of
    // them with a random subset of the pending writes kept.
    for seed in [None, Some(31)] {
        // Without the block journal, which syncs the WAL alone.
        let mut pc = PowerCut::one_disk(Opts {
            datanodes: 1,
            replication: Some(1),
            o: vec!["journal_checkpoint=0".into()],
            ..Opts::default()
        });
        let mut acked = Vec::new();
        // An agent writes (see `fsynced_by_writers`); closed after the
        // fsync: the close's commits need not be durable, the fsync's must.
        let src = tempfile::tempdir().expect("temp dir");
        let mut a = Agent::spawn(&pc.m.path(""));
        for i in 0..40u64 {
            let name = format!("d{}/f{i}", i % 4);
            if i < 4 {
                std::fs::create_dir(pc.m.path(&format!("d{i}"))).unwrap();
            }
            let data = pattern(4096, 7 * i + 1);
            fsynced_by(&mut a, &pc.m.path(&name), &data, &src.path().join("from"));
            acked.push((name, data));
        }
        drop(a);
        let [.., by_syncfs] = all_counters(&pc);
        eprintln!("fsyncs whose metadata a syncfs made durable: {by_syncfs}");
        let whole = one_step_synced(&pc);
        assert!(whole >= 40, "replicas written whole by an fsync: {whole}");
        // Closes on the request's thread.
        let quiet = pc.m.stats_counter("closes_on_caller");
        assert_eq!(quiet, 40, "closes committed on the caller's thread");
        if pc.on_fuse() {
            assert_eq!(by_syncfs, 0, "no syncfs on a FUSE datanode");
        } else {
            assert!(by_syncfs >= 40, "only {by_syncfs} of 40 fsyncs");
        }
        cut_keeping(&mut pc, seed);
        for (name, data) in &acked {
            reads_back(&pc, name, data, data.len());
        }
        healthy(&pc);
    }
}

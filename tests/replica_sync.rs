//! How an fsync makes replicas durable (docs/SEMANTICS.md "Writing"): with
//! `replica_sync=fs` (the default) one `syncfs(2)` per filesystem holding
//! replicas of the file, so three replicas on one disk cost one cache flush
//! instead of six `fdatasync`s; with `replica_sync=file` the per-file syncs.
//! A stream that fsyncs often has its replicas zero-filled ahead of it, and
//! from then on an fsync writes back only the pages it changed
//! (`sync_file_range`) and flushes each disk once (one `fdatasync`).
//! The daemon's system calls are watched with strace, the only way to see
//! which of these happened from outside.

mod common;
use common::faults::{Tmpfs, blocks_of, replica, verify_replica, wait_closed};
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// strace attached to the daemon (and its threads), tracing the sync calls
/// with the paths of their descriptors; stopped (by pid) when dropped.
struct Trace {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Trace {
    fn attach(m: &Mount) -> Trace {
        let pid = m.pid.expect("daemon pid");
        let out = m.dir.path().join("strace.out");
        let err = m.dir.path().join("strace.err");
        let child = Command::new("strace")
            .args([
                "-f",
                "-y",
                "-qq",
                "-e",
                "trace=syncfs,fdatasync,fsync,sync_file_range",
            ])
            .arg("-o")
            .arg(&out)
            .arg("-p")
            .arg(pid.to_string())
            .stderr(std::fs::File::create(&err).expect("strace stderr"))
            .stdout(Stdio::null())
            .spawn()
            .expect("strace (apt-get install strace)");
        let t = Trace { child, out, err };
        // Attached once every thread of the daemon is traced by it (-qq
        // keeps the attach messages quiet; threads started later are
        // followed with -f).
        let tracer = t.child.id();
        assert!(
            wait_until(Duration::from_secs(10), || traced_by(pid, tracer)),
            "strace did not attach: {}",
            std::fs::read_to_string(&t.err).unwrap_or_default()
        );
        t
    }

    /// Stops tracing and returns the trace. A traced call is written out
    /// before the thread that made it goes on, so every sync behind an
    /// fsync that returned is in it; strace writes the rest as it stops.
    fn finish(mut self) -> String {
        kill(self.child.id(), libc::SIGINT);
        let _ = self.child.wait();
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill(self.child.id(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Whether every thread of process `pid` is traced by `tracer`.
fn traced_by(pid: u32, tracer: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let want = format!("TracerPid:\t{tracer}");
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("status")).is_ok_and(|s| s.lines().any(|l| l == want))
    })
}

/// Appends 4 KiB and fsyncs, `n` times, through one descriptor: a stream
/// that syncs often.
fn append_and_fsync(m: &Mount, rel: &str, n: usize) {
    append_and_fsync_each(m, rel, n, 4096);
}

/// Appends `each` bytes and fsyncs, `n` times, through one descriptor.
fn append_and_fsync_each(m: &Mount, rel: &str, n: usize, each: usize) {
    let mut w = Agent::spawn(m.dir.path());
    w.ok(&format!("open {} wc", m.path(rel).display()));
    for i in 0..n {
        w.ok(&format!("fill {each} {}", (b'A' + i as u8) as char));
        w.ok("fsync");
    }
    w.ok("close");
}

/// Appends of 512 KiB between fsyncs: too far apart for the zero-filling
/// of a stream that syncs often (every fsync stays a full one).
const FAR: usize = 512 << 10;

/// Lines of the trace that sync a replica file (data or checksums) one by
/// one, and `syncfs` calls.
fn count(trace: &str) -> (usize, usize) {
    let per_file = trace
        .lines()
        .filter(|l| l.contains("fdatasync(") || l.contains("fsync("))
        .filter(|l| l.contains("/blk_"))
        .count();
    let syncfs = trace.lines().filter(|l| l.contains("syncfs(")).count();
    (per_file, syncfs)
}

fn expected(m: &Mount, rel: &str, n: usize) -> Vec<u8> {
    expected_each(m, rel, n, 4096)
}

fn expected_each(m: &Mount, rel: &str, n: usize, each: usize) -> Vec<u8> {
    let want: Vec<u8> = (0..n).flat_map(|i| vec![65 + i as u8; each]).collect();
    assert_eq!(m.read(rel), want);
    want
}

/// Lines of the trace with `sync_file_range` on a replica file.
fn ranged(trace: &str) -> usize {
    trace
        .lines()
        .filter(|l| l.contains("sync_file_range(") && l.contains("/blk_"))
        .count()
}

#[test]
fn three_replicas_on_one_disk_take_one_syncfs_per_fsync() {
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        ..Opts::default()
    });
    let t = Trace::attach(&m);
    append_and_fsync_each(&m, "f", 3, FAR);
    let trace = t.finish();
    let (per_file, syncfs) = count(&trace);
    assert_eq!(per_file, 0, "replica files synced one by one:\n{trace}");
    assert_eq!(syncfs, 3, "one syncfs per fsync:\n{trace}");
    assert_eq!(ranged(&trace), 0, "{trace}");
    expected_each(&m, "f", 3, FAR);
}

#[test]
fn a_stream_that_fsyncs_often_writes_back_its_pages_and_flushes_each_disk_once_per_fsync() {
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        ..Opts::default()
    });
    let t = Trace::attach(&m);
    let n = 20;
    append_and_fsync(&m, "f", n);
    let trace = t.finish();
    let (per_file, syncfs) = count(&trace);
    // The first two fsyncs: one syncfs each. Then the replicas are
    // zero-filled ahead, 1 MiB (data and checksum file of each, synced
    // once), and every later fsync of the 4 KiB appends is ranged: one
    // fdatasync (the disk's cache flush) for the three replicas.
    assert_eq!(syncfs, 2, "{trace}");
    assert_eq!(per_file, 3 * 2 + (n - 2), "{trace}");
    // Writeback started and waited for, on data and checksums of each.
    assert!(ranged(&trace) >= (n - 2) * 3 * 2 * 2, "{trace}");
    expected(&m, "f", n);
    // Closed, the replicas are as long as the data again.
    let b = wait_closed(&m, "f").remove(0);
    assert_eq!(b.replicas.len(), 3);
    for dn in &m.datanodes {
        let r = replica(dn, b.id).expect("a replica on each datanode");
        assert_eq!(std::fs::metadata(&r.data).unwrap().len(), (n * 4096) as u64);
        verify_replica(dn, b.id, Some(b.gs), &expected(&m, "f", n)).unwrap();
    }
}

#[test]
fn replicas_on_two_filesystems_take_one_syncfs_each() {
    let tmpfs = Tmpfs::new("64m");
    let disk = tempfile::tempdir().unwrap();
    let dns: Vec<PathBuf> = vec![tmpfs.path.clone(), disk.path().join("dn2")];
    let m = Mount::with_datanode_paths(
        Opts {
            datanodes: 2,
            replication: Some(2),
            ..Opts::default()
        },
        dns.clone(),
    );
    let t = Trace::attach(&m);
    append_and_fsync_each(&m, "f", 3, FAR);
    let trace = t.finish();
    let (per_file, syncfs) = count(&trace);
    assert_eq!(per_file, 0, "{trace}");
    assert_eq!(syncfs, 2 * 3, "{trace}");
    // Each syncfs went through one of the two datanodes' roots.
    for d in &dns {
        let root = d.to_str().unwrap();
        assert!(
            trace
                .lines()
                .any(|l| l.contains("syncfs(") && l.contains(root)),
            "no syncfs through {}:\n{trace}",
            Path::new(root).display()
        );
    }
    expected_each(&m, "f", 3, FAR);
    // Zero-filled ahead, each disk gets its own cache flush.
    let t = Trace::attach(&m);
    let mut w = Agent::spawn(m.dir.path());
    w.ok(&format!("open {} wa", m.path("f").display()));
    for i in 0..6 {
        w.ok(&format!("fill 4096 {}", (b'C' + i as u8) as char));
        w.ok("fsync");
    }
    w.ok("close");
    let trace = t.finish();
    let flushes: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("fdatasync(") && l.contains("/rbw/blk_"))
        .collect();
    for d in &dns {
        let root = d.to_str().unwrap();
        assert!(
            flushes.iter().any(|l| l.contains(root)),
            "no cache flush through {}:\n{trace}",
            Path::new(root).display()
        );
    }
}

#[test]
fn a_block_cut_by_ftruncate_and_written_again_syncs_without_failing_a_replica() {
    // ftruncate to the middle of the block finalises it, cuts it under a new
    // generation stamp, and the next write reopens it under another: the
    // fsync after must sync the replica as it is now, not the cut-off
    // stamp (which would mark every datanode dead).
    for mode in ["replica_sync=file", "replica_sync=fs"] {
        let m = Mount::with(Opts {
            datanodes: 3,
            replication: Some(3),
            o: vec![mode.into()],
            ..Opts::default()
        });
        let mut w = Agent::spawn(m.dir.path());
        for cmd in [
            &format!("open {} xc", m.path("f").display()),
            "burst 10000 a",
            "fsync",
            "ftruncate 5000",
            "seek 5000",
            "burst 3000 b",
            "fsync",
            "burst 3000 c",
            "fsync",
            "close",
        ] {
            let r = w.cmd(cmd);
            assert!(
                r.starts_with("ok"),
                "{mode}: `{cmd}` answered `{r}`\n{}",
                m.log()
            );
        }
        let want: Vec<u8> = [vec![b'a'; 5000], vec![b'b'; 3000], vec![b'c'; 3000]].concat();
        assert_eq!(m.read("f"), want, "{mode}");
        assert!(
            !m.log().contains("replica sync failed"),
            "{mode}:\n{}",
            m.log()
        );
    }
}

#[test]
fn a_small_fsynced_file_has_no_replica_file_until_a_read_or_the_checkpoint_needs_one() {
    // The block journal (docs/SEMANTICS.md "The block journal"): the fsync
    // of a small file written whole is made durable by the metadata log,
    // which holds the block's bytes; the datanodes hold the replicas in
    // memory. A read writes the replica it reads; the checkpoint writes
    // (and syncs) the others. No housekeeping pass (whose listing writes
    // every held replica) runs meanwhile.
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        o: vec![
            "journal_checkpoint=3".into(),
            "housekeeping_interval=3600".into(),
        ],
        ..Opts::default()
    });
    // In a process of its own: no fork of this test binary inherits the
    // descriptor (whose close would write the block before the fsync).
    let mut w = Agent::spawn(m.dir.path());
    for cmd in [
        &format!("open {} xc", m.path("s").display()),
        "burst 4000 s",
        "fsync",
        "close",
    ] {
        let r = w.cmd(cmd);
        assert!(r.starts_with("ok"), "`{cmd}` answered `{r}`\n{}", m.log());
    }
    let b = blocks_of(&m, "s");
    assert_eq!(b.len(), 1);
    let on_disk = || {
        m.datanodes
            .iter()
            .filter(|dn| replica(dn, b[0].id).is_some())
            .count()
    };
    assert_eq!(on_disk(), 0, "replica files written at the fsync");
    assert_eq!(m.dn_counter("journaled"), 3);
    assert_eq!(m.dn_counter("deferred"), 3);
    assert_eq!(m.read("s"), vec![b's'; 4000]);
    assert_eq!(on_disk(), 1, "the read writes the replica it reads, only");
    assert!(
        wait_until(Duration::from_secs(30), || on_disk() == 3),
        "the checkpoint wrote every replica\n{}",
        m.log()
    );
    for dn in &m.datanodes {
        verify_replica(dn, b[0].id, Some(b[0].gs), &[b's'; 4000]).unwrap();
    }
}

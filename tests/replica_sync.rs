//! How an fsync makes replicas durable (docs/SEMANTICS.md "Durability"): with
//! `replica_sync=fs` (the default) one `syncfs(2)` per filesystem holding
//! replicas of the file, so three replicas on one disk cost one cache flush
//! instead of six `fdatasync`s; with `replica_sync=file` the per-file syncs.
//! The daemon's system calls are watched with strace, the only way to see
//! which of the two happened from outside.

mod common;
use common::faults::Tmpfs;
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
            .args(["-f", "-y", "-qq", "-e", "trace=syncfs,fdatasync,fsync"])
            .arg("-o")
            .arg(&out)
            .arg("-p")
            .arg(pid.to_string())
            .stderr(std::fs::File::create(&err).expect("strace stderr"))
            .stdout(Stdio::null())
            .spawn()
            .expect("strace (apt-get install strace)");
        let t = Trace { child, out, err };
        // Attached once it has written its (empty) output file and the
        // threads are seized; -qq keeps the attach messages quiet, so wait
        // for the file and a moment more.
        assert!(
            wait_until(Duration::from_secs(10), || t.out.exists()),
            "strace did not start: {}",
            std::fs::read_to_string(&t.err).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
        t
    }

    /// Stops tracing and returns the trace.
    fn finish(mut self) -> String {
        std::thread::sleep(Duration::from_millis(200));
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

/// Appends 4 KiB and fsyncs, `n` times, through one descriptor.
fn append_and_fsync(m: &Mount, rel: &str, n: usize) {
    let out = py_run(
        m.dir.path(),
        r#"
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(int(sys.argv[2])):
    os.write(fd, bytes([65 + i]) * 4096)
    os.fsync(fd)
os.close(fd)
"#,
        &[m.path(rel).to_str().unwrap(), &n.to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

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
    let want: Vec<u8> = (0..n).flat_map(|i| vec![65 + i as u8; 4096]).collect();
    assert_eq!(m.read(rel), want);
    want
}

#[test]
fn three_replicas_on_one_disk_take_one_syncfs_per_fsync() {
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        ..Opts::default()
    });
    let t = Trace::attach(&m);
    append_and_fsync(&m, "f", 4);
    let trace = t.finish();
    let (per_file, syncfs) = count(&trace);
    assert_eq!(per_file, 0, "replica files synced one by one:\n{trace}");
    assert_eq!(syncfs, 4, "one syncfs per fsync:\n{trace}");
    expected(&m, "f", 4);
}

#[test]
fn replica_sync_file_syncs_data_and_checksums_of_every_replica() {
    let m = Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        o: vec!["replica_sync=file".into()],
        ..Opts::default()
    });
    let t = Trace::attach(&m);
    append_and_fsync(&m, "f", 4);
    let trace = t.finish();
    let (per_file, syncfs) = count(&trace);
    assert_eq!(syncfs, 0, "{trace}");
    // Data and checksum file of three replicas, at each of 4 fsyncs.
    assert_eq!(per_file, 4 * 2 * 3, "{trace}");
    expected(&m, "f", 4);
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
    append_and_fsync(&m, "f", 3);
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
    expected(&m, "f", 3);
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
        let out = py_run(
            m.dir.path(),
            r#"
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"a" * 10000)
os.fsync(fd)
os.ftruncate(fd, 5000)
os.lseek(fd, 5000, os.SEEK_SET)
os.write(fd, b"b" * 3000)
os.fsync(fd)
os.write(fd, b"c" * 3000)
os.fsync(fd)
os.close(fd)
"#,
            &[m.path("f").to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "{mode}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            m.log()
        );
        let want: Vec<u8> = [vec![b'a'; 5000], vec![b'b'; 3000], vec![b'c'; 3000]].concat();
        assert_eq!(m.read("f"), want, "{mode}");
        assert!(
            !m.log().contains("replica sync failed"),
            "{mode}:\n{}",
            m.log()
        );
    }
}

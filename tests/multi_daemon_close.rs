//! A close releases the file across daemons before it returns (issue 31
//! item 4, docs/SEMANTICS.md "Several daemons"): two daemons over one etcd
//! and the same datanode directories, `lease_wait=0`.
//!
//! - Appends alternate between the daemons, each `open(O_APPEND)`, one
//!   line, `close()`, and the next open on the other daemon, with no
//!   retry: none is refused, each line lands where the writer's file
//!   position says (the kernel's size of the file was the file's when
//!   the grant came), and the file's epoch reads the same on both daemons
//!   while a writer holds it and after its close, as does its entry in
//!   `leasefs leases`. `LEASEFS_CLOSE_ROUNDS` (default 100; 500 by hand).
//! - A descriptor duplicated before a close writes on after it (as a shell
//!   redirection does: open, dup2, close, write): it takes the file again.
//!   If another daemon's writer took it in between, that write is refused
//!   with `EBUSY` (an fsync through it succeeds, as a reader's) and the
//!   other writer's bytes stay; once it is free the copy's appends land at
//!   the end.

mod common;

use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::*;

fn rounds() -> usize {
    std::env::var("LEASEFS_CLOSE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn open_append(p: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}

fn dup(f: &File) -> File {
    // SAFETY: dup of a descriptor this test owns; the new one is owned by
    // the returned File.
    let fd = unsafe { libc::dup(f.as_raw_fd()) };
    assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor nobody else owns.
    unsafe { File::from_raw_fd(fd) }
}

/// The state, holder and epoch of `f` as `leasefs leases` lists it on `m`.
fn listed(m: &Mount) -> String {
    let o = m.leasefs(&["leases", m.mnt.to_str().expect("utf-8 path"), "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).expect("leases JSON");
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["path"].as_str().is_some_and(|p| p.ends_with("/f")))
        .map(|l| format!("{} {} {}", l["state"], l["holder"], l["epoch"]))
        .collect::<Vec<_>>()
        .join(";")
}

#[test]
fn close_then_open_on_another_daemon_is_never_refused() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let o = ["soft_limit=3"];
    let ms = [
        daemon(&etcd, "closerel", &dns, &o),
        daemon(&etcd, "closerel", &dns, &o),
    ];
    let n = rounds();
    let (mut refused, mut misplaced, mut epochs_differ) = (Vec::new(), Vec::new(), Vec::new());
    let mut listings_differ = Vec::new();
    let mut expect = Vec::new();
    let t0 = std::time::Instant::now();
    for i in 0..n {
        let m = &ms[i % 2];
        let mut f = match open_append(&m.path("f")) {
            Ok(f) => f,
            Err(e) => {
                refused.push(format!("open {i} on daemon {}: {e}", i % 2));
                continue;
            }
        };
        let line = format!("{:06} d{}\n", i, i % 2);
        f.write_all(line.as_bytes()).expect("write");
        let pos = f.stream_position().expect("position");
        let at = expect.len() as u64;
        if pos != at + line.len() as u64 {
            misplaced.push(format!(
                "line {i} on daemon {}: position {pos} after it, the file ended at {at}",
                i % 2
            ));
        }
        expect.extend_from_slice(line.as_bytes());
        if i % 10 == 4 {
            // While daemon i % 2 holds the file, both show its grant.
            let e: Vec<Option<String>> = ms
                .iter()
                .map(|m| m.xattr("f", "user.leasefs.epoch"))
                .collect();
            if e[0] != e[1] {
                epochs_differ.push(format!("while line {i}'s writer holds the file: {e:?}"));
            }
            // And `leasefs leases` lists it alike on both.
            let l: Vec<String> = ms.iter().map(listed).collect();
            if l[0] != l[1] || !l[0].contains("held") {
                listings_differ.push(format!("while line {i}'s writer holds the file: {l:?}"));
            }
        }
        drop(f);
        if i % 10 == 9 {
            let e: Vec<Option<String>> = ms
                .iter()
                .map(|m| m.xattr("f", "user.leasefs.epoch"))
                .collect();
            if e[0] != e[1] {
                epochs_differ.push(format!("after line {i}: {e:?}"));
            }
        }
    }
    eprintln!(
        "{n} alternations in {:?}: {} refused, {} misplaced, {} epoch reads differing",
        t0.elapsed(),
        refused.len(),
        misplaced.len(),
        epochs_differ.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {n} opens right after a close on the other daemon refused; first: {:?}",
        refused.len(),
        refused.first()
    );
    assert!(
        misplaced.is_empty(),
        "{} of {n} O_APPEND lines not where the writer's position said; first: {:?}",
        misplaced.len(),
        misplaced.first()
    );
    assert!(
        epochs_differ.is_empty(),
        "the file's epoch differs between daemons {} times; first: {:?}",
        epochs_differ.len(),
        epochs_differ.first()
    );
    assert!(
        listings_differ.is_empty(),
        "`leasefs leases` differs between daemons {} times; first: {:?}",
        listings_differ.len(),
        listings_differ.first()
    );
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(
            std::fs::read(m.path("f")).expect("read"),
            expect,
            "daemon {i} shows another file"
        );
    }
}

#[test]
fn a_duplicate_writes_on_after_close_unless_another_daemon_took_the_file() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let o = ["soft_limit=3"];
    let a = daemon(&etcd, "closedup", &dns, &o);
    let b = daemon(&etcd, "closedup", &dns, &o);
    // As a shell's `>>`: open, dup, close the first, write through the copy.
    let f = open_append(&a.path("f")).expect("open on A");
    let mut g = dup(&f);
    drop(f);
    g.write_all(b"a1\n")
        .expect("a write through the copy after close");
    g.sync_all().expect("fsync through the copy");
    // The copy holds the file again: B is refused while it is open.
    let r = open_append(&b.path("f"));
    assert_eq!(
        r.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EBUSY),
        "B while A's copy writes: {r:?}"
    );
    // A second copy closed: the file goes; B takes it and appends.
    let h = dup(&g);
    drop(h);
    let mut fb = open_append(&b.path("f")).expect("B after A's close");
    fb.write_all(b"b1\n").expect("write on B");
    // A's copy may not write while B holds the file.
    let r = g.write_all(b"a2\n");
    assert_eq!(
        r.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EBUSY),
        "A's copy while B holds the file: {r:?}"
    );
    // A sync through it is a reader's: no grant needed.
    g.sync_all()
        .expect("fsync through A's copy while B holds the file");
    drop(fb);
    // B closed: A's copy takes the file again, at its end. (The position
    // that append leaves is the kernel's, short by B's line: the kernel
    // placed it before the daemon could tell it the size; the next one's
    // is right.)
    g.write_all(b"a3\n").expect("A's copy after B closed");
    g.write_all(b"a4\n").expect("A's copy again");
    let pos = g.stream_position().expect("position");
    drop(g);
    let want = "a1\nb1\na3\na4\n";
    assert_eq!(
        pos,
        want.len() as u64,
        "A's position after its second append"
    );
    for m in [&a, &b] {
        assert!(
            wait_until(std::time::Duration::from_secs(3), || m.read_string("f")
                == want),
            "file on a daemon: {:?}",
            m.read_string("f")
        );
    }
}

/// `leasefs recover-lease` through another daemon than the holder's does
/// what it does through the holder's: the writer is fenced (its next
/// fsync fails), the file is closed with what was acknowledged, and a
/// writer on the asking daemon gets it at once.
#[test]
fn recover_lease_through_another_daemon_fences_the_holder() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let o = ["soft_limit=3"];
    let a = daemon(&etcd, "closerec", &dns, &o);
    let b = daemon(&etcd, "closerec", &dns, &o);
    let mut f = open_append(&a.path("f")).expect("open on A");
    f.write_all(b"acked\n").expect("write on A");
    f.sync_all().expect("fsync on A");
    let out = b.leasefs(&["recover-lease", b.path("f").to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "recover-lease through B: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Closed: B's writer gets it at once, and A's lease shows it free.
    let mut g = open_append(&b.path("f")).expect("B after recover-lease");
    g.write_all(b"from-b\n").expect("write on B");
    drop(g);
    let r = f.write_all(b"late\n").and_then(|()| f.sync_all());
    assert!(
        r.is_err(),
        "A's writer was not fenced by recover-lease through B"
    );
    drop(f);
    for m in [&a, &b] {
        assert!(
            wait_until(std::time::Duration::from_secs(3), || m.read_string("f")
                == "acked\nfrom-b\n"),
            "file: {:?}",
            m.read_string("f")
        );
    }
}

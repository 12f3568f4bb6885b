//! A full metadata filesystem (docs/SEMANTICS.md, "The daemon"): the data
//! directory on a small tmpfs that the test fills up. Namespace changes
//! fail with `ENOSPC`, not `EIO`; a `close()` whose final metadata commit
//! fails reports `ENOSPC` instead of succeeding (one that has nothing to
//! commit, after a whole fsync, succeeds); once there is room again,
//! the file is closed by lease recovery with every acknowledged byte (a
//! small file fsynced whole and appended to: every fsynced byte).

mod common;
use common::faults::Tmpfs;
use common::*;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// Fills the filesystem of `dir` with a file of zeros, until `ENOSPC`.
fn fill(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).expect("create filler");
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let small = vec![0u8; 512];
    while f.write(&small).is_ok_and(|n| n > 0) {}
    p
}

#[test]
fn a_full_metadata_filesystem_gives_enospc_and_close_reports_it() {
    let tmpfs = Tmpfs::new("4m");
    let m = Mount::with_data_dir(
        Opts {
            o: vec!["housekeeping_interval=1".into()],
            ..Opts::default()
        },
        tmpfs.path.join("data"),
    );
    // f: more than one packet, so its block is being written (rbw) at the
    // fsync. g: a small file, written whole into finalized/ by its fsync
    // (docs/SEMANTICS.md "Layout"), whose next write must first record
    // the block reopened under a new stamp. h: a small file fsynced whole
    // and closed with nothing more written: its close, on the request's
    // thread (the counter `closes_on_caller`), has nothing to commit of
    // its own (`closes_without_commit`).
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wc");
    w.ok("rep 6000 acknowledged");
    w.ok("fsync");
    let mut small = Agent::spawn(&m.mnt);
    small.ok("open g wc");
    small.ok("rep 1000 synced");
    small.ok("fsync");
    let mut quiet = Agent::spawn(&m.mnt);
    quiet.ok("open h wc");
    quiet.ok("rep 500 kept");
    quiet.ok("fsync");
    let filler = fill(&tmpfs.path);

    // Namespace changes until one fails: its errno is ENOSPC. (The store's
    // log may still have room for a few before it must grow.)
    let mut err = None;
    for i in 0..5000 {
        if let Err(e) = std::fs::create_dir(m.path(&format!("d{i:04}-{}", "n".repeat(200)))) {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("the metadata store never filled up");
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ENOSPC),
        "mkdir on a full store: {e}"
    );

    // The writer's close must commit the file's length and last block:
    // that commit fails, and close() says so.
    w.ok("write unflushed but acknowledged at close");
    let r = w.cmd("close");
    assert_eq!(err_name(&r), Some("ENOSPC"), "close on a full store: {r}");
    // g's append cannot record its new stamp: no replica takes it, and
    // close() says so.
    small.ok("write appended to a full store");
    let r = small.cmd("close");
    assert_eq!(
        err_name(&r),
        Some("ENOSPC"),
        "close of g on a full store: {r}"
    );
    // h's close has nothing to record but the end of its time under
    // construction (its fsync recorded block, length and time), which
    // waits for the store's next commit: nothing of h can be lost, so
    // its close succeeds on a full store, on the request's thread
    // (docs/SEMANTICS.md "Replication and faults", a file that fits in one packet).
    let before = m.stats_counter("closes_on_caller");
    let lazy = m.stats_counter("closes_without_commit");
    quiet.ok("close");
    assert_eq!(m.stats_counter("closes_on_caller"), before + 1);
    assert_eq!(m.stats_counter("closes_without_commit"), lazy + 1);
    assert_eq!(m.lease_state("h"), "free");

    // Room again: each file is closed by recovery (housekeeping) with
    // every byte its replicas acknowledged (g: every fsynced byte), and
    // the mount works on.
    std::fs::remove_file(&filler).expect("remove filler");
    let want = format!(
        "{}unflushed but acknowledged at close\n",
        "acknowledged\n".repeat(6000)
    );
    let want_g = "synced\n".repeat(1000);
    let want_h = "kept\n".repeat(500);
    assert!(
        wait_until(Duration::from_secs(20), || {
            m.lease_state("f") == "free"
                && m.read_string("f") == want
                && m.lease_state("g") == "free"
                && m.read_string("g") == want_g
                && m.lease_state("h") == "free"
                && m.read_string("h") == want_h
                // g reads whole before its recovery (its blocks are all
                // finalized): the recovery shows in fsck.
                && m.fsck(&[]).code == 0
        }),
        "files not recovered: f {} with {} bytes, g {} with {} bytes, h {} with {} bytes",
        m.lease_state("f"),
        m.read_string("f").len(),
        m.lease_state("g"),
        m.read_string("g").len(),
        m.lease_state("h"),
        m.read_string("h").len()
    );
    let f = m.fsck(&[]);
    assert_eq!(f.code, 0, "fsck after recovery: {}", f.stdout);
    m.sh_ok("echo fine > after && cat after");
}

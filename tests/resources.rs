//! Bounded resources (docs/SEMANTICS.md, "Resource limits"): extended
//! attributes of an inode cannot grow without bound, `statfs` counts
//! the filesystem that holds the metadata, and a user's truncate growth
//! writes no zeros as root and cannot outgrow the datanodes.

mod common;

use common::faults::Tmpfs;
use common::*;

/// Any user may add attributes to their files, but only up to the
/// per-inode limit: then ENOSPC, as ext4 says when an inode's attribute
/// block is full. A value over 64 KiB is E2BIG; room freed is usable again.
#[test]
fn xattrs_of_an_inode_are_bounded() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("touch f && chown nobody:nogroup f");
    let mut w = Agent::spawn_as_nobody(&m.mnt);
    let v = hex(&[b'v'; 16384]);
    let mut n = 0;
    let mut err = "none".to_string();
    while n < 64 {
        let r = w.cmd(&format!("setxattr f user.k{n:02} {v}"));
        if let Some(e) = err_name(&r) {
            err = e.to_string();
            break;
        }
        n += 1;
    }
    let r = w.cmd(&format!("setxattr f user.big {}", hex(&[b'b'; 65537])));
    let big = err_name(&r).unwrap_or("stored").to_string();
    w.ok("removexattr f user.k00");
    w.ok(&format!("setxattr f user.again {v}"));
    let out = format!("{n} {err} {big}");
    let v: Vec<&str> = out.split_whitespace().collect();
    // 256 KiB of names and values: fifteen 16 KiB values and their names.
    assert_eq!(v, ["15", "ENOSPC", "E2BIG"], "stored, then refused: {out}");
}

/// `df` of the mount shows at most what the metadata filesystem (the data
/// directory's) has left: once that is full nothing can be created.
#[test]
fn statfs_counts_the_metadata_filesystem() {
    if etcd_backend() {
        // The namespace is in etcd, whose space is not a local filesystem.
        return;
    }
    let small = Tmpfs::new("16m");
    let m = Mount::with_data_dir(Opts::default(), small.path.join("data"));
    let fs = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    let avail = fs.blocks_available() * fs.fragment_size();
    assert!(avail > 0, "nothing available");
    assert!(
        avail <= 16 << 20,
        "df shows {avail} bytes free, more than the 16 MiB the metadata has"
    );
}

/// KiB allocated under the datanode directories (`du`: allocated blocks,
/// so holes count for nothing).
fn datanodes_kib(m: &Mount) -> u64 {
    let o = std::process::Command::new("du")
        .arg("-sk")
        .arg("--total")
        .args(&m.datanodes)
        .output()
        .expect("du");
    assert!(
        o.status.success(),
        "du: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let total = out.lines().last().expect("du total");
    total
        .split_whitespace()
        .next()
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("du said {out}"))
}

/// `truncate -s 32M` by an ordinary user on a root mount used to write
/// 32 MiB of zeros per replica (R = 3: 96 MiB) as root. Growth is sparse
/// now: holes and their checksums (4 bytes per 512), across as many
/// blocks as it spans; the file reads back as the bytes it had and zeros,
/// takes appends after them, and fsck (reading every checksum) is clean.
#[test]
fn truncate_growth_by_a_user_writes_no_zeros() {
    let m = Mount::with_o("block_size=4M");
    m.open_to_all();
    m.sh_ok("printf hello > g && chown nobody:nogroup g");
    let before = datanodes_kib(&m);
    let o = m.sh_as_nobody("truncate -s 32M g");
    assert!(
        o.status.success(),
        "truncate as nobody: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let grew = datanodes_kib(&m).saturating_sub(before);
    let replicas = m.datanodes.len() as u64;
    // Before: 32 MiB per replica. Now: 256 KiB of checksums per replica
    // and a few blocks' files.
    assert!(
        grew < 2048,
        "the datanodes grew by {grew} KiB for 32 MiB of zeros x {replicas} replicas"
    );
    let mut want = b"hello".to_vec();
    want.resize(32 << 20, 0);
    let got = std::fs::read(m.path("g")).expect("read back");
    assert!(
        got == want,
        "read back {} bytes, not hello and zeros",
        got.len()
    );
    let o = m.sh_as_nobody("printf tail >> g");
    assert!(
        o.status.success(),
        "append as nobody: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    want.extend_from_slice(b"tail");
    let got = std::fs::read(m.path("g")).expect("read back");
    assert!(
        got == want,
        "read back {} bytes after the append",
        got.len()
    );
    let o = m.leasefs(&["fsck", m.mnt.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("fsck JSON");
    assert_eq!(o.status.code(), Some(0), "fsck: {report}");
    // 8 blocks of 4 MiB, and the appended bytes in a ninth.
    assert_eq!(report["blocks"], 9, "{report}");
}

/// `truncate -s 1E` would have filled every datanode (and root's reserved
/// blocks): growth beyond the free space of the datanodes fails with
/// ENOSPC at once, and leaves neither replicas nor a longer file behind.
#[test]
fn truncate_growth_beyond_the_datanodes_room_fails_at_once() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("printf hello > g && chown nobody:nogroup g");
    let before = datanodes_kib(&m);
    let t = std::time::Instant::now();
    let o = m.sh_as_nobody("truncate -s 1E g");
    assert!(!o.status.success(), "truncate -s 1E succeeded");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let grew = datanodes_kib(&m).saturating_sub(before);
    assert!(grew < 64, "the datanodes grew by {grew} KiB");
    assert_eq!(std::fs::read(m.path("g")).expect("read back"), b"hello");
    // Growth within the room still works.
    let o = m.sh_as_nobody("truncate -s 1M g");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::metadata(m.path("g")).expect("stat").len(), 1 << 20);
}

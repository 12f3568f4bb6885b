//! Bounded resources (docs/SEMANTICS.md, "Resource limits"): extended
//! attributes of an inode cannot grow without bound, and `statfs` counts
//! the filesystem that holds the metadata.

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

//! Directory listings while the directory changes (docs/SEMANTICS.md,
//! "Directory listings"): deleting every entry while listing leaves
//! nothing behind, `find -delete` empties a tree, and a listing costs the
//! same per entry in a directory of 10,000 or 100,000 entries.

mod common;

use std::time::Instant;

use common::*;

/// Makes `n` empty files in directory `rel` of the mount.
fn make_files(m: &Mount, rel: &str, n: usize) {
    std::fs::create_dir_all(m.path(rel)).expect("mkdir");
    for i in 0..n {
        create(&m.path(&format!("{rel}/file-{i:06}")));
    }
}

/// open(O_CREAT | O_WRONLY), then close.
fn create(p: &std::path::Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
}

fn count(m: &Mount, rel: &str) -> usize {
    std::fs::read_dir(m.path(rel)).unwrap().count()
}

/// `for e in os.scandir(d): os.unlink(e.path)`: each unlink must not move
/// the listing's place, so every file is seen and removed.
#[test]
fn unlinking_while_listing_removes_everything() {
    let m = Mount::new();
    make_files(&m, "d", 3000);
    assert_eq!(count(&m, "d"), 3000);
    let mut n = 0;
    for e in std::fs::read_dir(m.path("d")).expect("list d") {
        std::fs::remove_file(e.expect("entry").path()).expect("unlink");
        n += 1;
    }
    assert_eq!(n, 3000);
    assert_eq!(count(&m, "d"), 0, "files left behind");
    // Entries added while listing do not disturb it either: each file seen
    // gets a sibling, and every original is still seen exactly once.
    make_files(&m, "e", 1000);
    let mut seen = std::collections::HashSet::new();
    for e in std::fs::read_dir(m.path("e")).expect("list e") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        assert!(seen.insert(name.clone()), "{name} listed twice");
        if name.starts_with("file-") {
            create(&m.path(&format!("e/new-{name}")));
        }
    }
    let originals = seen.iter().filter(|s| s.starts_with("file-")).count();
    assert_eq!(originals, 1000);
}

/// `find d -delete` lists each directory while it deletes in it.
#[test]
fn find_delete_empties_a_tree() {
    let m = Mount::new();
    for sub in ["t", "t/a", "t/b", "t/a/c"] {
        make_files(&m, sub, 700);
    }
    m.sh_ok("find t -delete");
    assert!(!m.path("t").exists(), "find -delete left the tree");
}

/// Seconds to list `rel` with getdents (the best of three runs).
fn list_secs(m: &Mount, rel: &str, expect: usize) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            assert_eq!(count(m, rel), expect);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// A page of a listing costs the same whatever the size of the directory
/// (it was a read of the whole directory per page: listing 100,000
/// entries took 5 to 8 times longer per entry than listing 10,000). The
/// directories are filled through the metadata store while unmounted, so
/// the test spends its time listing.
#[test]
fn listing_cost_per_entry_does_not_grow() {
    if etcd_backend() {
        // Filling etcd with 110,000 entries takes minutes; the paging is
        // the same code on both backends (tests/meta_conformance.rs).
        return;
    }
    let mut m = Mount::new();
    m.sh_ok("mkdir small big");
    let small = std::fs::metadata(m.path("small")).unwrap();
    let big = std::fs::metadata(m.path("big")).unwrap();
    m.unmount();
    {
        use leasefs::meta::{Kind, MetaStore, Namespace, NewNode};
        use std::os::unix::fs::MetadataExt;
        let store = MetaStore::open(&m.data.join("meta.db"), 0, 0).unwrap();
        for (dir, n) in [(small.ino(), 10_000), (big.ino(), 100_000)] {
            for i in 0..n {
                let node = NewNode {
                    kind: Kind::File,
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    target: None,
                    block_size: 1 << 20,
                    xattrs: Vec::new(),
                };
                store
                    .create(dir, format!("entry-{i:06}").as_bytes(), node)
                    .unwrap();
            }
        }
    }
    m.mount();
    let t_small = list_secs(&m, "small", 10_000) / 10_000.0;
    let t_big = list_secs(&m, "big", 100_000) / 100_000.0;
    let ratio = t_big / t_small;
    println!(
        "per entry: {:.2} µs at 10,000, {:.2} µs at 100,000: ratio {ratio:.2}",
        t_small * 1e6,
        t_big * 1e6
    );
    assert!(
        ratio < 3.0,
        "a listing's cost per entry grows with the directory: {ratio:.2}"
    );
}

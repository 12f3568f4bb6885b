//! One suite for both metadata backends: every test function takes
//! `&dyn Meta` and runs against `MetaStore` (SQLite in a temporary
//! directory) and against `EtcdMeta` on a real etcd started on loopback.
//! What a namespace step refuses and changes is decided once, by the rules
//! in `src/meta/rules` (unit-tested there); this suite checks what depends
//! on the backend: that its reads and writes store what the rules decided
//! (links, `..`, paths, listings and their cookies, attributes), block
//! lists, counters, the audit table, fences and the datanode registry, and
//! that steps are atomic. Functions taking two handles get two daemons'
//! views of one filesystem on etcd (two connections, one prefix) and the
//! same store twice on SQLite. The `etcd_only` tests cover what only a
//! shared store has: racing daemons, etcd's own limits and upgrades.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use common::etcd::EtcdServer;
use leasefs::error::FsError;
use leasefs::etcd::Etcd;
use leasefs::meta::*;

// ---- fixtures ------------------------------------------------------------

const UID: u32 = 1234;
const GID: u32 = 5678;

fn sqlite() -> (tempfile::TempDir, MetaStore) {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("meta.db"), UID, GID).unwrap();
    (d, m)
}

/// Two daemons' handles on one fresh etcd filesystem; the server stays up
/// while they live.
struct EtcdPair {
    a: EtcdMeta,
    b: EtcdMeta,
    etcd: Arc<Etcd>,
    _server: Arc<EtcdServer>,
}

fn etcd(test: &str) -> EtcdPair {
    let server = EtcdServer::shared();
    let (conn, name) = server.connect(test);
    let a = EtcdMeta::open(conn.clone(), UID, GID).unwrap();
    let b = EtcdMeta::open(server.connect_to(&name), UID, GID).unwrap();
    EtcdPair {
        a,
        b,
        etcd: conn,
        _server: server,
    }
}

/// Declares each test once per backend: `sqlite::NAME` and `etcd::NAME`.
macro_rules! conformance {
    (one: [$($one:ident),* $(,)?], two: [$($two:ident),* $(,)?]) => {
        mod sqlite {
            $(#[test] fn $one() { let (_d, m) = super::sqlite(); super::$one(&m); })*
            $(#[test] fn $two() { let (_d, m) = super::sqlite(); super::$two(&m, &m); })*
        }
        mod etcd {
            $(#[test] fn $one() { let p = super::etcd(stringify!($one)); super::$one(&p.a); })*
            $(#[test] fn $two() { let p = super::etcd(stringify!($two)); super::$two(&p.a, &p.b); })*
        }
    };
}

conformance! {
    one: [
        create_lookup_readdir_getattr,
        namespace_steps_are_stored,
        refusals_read_the_store,
        symlink_readlink,
        set_attrs,
        xattrs,
        xattr_updates_and_limits,
        cookies_follow_inodes,
        commit_batches,
        blocks_and_index,
        delete_inode_and_orphans,
        reserve_epochs_monotonic,
        audit_order,
        audit_leaves_out_redundant_events,
        audit_bounded_per_user_and_paged,
        fences_per_owner,
        datanode_registry_and_replication,
        datanode_admin_states_and_removal,
        usage,
    ],
    two: [
        alloc_unique_across_daemons,
        gen_stamps_rise_across_daemons,
        commit_is_atomic_to_readers,
        racing_create_one_wins,
        racing_renames_keep_tree_consistent,
        racing_dir_swaps_make_no_cycle,
        listing_survives_changes,
        one_storage_id_per_new_object_store_prefix,
    ]
}

// ---- helpers -------------------------------------------------------------

fn node(kind: Kind) -> NewNode<'static> {
    NewNode {
        kind,
        mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
        uid: 7,
        gid: 8,
        rdev: 0,
        target: None,
        block_size: 1 << 20,
        xattrs: Vec::new(),
    }
}

fn mkfile(m: &dyn Meta, parent: u64, name: &str) -> Inode {
    m.create(parent, name.as_bytes(), node(Kind::File)).unwrap()
}

fn mkdir(m: &dyn Meta, parent: u64, name: &str) -> Inode {
    m.create(parent, name.as_bytes(), node(Kind::Dir)).unwrap()
}

fn nlink(m: &dyn Meta, ino: u64) -> u32 {
    m.get(ino).unwrap().nlink
}

/// Every entry of `dir` as (name, ino, kind), in listing order.
fn entries(m: &dyn Meta, dir: u64) -> Vec<(Vec<u8>, u64, Kind)> {
    list_all(m, dir)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.ino, e.kind))
        .collect()
}

fn names(m: &dyn Meta, dir: u64) -> Vec<Vec<u8>> {
    entries(m, dir).into_iter().map(|e| e.0).collect()
}

macro_rules! assert_err {
    ($e:expr, $p:pat) => {
        match $e {
            Err($p) => {}
            other => panic!(
                "{}: expected {}, got {:?}",
                stringify!($e),
                stringify!($p),
                other
            ),
        }
    };
}

fn block(ino: u64, idx: u64, block_id: u64, replicas: Vec<u32>) -> BlockRow {
    BlockRow {
        ino,
        idx,
        block_id,
        gs: 1000 + idx,
        len: 4096,
        finalized: true,
        replicas: replicas.into_iter().map(DnId).collect(),
    }
}

/// Whether block `block_id` is recorded with a replica on datanode `dn`.
fn on(m: &dyn Meta, block_id: u64, dn: u32) -> bool {
    m.block_by_id(block_id)
        .unwrap()
        .is_some_and(|r| r.block_id == block_id && r.replicas.contains(&DnId(dn)))
}

fn uc(ino: u64, epoch: u64) -> UnderConstruction {
    UnderConstruction {
        ino,
        holder: "host:42".into(),
        pid: 42,
        comm: "writer".into(),
        epoch,
        mount_id: "m1".into(),
        since_ms: 17,
    }
}

/// A small deterministic random sequence per thread.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Walks the tree from the root and checks what every backend must keep
/// true: no cycle, each directory's nlink is 2 + its subdirectories and its
/// `..` is where it is listed, each other inode's nlink is its number of
/// names, every entry points at a live inode of the listed kind.
fn check_tree(m: &dyn Meta) {
    let mut names_of: HashMap<u64, u32> = HashMap::new();
    let mut seen = HashSet::new();
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        assert!(seen.insert(d), "directory {d} reached twice: a cycle");
        let entries = entries(m, d);
        let subdirs = entries.iter().filter(|e| e.2 == Kind::Dir).count() as u32;
        assert_eq!(nlink(m, d), 2 + subdirs, "nlink of directory {d}");
        for (name, ino, kind) in entries {
            let i = m
                .get(ino)
                .unwrap_or_else(|e| panic!("entry {name:?} -> {ino}: {e}"));
            assert_eq!(i.kind, kind, "kind of {name:?}");
            if kind == Kind::Dir {
                assert_eq!(m.parent_of(ino).unwrap(), d, "`..` of {ino}");
                stack.push(ino);
            } else {
                *names_of.entry(ino).or_default() += 1;
            }
        }
    }
    for (ino, n) in names_of {
        assert_eq!(nlink(m, ino), n, "nlink of {ino}");
    }
}

// ---- namespace -----------------------------------------------------------

fn create_lookup_readdir_getattr(m: &dyn Meta) {
    let root = m.get(ROOT_INO).unwrap();
    assert_eq!((root.kind, root.nlink, root.mode), (Kind::Dir, 2, 0o755));
    assert_eq!((root.uid, root.gid), (UID, GID));
    assert!(entries(m, ROOT_INO).is_empty());

    let before = root.mtime;
    let mut n = node(Kind::File);
    n.mode = 0o100_4755; // kind bits are not stored
    let f = m.create(ROOT_INO, b"f", n).unwrap();
    assert_eq!(
        (f.kind, f.mode, f.nlink, f.size),
        (Kind::File, 0o4755, 1, 0)
    );
    assert_eq!(
        (f.uid, f.gid, f.block_size, f.last_epoch),
        (7, 8, 1 << 20, 0)
    );
    assert_eq!(m.get(f.ino).unwrap(), f);
    assert_eq!(m.lookup(ROOT_INO, b"f").unwrap(), f);
    let root = m.get(ROOT_INO).unwrap();
    assert!(root.mtime >= before && root.ctime == root.mtime);

    let d = mkdir(m, ROOT_INO, "d");
    assert_eq!((d.kind, d.nlink), (Kind::Dir, 2));
    assert_eq!(m.get(d.ino).unwrap(), d);
    assert_eq!(nlink(m, ROOT_INO), 3);
    let mut fifo = node(Kind::Fifo);
    fifo.rdev = 9;
    let p = m.create(d.ino, b"pipe", fifo).unwrap();
    assert_eq!(m.get(p.ino).unwrap(), p);
    assert_eq!((p.kind, p.rdev), (Kind::Fifo, 9));
    assert_ne!(f.ino, d.ino);

    // Names are bytes, listed in the order they were made.
    let more = [&b"\xff"[..], b"a\x00b", b"B", b"a", b"a b"];
    for n in more {
        m.create(ROOT_INO, n, node(Kind::File)).unwrap();
    }
    let listed = names(m, ROOT_INO);
    assert_eq!(listed[..2], [b"f".to_vec(), b"d".to_vec()]);
    assert_eq!(listed[2..], more.map(<[u8]>::to_vec));
    let e = entries(m, ROOT_INO);
    assert!(e.contains(&(b"d".to_vec(), d.ino, Kind::Dir)));
    assert!(e.contains(&(b"f".to_vec(), f.ino, Kind::File)));
    assert_eq!(m.lookup(ROOT_INO, b"a\x00b").unwrap().kind, Kind::File);
    assert_err!(m.readdir(f.ino, 0, 10), FsError::NotDir);
    assert_err!(m.readdir(999_999, 0, 10), FsError::NotFound);
    assert_err!(m.get(999_999), FsError::NotFound);
}

/// Each namespace step, with what it stored read back through the
/// backend: links, `..` and paths (SQLite's `dentries`, etcd's `p/`
/// keys), lookups and listings, the attributes of a replaced directory.
fn namespace_steps_are_stored(m: &dyn Meta) {
    let a = mkdir(m, ROOT_INO, "a");
    let b = mkdir(m, a.ino, "b");
    let f = mkfile(m, b.ino, "f");
    assert_eq!(
        (nlink(m, ROOT_INO), nlink(m, a.ino), nlink(m, b.ino)),
        (3, 3, 2)
    );
    assert_eq!(m.path_of(f.ino), "/a/b/f");
    assert_eq!(m.parent_of(b.ino).unwrap(), a.ino);
    assert_eq!(m.parent_of(ROOT_INO).unwrap(), ROOT_INO);
    assert_eq!(m.path_of(ROOT_INO), "/");

    // A link and an unlink: the other name stays, with the inode's count.
    let before = m.get(f.ino).unwrap().ctime;
    let l = m.link(f.ino, ROOT_INO, b"l").unwrap();
    assert_eq!(l.nlink, 2);
    assert!(l.ctime >= before);
    assert_eq!(m.get(f.ino).unwrap(), l);
    assert_eq!(m.lookup(ROOT_INO, b"l").unwrap().ino, f.ino);
    let one = m.unlink(b.ino, b"f").unwrap();
    assert_eq!(one.nlink, 1);
    assert_eq!(m.get(f.ino).unwrap(), one);
    assert_err!(m.lookup(b.ino, b"f"), FsError::NotFound);
    assert!(names(m, b.ino).is_empty());
    assert_eq!(m.path_of(f.ino), "/l");

    // A directory moved up: `..`, links and paths follow.
    assert_eq!(
        m.rename(a.ino, b"b", ROOT_INO, b"c", false, false).unwrap(),
        None
    );
    assert_eq!(m.parent_of(b.ino).unwrap(), ROOT_INO);
    assert_eq!((nlink(m, ROOT_INO), nlink(m, a.ino)), (4, 2));
    assert_eq!(m.path_of(b.ino), "/c");
    // Listed at its old place, made before the link.
    assert_eq!(
        names(m, ROOT_INO),
        [b"a".to_vec(), b"c".to_vec(), b"l".to_vec()]
    );

    // Over a file: the replaced inode keeps no name and waits as an orphan.
    let g = mkfile(m, ROOT_INO, "g");
    let gone = m
        .rename(ROOT_INO, b"l", ROOT_INO, b"g", false, false)
        .unwrap()
        .unwrap();
    assert_eq!((gone.ino, gone.nlink), (g.ino, 0));
    assert_eq!(m.get(g.ino).unwrap(), gone);
    assert_eq!(m.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
    assert_eq!(m.orphans().unwrap(), vec![g.ino]);
    assert_eq!(m.path_of(f.ino), "/g");

    // Over an empty directory: it is gone with its attributes.
    m.setxattr(a.ino, b"user.x", b"1", false, false).unwrap();
    m.rename(ROOT_INO, b"c", ROOT_INO, b"a", false, false)
        .unwrap();
    assert_err!(m.get(a.ino), FsError::NotFound);
    assert_err!(m.getxattr(a.ino, b"user.x"), FsError::NoXattr);
    assert!(m.listxattr(a.ino).unwrap().is_empty());
    assert_eq!(m.lookup(ROOT_INO, b"a").unwrap().ino, b.ino);
    assert_eq!(m.parent_of(b.ino).unwrap(), ROOT_INO);
    assert_eq!(nlink(m, ROOT_INO), 3);

    // An exchange of a file and a non-empty directory across directories.
    let d = mkdir(m, ROOT_INO, "d");
    let sub = mkdir(m, d.ino, "sub");
    let inside = mkfile(m, sub.ino, "inside");
    let before = m.get(f.ino).unwrap().ctime;
    assert_eq!(
        m.rename(ROOT_INO, b"g", d.ino, b"sub", false, true)
            .unwrap(),
        None
    );
    assert_eq!(m.lookup(ROOT_INO, b"g").unwrap().ino, sub.ino);
    assert_eq!(m.lookup(d.ino, b"sub").unwrap().ino, f.ino);
    assert_eq!(m.parent_of(sub.ino).unwrap(), ROOT_INO);
    assert_eq!((nlink(m, ROOT_INO), nlink(m, d.ino)), (5, 2));
    assert_eq!(m.path_of(f.ino), "/d/sub");
    assert_eq!(m.path_of(inside.ino), "/g/inside");
    assert!(m.get(f.ino).unwrap().ctime >= before);
    // And back within one directory.
    m.rename(d.ino, b"sub", d.ino, b"file", false, false)
        .unwrap();
    m.rename(ROOT_INO, b"g", ROOT_INO, b"d", false, true)
        .unwrap();
    assert_eq!(m.path_of(f.ino), "/g/file");
    assert_eq!(m.path_of(inside.ino), "/d/inside");
    check_tree(m);

    // rmdir: the directory goes with its attributes.
    m.unlink(sub.ino, b"inside").unwrap();
    m.setxattr(sub.ino, b"user.k", b"v", false, false).unwrap();
    assert_eq!(m.rmdir(ROOT_INO, b"d").unwrap(), sub.ino);
    assert_err!(m.get(sub.ino), FsError::NotFound);
    assert_err!(m.getxattr(sub.ino, b"user.k"), FsError::NoXattr);
    assert_eq!(nlink(m, ROOT_INO), 4);
    assert_eq!(names(m, ROOT_INO), [b"a".to_vec(), b"g".to_vec()]);
    // The last name of a file gone: the inode waits for delete_inode.
    m.unlink(d.ino, b"file").unwrap();
    assert_eq!(m.path_of(f.ino), format!("<ino {}>", f.ino));
    assert_eq!(m.orphans().unwrap().len(), 3);
    assert_eq!(m.path_of(999_999), "<ino 999999>");
    check_tree(m);
}

/// A refusal of each kind, where it depends on what the backend reads
/// (an entry, an inode, whether a directory is empty, the names above a
/// directory); nothing of a refused step is stored.
fn refusals_read_the_store(m: &dyn Meta) {
    let x = mkdir(m, ROOT_INO, "x");
    let y = mkdir(m, x.ino, "y");
    let z = mkdir(m, y.ino, "z");
    let full = mkdir(m, ROOT_INO, "full");
    mkfile(m, full.ino, "f");
    let f = mkfile(m, ROOT_INO, "file");
    assert_err!(m.create(ROOT_INO, b"x", node(Kind::File)), FsError::Exists);
    assert_err!(m.create(f.ino, b"x", node(Kind::File)), FsError::NotDir);
    assert_err!(m.create(999_999, b"x", node(Kind::File)), FsError::NotFound);
    assert_err!(m.lookup(ROOT_INO, b"nope"), FsError::NotFound);
    assert_err!(m.lookup(f.ino, b"x"), FsError::NotDir);
    assert_err!(m.link(x.ino, ROOT_INO, b"xl"), FsError::NotPermitted(_));
    assert_err!(m.link(f.ino, ROOT_INO, b"full"), FsError::Exists);
    assert_err!(m.unlink(ROOT_INO, b"x"), FsError::IsDir);
    assert_err!(m.rmdir(ROOT_INO, b"full"), FsError::NotEmpty);
    assert_err!(m.rmdir(ROOT_INO, b"file"), FsError::NotDir);
    let mv = |name: &[u8], to: u64, new: &[u8], noreplace| {
        m.rename(ROOT_INO, name, to, new, noreplace, false)
    };
    assert_err!(mv(b"x", z.ino, b"x", false), FsError::Invalid(_));
    assert_err!(mv(b"x", x.ino, b"x", false), FsError::Invalid(_));
    assert_err!(mv(b"x", ROOT_INO, b"full", false), FsError::NotEmpty);
    assert_err!(mv(b"x", ROOT_INO, b"full", true), FsError::Exists);
    assert_err!(mv(b"x", ROOT_INO, b"file", false), FsError::NotDir);
    assert_err!(mv(b"file", ROOT_INO, b"full", false), FsError::IsDir);
    assert_err!(mv(b"nope", ROOT_INO, b"y", false), FsError::NotFound);
    assert_err!(
        m.rename(ROOT_INO, b"x", ROOT_INO, b"nope", false, true),
        FsError::NotFound
    );
    assert_eq!(m.lookup(ROOT_INO, b"x").unwrap().ino, x.ino);
    assert_eq!(m.path_of(z.ino), "/x/y/z");
    assert_eq!(
        names(m, ROOT_INO),
        [b"x".to_vec(), b"full".to_vec(), b"file".to_vec()]
    );
    check_tree(m);
}

fn symlink_readlink(m: &dyn Meta) {
    let mut n = node(Kind::Symlink);
    n.target = Some(b"../some/where\xff");
    let s = m.create(ROOT_INO, b"s", n).unwrap();
    assert_eq!(s.kind, Kind::Symlink);
    assert_eq!(m.readlink(s.ino).unwrap(), b"../some/where\xff");
    assert_eq!(m.lookup(ROOT_INO, b"s").unwrap().kind, Kind::Symlink);
    let f = mkfile(m, ROOT_INO, "f");
    assert_err!(m.readlink(f.ino), FsError::Invalid(_));
    assert_err!(m.readlink(999_999), FsError::NotFound);
}

fn set_attrs(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    let i = m
        .set_attrs(
            f.ino,
            &AttrChange {
                mode: Some(0o100_2711),
                uid: Some(11),
                gid: Some(12),
                atime: Some(100),
                mtime: Some(200),
                ctime: Some(300),
            },
        )
        .unwrap();
    assert_eq!((i.mode, i.uid, i.gid), (0o2711, 11, 12));
    assert_eq!((i.atime, i.mtime, i.ctime), (100, 200, 300));
    assert_eq!(m.get(f.ino).unwrap(), i);
    let j = m
        .set_attrs(
            f.ino,
            &AttrChange {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((j.mode, j.uid, j.atime, j.mtime), (0o600, 11, 100, 200));
    assert_eq!(m.get(f.ino).unwrap(), j);
}

fn xattrs(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    assert_err!(m.getxattr(f.ino, b"user.a"), FsError::NoXattr);
    assert!(m.listxattr(f.ino).unwrap().is_empty());
    m.setxattr(f.ino, b"user.b", b"1", true, false).unwrap();
    assert_err!(
        m.setxattr(f.ino, b"user.b", b"2", true, false),
        FsError::Exists
    );
    m.setxattr(f.ino, b"user.b", b"3", false, true).unwrap();
    assert_eq!(m.getxattr(f.ino, b"user.b").unwrap(), b"3");
    m.setxattr(f.ino, b"user.a", b"", false, false).unwrap();
    m.setxattr(f.ino, b"trusted.\xff\x00", b"\x00\x01\xff", false, false)
        .unwrap();
    m.setxattr(f.ino, b"user.a", b"overwritten", false, false)
        .unwrap();
    assert_eq!(m.getxattr(f.ino, b"user.a").unwrap(), b"overwritten");
    assert_eq!(
        m.getxattr(f.ino, b"trusted.\xff\x00").unwrap(),
        b"\x00\x01\xff"
    );
    // Listed in byte order.
    assert_eq!(
        m.listxattr(f.ino).unwrap(),
        vec![
            b"trusted.\xff\x00".to_vec(),
            b"user.a".to_vec(),
            b"user.b".to_vec()
        ]
    );
    let before = m.get(f.ino).unwrap().ctime;
    m.removexattr(f.ino, b"user.a").unwrap();
    assert!(m.get(f.ino).unwrap().ctime >= before);
    assert_err!(m.getxattr(f.ino, b"user.a"), FsError::NoXattr);
    assert_err!(m.removexattr(f.ino, b"user.a"), FsError::NoXattr);
    assert_eq!(m.listxattr(f.ino).unwrap().len(), 2);
    // Attributes are per inode.
    let g = mkfile(m, ROOT_INO, "g");
    assert!(m.listxattr(g.ino).unwrap().is_empty());
    m.setxattr(g.ino, b"user.b", b"g", false, false).unwrap();
    assert_eq!(m.getxattr(f.ino, b"user.b").unwrap(), b"3");
    // The inode with one attribute, as a write open (capabilities) and a
    // create (the directory's default ACL) read them.
    let (i, value) = m.get_with_xattr(f.ino, b"user.b").unwrap();
    assert_eq!((i, value), (m.get(f.ino).unwrap(), Some(b"3".to_vec())));
    assert_eq!(
        m.get_with_xattr(g.ino, b"user.b").unwrap().1,
        Some(b"g".to_vec())
    );
    assert!(m.get_with_xattr(f.ino, b"user.a").unwrap().1.is_none());
    assert!(
        m.get_with_xattr(g.ino, b"trusted.\xff\x00")
            .unwrap()
            .1
            .is_none()
    );
    assert_err!(m.get_with_xattr(g.ino + 1000, b"user.b"), FsError::NotFound);
}

/// One update stores attributes and values together; the limits count
/// what the backend has stored.
fn xattr_updates_and_limits(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    let i = m
        .update_xattrs(f.ino, &[b"user.a"], XattrLimits::NONE, &mut |i, cur| {
            assert_eq!((i.ino, cur), (f.ino, &[None][..]));
            Ok(XattrEdit {
                set: vec![(b"user.a".to_vec(), Some(b"1".to_vec()))],
                attrs: Some(AttrChange {
                    mode: Some(0o640),
                    ..AttrChange::default()
                }),
            })
        })
        .unwrap();
    assert_eq!(i.mode, 0o640);
    assert_eq!(m.get(f.ino).unwrap(), i);
    assert_eq!(m.getxattr(f.ino, b"user.a").unwrap(), b"1");
    m.update_xattrs(
        f.ino,
        &[b"user.a", b"user.z"],
        XattrLimits::NONE,
        &mut |_, cur| {
            assert_eq!(cur, &[Some(b"1".to_vec()), None][..]);
            Ok(XattrEdit::default())
        },
    )
    .unwrap();
    // "user.a" + 1 byte is 7 bytes.
    let put = |name: &[u8], len: usize, lim: XattrLimits| {
        m.update_xattrs(f.ino, &[], lim, &mut |_, _| {
            Ok(XattrEdit {
                set: vec![(name.to_vec(), Some(vec![b'v'; len]))],
                attrs: None,
            })
        })
    };
    let lim = XattrLimits {
        total: 100,
        names: 1000,
    };
    put(b"user.b", 60, lim).unwrap();
    assert_err!(
        put(b"user.c", 30, lim),
        FsError::XattrSpace {
            used: 109,
            limit: 100,
            ..
        }
    );
    assert_err!(m.getxattr(f.ino, b"user.c"), FsError::NoXattr);
    put(b"user.b", 87, lim).unwrap();
    // A node born with attributes.
    let mut n = node(Kind::Dir);
    n.xattrs = vec![(b"system.posix_acl_default".to_vec(), b"acl".to_vec())];
    let d = m.create(ROOT_INO, b"d", n).unwrap();
    assert_eq!(
        m.getxattr(d.ino, b"system.posix_acl_default").unwrap(),
        b"acl"
    );
    // Only a local store has a filesystem of its own to report.
    let space = m.space().unwrap();
    match m.backend() {
        "sqlite" => assert!(space.is_some_and(|s| s.total_bytes >= s.avail_bytes)),
        _ => assert_eq!(space, None),
    }
}

// ---- listings --------------------------------------------------------------

/// name -> cookie of every entry of `dir`.
fn cookies(m: &dyn Meta, dir: u64) -> HashMap<Vec<u8>, u64> {
    list_all(m, dir)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.cookie))
        .collect()
}

fn cookies_follow_inodes(m: &dyn Meta) {
    let d = mkdir(m, ROOT_INO, "d");
    let o = mkdir(m, ROOT_INO, "o");
    for n in ["a", "b", "c", "x"] {
        mkfile(m, d.ino, n);
    }
    let c0 = cookies(m, d.ino);
    assert!(c0.values().all(|&c| c >= FIRST_COOKIE));
    assert_eq!(c0.values().collect::<HashSet<_>>().len(), 4);
    // Listed in cookie order, a page at a time.
    let all = list_all(m, d.ino).unwrap();
    assert!(all.windows(2).all(|w| w[0].cookie < w[1].cookie));
    let page = m.readdir(d.ino, all[0].cookie, 2).unwrap();
    assert_eq!(page, all[1..3]);
    assert!(m.readdir(d.ino, all[3].cookie, 10).unwrap().is_empty());
    assert!(m.readdir(d.ino, 0, 0).unwrap().is_empty());
    // A rename keeps the inode's place; an exchange swaps the places.
    m.rename(d.ino, b"a", d.ino, b"z", false, false).unwrap();
    m.rename(d.ino, b"b", d.ino, b"c", false, true).unwrap();
    let c1 = cookies(m, d.ino);
    assert_eq!(
        (c1[&b"z"[..]], c1[&b"c"[..]], c1[&b"b"[..]]),
        (c0[&b"a"[..]], c0[&b"b"[..]], c0[&b"c"[..]])
    );
    // A move takes it along; replacing an entry drops the replaced place.
    m.rename(d.ino, b"x", o.ino, b"x", false, false).unwrap();
    assert_eq!(cookies(m, o.ino)[&b"x"[..]], c0[&b"x"[..]]);
    m.rename(d.ino, b"z", d.ino, b"c", false, false).unwrap();
    let c2 = cookies(m, d.ino);
    assert_eq!(c2.len(), 2);
    assert_eq!(c2[&b"c"[..]], c0[&b"a"[..]]);
    // A new name (a link) gets a place of its own.
    let b = m.lookup(d.ino, b"b").unwrap();
    m.link(b.ino, d.ino, b"l").unwrap();
    let c3 = cookies(m, d.ino);
    assert!(!c0.values().any(|&c| c == c3[&b"l"[..]]));
}

/// A listing read a few entries at a time while another daemon removes,
/// adds and renames entries between the pages: each entry that stayed is
/// returned exactly once, an entry renamed within the directory once
/// under one of its names, and nothing twice.
fn listing_survives_changes(a: &dyn Meta, b: &dyn Meta) {
    const N: usize = 200;
    /// Pages between which the directory changes.
    const ROUNDS: usize = 20;
    let d = mkdir(a, ROOT_INO, "d");
    let o = mkdir(a, ROOT_INO, "o");
    for k in 0..N {
        mkfile(a, d.ino, &format!("f{k:03}"));
    }
    let name = |k: usize| format!("f{k:03}");
    let mut listed: Vec<Vec<u8>> = Vec::new();
    let mut after = 0;
    let mut round = 0;
    loop {
        let page = a.readdir(d.ino, after, 7).unwrap();
        assert!(page.len() <= 7);
        if page.is_empty() {
            break;
        }
        for e in &page {
            assert!(e.cookie > after, "cookies go up within a listing");
            after = e.cookie;
        }
        listed.extend(page.into_iter().map(|e| e.name));
        if round == ROUNDS {
            continue;
        }
        round += 1;
        let k = 3 * round;
        b.unlink(d.ino, name(k).as_bytes()).unwrap();
        b.unlink(d.ino, name(N - 1 - k).as_bytes()).unwrap();
        b.rename(
            d.ino,
            name(k + 1).as_bytes(),
            d.ino,
            format!("r{k:03}").as_bytes(),
            false,
            false,
        )
        .unwrap();
        b.rename(
            d.ino,
            name(k + 2).as_bytes(),
            o.ino,
            name(k + 2).as_bytes(),
            false,
            false,
        )
        .unwrap();
        mkfile(b, d.ino, &format!("new{round:03}"));
    }
    assert!(
        3 * round + 2 < N - 1 - 3 * round,
        "the test's own sets overlap"
    );
    let mut count: HashMap<Vec<u8>, usize> = HashMap::new();
    for n in &listed {
        *count.entry(n.clone()).or_default() += 1;
    }
    assert!(count.values().all(|&c| c == 1), "listed twice: {count:?}");
    let seen = |n: &str| count.get(n.as_bytes()).copied().unwrap_or(0);
    let touched =
        |k: usize| (1..=round).any(|r| (3 * r..=3 * r + 2).contains(&k) || k == N - 1 - 3 * r);
    for k in (0..N).filter(|&k| !touched(k)) {
        assert_eq!(
            seen(&name(k)),
            1,
            "{} stayed and was not listed once",
            name(k)
        );
    }
    for r in 1..=round {
        let k = 3 * r + 1;
        assert_eq!(
            seen(&name(k)) + seen(&format!("r{k:03}")),
            1,
            "{} renamed in place",
            name(k)
        );
    }
}

// ---- blocks and files under construction --------------------------------

fn commit_batches(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    let b0 = block(f.ino, 0, 10, vec![0, 1]);
    let b1 = block(f.ino, 1, 11, vec![1, 2]);
    let gone = m
        .commit(
            &[
                Change::PutUc(uc(f.ino, 7)),
                Change::PutBlock(b0.clone()),
                Change::PutBlock(b1.clone()),
                Change::SetSize {
                    ino: f.ino,
                    size: 8192,
                    touch: Some(5555),
                },
            ],
            false,
        )
        .unwrap();
    assert!(gone.is_empty());
    let i = m.get(f.ino).unwrap();
    assert_eq!(
        (i.size, i.mtime, i.ctime, i.last_epoch),
        (8192, 5555, 5555, 7)
    );
    assert_eq!(m.blocks(f.ino).unwrap(), vec![b0.clone(), b1.clone()]);
    assert_eq!(m.list_uc().unwrap(), vec![uc(f.ino, 7)]);
    assert_eq!(m.uc(f.ino).unwrap(), Some(uc(f.ino, 7)));
    assert_eq!(m.uc(f.ino + 1000).unwrap(), None);

    // Truncate: the dropped rows come back; size without a touch.
    let gone = m
        .commit(
            &[
                Change::DropBlocksFrom {
                    ino: f.ino,
                    from: 1,
                },
                Change::SetSize {
                    ino: f.ino,
                    size: 4096,
                    touch: None,
                },
            ],
            true,
        )
        .unwrap();
    assert_eq!(gone, vec![b1.clone()]);
    let i = m.get(f.ino).unwrap();
    assert_eq!((i.size, i.mtime), (4096, 5555));
    assert_eq!(m.blocks(f.ino).unwrap(), vec![b0.clone()]);
    assert!(
        m.commit(
            &[Change::DropBlocksFrom {
                ino: f.ino,
                from: 5
            }],
            false
        )
        .unwrap()
        .is_empty()
    );

    // Epochs only rise.
    m.commit(
        &[Change::SetLastEpoch {
            ino: f.ino,
            epoch: 3,
        }],
        false,
    )
    .unwrap();
    assert_eq!(m.get(f.ino).unwrap().last_epoch, 7);
    m.commit(&[Change::PutUc(uc(f.ino, 5))], false).unwrap();
    assert_eq!(m.get(f.ino).unwrap().last_epoch, 7);
    assert_eq!(m.list_uc().unwrap(), vec![uc(f.ino, 5)], "replaced");
    m.commit(
        &[Change::SetLastEpoch {
            ino: f.ino,
            epoch: 9,
        }],
        false,
    )
    .unwrap();
    assert_eq!(m.get(f.ino).unwrap().last_epoch, 9);

    // Recovery's batch: drop the tail, rewrite the last block, close.
    let b0b = BlockRow {
        gs: 2000,
        len: 100,
        ..b0.clone()
    };
    m.commit(&[Change::PutBlock(b1.clone())], false).unwrap();
    let gone = m
        .commit(
            &[
                Change::DropBlocksFrom {
                    ino: f.ino,
                    from: 0,
                },
                Change::PutBlock(b0b.clone()),
                Change::SetSize {
                    ino: f.ino,
                    size: 100,
                    touch: None,
                },
                Change::DelUc(f.ino),
            ],
            true,
        )
        .unwrap();
    assert_eq!(gone, vec![b0, b1]);
    assert_eq!(m.blocks(f.ino).unwrap(), vec![b0b]);
    assert!(m.list_uc().unwrap().is_empty());
    assert_eq!(m.uc(f.ino).unwrap(), None);
    assert_eq!(m.get(f.ino).unwrap().size, 100);
    // Changes to a missing inode are no-ops, as SQL updates of no row.
    m.commit(
        &[
            Change::SetSize {
                ino: 999_999,
                size: 1,
                touch: Some(1),
            },
            Change::SetLastEpoch {
                ino: 999_999,
                epoch: 1,
            },
            Change::DelUc(999_999),
        ],
        false,
    )
    .unwrap();
    assert_err!(m.get(999_999), FsError::NotFound);
    m.sync_if_needed().unwrap();
}

fn blocks_and_index(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    let g = mkfile(m, ROOT_INO, "g");
    let rows = [
        block(g.ino, 1, 23, vec![2]),
        block(f.ino, 1, 21, vec![1]),
        block(g.ino, 0, 22, vec![0, 2]),
        block(f.ino, 0, 20, vec![0]),
    ];
    let ch: Vec<Change> = rows.iter().cloned().map(Change::PutBlock).collect();
    m.commit(&ch, false).unwrap();
    let all = m.all_blocks().unwrap();
    let order: Vec<(u64, u64)> = all.iter().map(|b| (b.ino, b.idx)).collect();
    assert_eq!(order, vec![(f.ino, 0), (f.ino, 1), (g.ino, 0), (g.ino, 1)]);
    assert_eq!(
        m.blocks(g.ino).unwrap(),
        vec![rows[2].clone(), rows[0].clone()]
    );
    assert!(m.blocks(999_999).unwrap().is_empty());
    assert!(on(m, 22, 0));
    assert!(on(m, 22, 2));
    assert!(!on(m, 22, 1));
    assert!(!on(m, 99, 0));
    // A row rewritten under a new block id: the old id is no longer there.
    m.commit(&[Change::PutBlock(block(f.ino, 0, 30, vec![1]))], false)
        .unwrap();
    assert!(!on(m, 20, 0));
    assert!(on(m, 30, 1));
    // Replicas updated under the same id.
    m.commit(&[Change::PutBlock(block(f.ino, 0, 30, vec![2]))], false)
        .unwrap();
    assert!(!on(m, 30, 1));
    assert!(on(m, 30, 2));
    m.commit(
        &[Change::DropBlocksFrom {
            ino: g.ino,
            from: 0,
        }],
        false,
    )
    .unwrap();
    assert!(!on(m, 22, 0));
    assert!(!on(m, 23, 2));
    assert_eq!(m.all_blocks().unwrap().len(), 2);
}

fn delete_inode_and_orphans(m: &dyn Meta) {
    let f = mkfile(m, ROOT_INO, "f");
    let keep = mkfile(m, ROOT_INO, "keep");
    let rows = vec![block(f.ino, 0, 40, vec![0]), block(f.ino, 1, 41, vec![0])];
    let mut ch: Vec<Change> = rows.iter().cloned().map(Change::PutBlock).collect();
    ch.push(Change::PutUc(uc(f.ino, 3)));
    ch.push(Change::PutBlock(block(keep.ino, 0, 50, vec![1])));
    m.commit(&ch, false).unwrap();
    m.setxattr(f.ino, b"user.x", b"y", false, false).unwrap();
    assert!(m.orphans().unwrap().is_empty());

    // An inode with a name is not deleted.
    m.delete_inode(keep.ino).unwrap();
    assert_eq!(m.get(keep.ino).unwrap().nlink, 1);

    assert_eq!(m.unlink(ROOT_INO, b"f").unwrap().nlink, 0);
    assert_eq!(m.orphans().unwrap(), vec![f.ino]);
    assert_eq!(m.delete_inode(f.ino).unwrap(), rows);
    assert_err!(m.get(f.ino), FsError::NotFound);
    assert!(m.orphans().unwrap().is_empty());
    assert!(m.blocks(f.ino).unwrap().is_empty());
    assert!(!on(m, 40, 0));
    assert!(m.list_uc().unwrap().is_empty());
    assert!(m.listxattr(f.ino).unwrap().is_empty());
    assert!(
        m.delete_inode(f.ino).unwrap().is_empty(),
        "a second delete is a no-op"
    );
    assert_eq!(m.lookup(ROOT_INO, b"keep").unwrap().ino, keep.ino);
}

// ---- counters, configuration and audit -----------------------------------

fn reserve_epochs_monotonic(m: &dyn Meta) {
    let a = m.reserve_epochs(100).unwrap();
    assert!(a >= 1);
    let b = m.reserve_epochs(100).unwrap();
    assert_eq!(b, a + 100);
    let c = m.reserve_epochs(1).unwrap();
    assert_eq!(c, b + 100);
    assert_eq!(m.reserve_epochs(5).unwrap(), c + 1);
}

fn audit_order(m: &dyn Meta) {
    let ev = |election: &str, event: &str, epoch: u64| AuditEvent {
        election: election.into(),
        event: event.into(),
        who: "w".into(),
        host: "h".into(),
        pid: 1,
        epoch,
        at_ms: epoch * 10,
        why: "because".into(),
    };
    let es = [
        ev("/e1", "elected", 1),
        ev("/e1/sub", "elected", 2),
        ev("/e1", "resigned", 3),
        ev("/e2", "elected", 4),
        ev("/e1", "elected", 5),
    ];
    let mut last = 0;
    for e in &es {
        let seq = m.audit(e, 0).unwrap().expect("recorded");
        assert!(seq > last, "sequence numbers rise");
        last = seq;
    }
    assert_eq!(
        m.audit_history("/e1").unwrap(),
        vec![es[0].clone(), es[2].clone(), es[4].clone()]
    );
    assert_eq!(m.audit_history("/e1/sub").unwrap(), vec![es[1].clone()]);
    assert_eq!(m.audit_history("/e2").unwrap(), vec![es[3].clone()]);
    assert!(m.audit_history("/e").unwrap().is_empty());
}

/// The backend judges redundancy ([`AuditEvent::is_redundant`], tested
/// with the types) against the election's events it has stored, in the
/// step that records.
fn audit_leaves_out_redundant_events(m: &dyn Meta) {
    let ev = |event: &str, who: &str, epoch: u64, at_ms: u64| AuditEvent {
        election: "/el".into(),
        event: event.into(),
        who: who.into(),
        host: "h".into(),
        pid: 1,
        epoch,
        at_ms,
        why: String::new(),
    };
    assert!(m.audit(&ev("elected", "a", 7, 1), 0).unwrap().is_some());
    assert_eq!(
        m.audit(&ev("elected", "b", 7, 2), 0).unwrap(),
        None,
        "second start"
    );
    assert!(m.audit(&ev("preempted", "a", 7, 3), 0).unwrap().is_some());
    assert_eq!(
        m.audit(&ev("expired", "a", 7, 4), 0).unwrap(),
        None,
        "second guess"
    );
    assert!(m.audit(&ev("expired", "a", 8, 6), 0).unwrap().is_some());
    let other = AuditEvent {
        election: "/other".into(),
        ..ev("elected", "a", 7, 7)
    };
    assert!(m.audit(&other, 0).unwrap().is_some());
    let kinds: Vec<String> = m
        .audit_history("/el")
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.event, e.epoch))
        .collect();
    assert_eq!(kinds, ["elected 7", "preempted 7", "expired 8"]);
    // Without an epoch (housekeeping leadership), every event counts.
    let hk = |event: &str| AuditEvent {
        election: "housekeeping".into(),
        ..ev(event, "daemon 1", 0, 9)
    };
    for e in ["elected", "lost", "elected"] {
        assert!(m.audit(&hk(e), 0).unwrap().is_some(), "{e}");
    }
    assert_eq!(m.audit_history("housekeeping").unwrap().len(), 3);
}

/// The table keeps each user's newest events (recording one more drops
/// that user's oldest, nobody else's); an election's events are read a
/// page at a time, newest pages first.
fn audit_bounded_per_user_and_paged(m: &dyn Meta) {
    use leasefs::meta::MAX_EVENTS_PER_USER as MAX;
    let ev = |election: &str, epoch: u64| AuditEvent {
        election: election.into(),
        event: "resigned".into(),
        who: "w".into(),
        host: "h".into(),
        pid: 1,
        epoch,
        at_ms: epoch,
        why: String::new(),
    };
    m.audit(&ev("/theirs", 1), 1000).unwrap().expect("recorded");
    for epoch in 1..=(MAX as u64 + 20) {
        let election = if epoch % 2 == 0 { "/a" } else { "/b" };
        m.audit(&ev(election, epoch), 65534)
            .unwrap()
            .expect("recorded");
    }
    let a = m.audit_history("/a").unwrap();
    let b = m.audit_history("/b").unwrap();
    assert_eq!(a.len() + b.len(), MAX, "events of one user kept");
    let oldest = a.iter().chain(&b).map(|e| e.epoch).min();
    assert_eq!(oldest, Some(21), "the oldest go first");
    assert_eq!(
        m.audit_history("/theirs").unwrap().len(),
        1,
        "another user's event went"
    );
    let last = m.audit_page("/a", None, 10).unwrap();
    let epochs: Vec<u64> = last.iter().map(|(_, e)| e.epoch).collect();
    let want: Vec<u64> = (0..10).map(|i| MAX as u64 + 2 + 2 * i).collect();
    assert_eq!(epochs, want, "the newest page, oldest first");
    let before = m.audit_page("/a", Some(last[0].0), 3).unwrap();
    let epochs: Vec<u64> = before.iter().map(|(_, e)| e.epoch).collect();
    assert_eq!(epochs, [MAX as u64 - 4, MAX as u64 - 2, MAX as u64]);
}

/// Fences are kept per daemon lineage, replaced by process group, and
/// forgotten one by one.
fn fences_per_owner(m: &dyn Meta) {
    let f = |owner: &str, pgid: u32, epoch: u64| FenceRecord {
        owner: owner.into(),
        pgid,
        start_ticks: 1000 + pgid as u64,
        boot_id: "boot".into(),
        cgroup: pgid
            .is_multiple_of(2)
            .then(|| format!("/leasefs-elect.1.{pgid}")),
        leader: "/el/LEADER".into(),
        ino: 9,
        epoch,
        who: "a".into(),
        pid: 77,
    };
    assert!(m.fences("h:/d").unwrap().is_empty());
    m.put_fence(&f("h:/d", 300, 5)).unwrap();
    m.put_fence(&f("h:/d", 42, 6)).unwrap();
    m.put_fence(&f("h:/other", 42, 7)).unwrap();
    m.put_fence(&f("h:/d", 300, 8)).unwrap();
    assert_eq!(
        m.fences("h:/d").unwrap(),
        vec![f("h:/d", 42, 6), f("h:/d", 300, 8)]
    );
    m.delete_fence("h:/d", 42).unwrap();
    m.delete_fence("h:/d", 42).unwrap();
    assert_eq!(m.fences("h:/d").unwrap(), vec![f("h:/d", 300, 8)]);
    assert_eq!(m.fences("h:/other").unwrap(), vec![f("h:/other", 42, 7)]);
}

fn datanode_registry_and_replication(m: &dyn Meta) {
    assert_eq!(m.replication().unwrap(), None);
    m.set_replication(2).unwrap();
    assert_eq!(m.replication().unwrap(), Some(2));
    let fsid = m.filesystem_id().unwrap();
    assert!(fsid.starts_with("FS-"), "{fsid}");
    assert_eq!(m.filesystem_id().unwrap(), fsid, "created once");
    assert!(m.datanode_records().unwrap().is_empty());
    let a = m
        .register_datanode("DS-a", Path::new("/d/a"), None)
        .unwrap();
    let b = m
        .register_datanode("DS-b", Path::new("/d/b"), None)
        .unwrap();
    assert_eq!((a, b), (DnId(0), DnId(1)));
    // A known storage keeps its id wherever its directory is now.
    assert_eq!(
        m.register_datanode("DS-a", Path::new("/moved/a"), None)
            .unwrap(),
        a
    );
    assert_eq!(
        m.datanode_records().unwrap(),
        vec![
            DatanodeRecord {
                id: a,
                storage_id: Some("DS-a".into()),
                path: "/moved/a".into(),
                state: AdminState::Normal,
                host: None,
            },
            DatanodeRecord {
                id: b,
                storage_id: Some("DS-b".into()),
                path: "/d/b".into(),
                state: AdminState::Normal,
                host: None,
            },
        ]
    );
    // Only a datanode awaiting its identity takes a new storage ID.
    assert_eq!(m.claim_legacy_datanode(a, "DS-other").unwrap(), "DS-a");
    assert!(m.claim_legacy_datanode(DnId(7), "DS-x").is_err());
}

/// Daemons attaching one new object-store prefix each claim a storage ID
/// for it and get the first claim's, until a datanode registers it (then
/// the prefix was that datanode's, emptied since: a new claim wins).
fn one_storage_id_per_new_object_store_prefix(a: &dyn Meta, b: &dyn Meta) {
    let url = Path::new("s3://bucket/new");
    assert_eq!(a.claim_storage_id(url, "DS-1").unwrap(), "DS-1");
    assert_eq!(b.claim_storage_id(url, "DS-2").unwrap(), "DS-1");
    assert_eq!(
        b.claim_storage_id(Path::new("s3://bucket/other"), "DS-3")
            .unwrap(),
        "DS-3"
    );
    b.register_datanode("DS-1", url, None).unwrap();
    assert_eq!(a.claim_storage_id(url, "DS-4").unwrap(), "DS-4");
    assert_eq!(b.claim_storage_id(url, "DS-5").unwrap(), "DS-4");
}

/// Admin states change only from the states asked for; a removal leaves a
/// tombstone (the storage ID keeps its id, which is never reused) and no
/// block row listing the datanode; a compare-and-set row change applies
/// only to the row it read.
fn datanode_admin_states_and_removal(m: &dyn Meta) {
    let a = m
        .register_datanode("DS-a", Path::new("/d/a"), None)
        .unwrap();
    let b = m
        .register_datanode("DS-b", Path::new("/d/b"), None)
        .unwrap();
    let dir = mkdir(m, ROOT_INO, "d");
    let f = mkfile(m, dir.ino, "f");
    let rows: Vec<BlockRow> = (0..60)
        .map(|i| {
            block(
                f.ino,
                i,
                500 + i,
                if i % 2 == 0 {
                    vec![a.0, b.0]
                } else {
                    vec![b.0]
                },
            )
        })
        .collect();
    let puts: Vec<Change> = rows.iter().cloned().map(Change::PutBlock).collect();
    for page in puts.chunks(20) {
        m.commit(page, false).unwrap();
    }
    let to = |from: &[AdminState], to| m.set_datanode_state(a, from, to).unwrap();
    assert_eq!(
        to(&[AdminState::Normal], AdminState::Decommissioning),
        AdminState::Normal
    );
    // Not from the state asked for: unchanged, and the caller is told.
    assert_eq!(
        to(&[AdminState::Normal], AdminState::Decommissioned),
        AdminState::Decommissioning
    );
    assert_eq!(
        to(&[AdminState::Decommissioning], AdminState::Decommissioned),
        AdminState::Decommissioning
    );
    let state = |id: DnId| {
        m.datanode_records()
            .unwrap()
            .into_iter()
            .find(|r| r.id == id)
            .map(|r| r.state)
    };
    assert_eq!(state(a), Some(AdminState::Decommissioned));
    assert_err!(
        m.set_datanode_state(DnId(9), &[AdminState::Normal], AdminState::Removed),
        FsError::NotFound
    );

    // Compare-and-set: applies to the row read, refuses a changed one.
    let mut moved = rows[1].clone();
    moved.replicas = vec![a];
    m.commit(
        &[Change::PutBlockIf {
            expect: rows[1].clone(),
            row: moved.clone(),
        }],
        false,
    )
    .unwrap();
    let stale = Change::PutBlockIf {
        expect: rows[1].clone(),
        row: rows[1].clone(),
    };
    assert!(matches!(m.commit(&[stale], false), Err(FsError::Moved(_))));
    assert!(on(m, rows[1].block_id, a.0) && !on(m, rows[1].block_id, b.0));

    m.remove_datanode(a).unwrap();
    assert_eq!(state(a), Some(AdminState::Removed));
    assert!(
        m.all_blocks()
            .unwrap()
            .iter()
            .all(|r| !r.replicas.contains(&a))
    );
    assert!(on(m, rows[0].block_id, b.0));
    assert!(
        m.block_by_id(rows[1].block_id)
            .unwrap()
            .unwrap()
            .replicas
            .is_empty()
    );
    // Removing again finishes nothing new and fails nothing.
    m.remove_datanode(a).unwrap();
    // Its storage ID keeps its id; a new storage gets a new one.
    assert_eq!(
        m.register_datanode("DS-c", Path::new("/d/c"), None)
            .unwrap(),
        DnId(2)
    );
}

/// What the positional layout recorded (the `--datanode` list of the last
/// mount) is a registry of `upgrading` datanodes whose ids are their old
/// places; the first claim of each wins, and registering finishes it.
fn positional_upgrade(m: &dyn Meta) {
    assert_eq!(m.replication().unwrap(), Some(2));
    let recs = m.datanode_records().unwrap();
    let paths: Vec<(DnId, Option<String>, PathBuf, AdminState)> = recs
        .into_iter()
        .map(|r| (r.id, r.storage_id, r.path, r.state))
        .collect();
    assert_eq!(
        paths,
        vec![
            (DnId(0), None, "/old/a".into(), AdminState::Upgrading),
            (DnId(1), None, "/old/b".into(), AdminState::Upgrading),
        ]
    );
    assert_eq!(m.claim_legacy_datanode(DnId(1), "DS-1").unwrap(), "DS-1");
    assert_eq!(m.claim_legacy_datanode(DnId(1), "DS-9").unwrap(), "DS-1");
    assert_eq!(
        m.register_datanode("DS-1", Path::new("/new/b"), None)
            .unwrap(),
        DnId(1)
    );
    let b = &m.datanode_records().unwrap()[1];
    assert_eq!(
        (b.path.as_path(), b.state),
        (Path::new("/new/b"), AdminState::Normal)
    );
    // A new datanode takes the next free id.
    assert_eq!(
        m.register_datanode("DS-new", Path::new("/new/c"), None)
            .unwrap(),
        DnId(2)
    );
}

#[test]
fn sqlite_database_of_the_positional_layout_is_upgraded_at_open() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("meta.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE datanodes(idx INTEGER PRIMARY KEY, path TEXT NOT NULL);
             INSERT INTO datanodes VALUES(0, '/old/a'), (1, '/old/b');
             CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT INTO counters VALUES('replication', 2);",
        )
        .unwrap();
    }
    positional_upgrade(&MetaStore::open(&db, UID, GID).unwrap());
    // Opening again changes nothing.
    let m = MetaStore::open(&db, UID, GID).unwrap();
    assert_eq!(m.datanode_records().unwrap().len(), 3);
}

fn usage(m: &dyn Meta) {
    assert_eq!(m.usage().unwrap(), (1, 0));
    let f = mkfile(m, ROOT_INO, "f");
    mkdir(m, ROOT_INO, "d");
    m.commit(
        &[Change::SetSize {
            ino: f.ino,
            size: 100,
            touch: None,
        }],
        false,
    )
    .unwrap();
    assert_eq!(m.usage().unwrap(), (3, 100));
}

// ---- two daemons ---------------------------------------------------------

/// A generation stamp says which state of a block is newer, whichever
/// daemon allocated it: recovery takes a replica whose stamp is above the
/// record for one the metadata never recorded, and drops it. Stamps handed
/// out from per-daemon ranges broke that over etcd: daemon B's later stamp
/// could be below daemon A's earlier one, and a reopen by B cut off from
/// etcd after its commit landed left every replica "ahead" of the record
/// (the chaos rounds lost 42 acknowledged lines to it).
fn gen_stamps_rise_across_daemons(a: &dyn Meta, b: &dyn Meta) {
    let mut last = 0;
    for i in 0..50 {
        let m = if i % 2 == 0 { a } else { b };
        let gs = m.alloc(Counter::GenStamp).unwrap();
        assert!(
            gs > last,
            "stamp {gs} (daemon {}) after {last}: not above it",
            if i % 2 == 0 { "a" } else { "b" }
        );
        last = gs;
    }
}

fn alloc_unique_across_daemons(a: &dyn Meta, b: &dyn Meta) {
    assert!(a.alloc(Counter::GenStamp).unwrap() >= 1000);
    assert!(a.alloc(Counter::Block).unwrap() >= 1);
    let per_thread = 1500;
    let ids: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let m = if t % 2 == 0 { a } else { b };
                sc.spawn(move || {
                    (0..per_thread)
                        .map(|_| m.alloc(Counter::Block).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = ids.iter().flatten().copied().collect();
    for per in &ids {
        assert!(
            per.windows(2).all(|w| w[0] < w[1]),
            "ids rise within a thread"
        );
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "duplicate ids");
    assert!(all[0] >= 1);
}

fn commit_is_atomic_to_readers(a: &dyn Meta, b: &dyn Meta) {
    let f = mkfile(a, ROOT_INO, "f");
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for k in 0..40u64 {
                a.commit(
                    &[
                        Change::PutBlock(block(f.ino, 2 * k, 100 + 2 * k, vec![0])),
                        Change::PutBlock(block(f.ino, 2 * k + 1, 101 + 2 * k, vec![0])),
                        Change::SetSize {
                            ino: f.ino,
                            size: (2 * k + 2) * 4096,
                            touch: None,
                        },
                    ],
                    false,
                )
                .unwrap();
            }
            done.store(true, Ordering::Release);
        });
        let mut reads = 0;
        while !done.load(Ordering::Acquire) || reads < 5 {
            let n = b.blocks(f.ino).unwrap().len();
            assert_eq!(n % 2, 0, "half a batch visible");
            reads += 1;
        }
    });
    assert_eq!(b.blocks(f.ino).unwrap().len(), 80);
    assert_eq!(b.get(f.ino).unwrap().size, 80 * 4096);
}

fn racing_create_one_wins(a: &dyn Meta, b: &dyn Meta) {
    let names = 12;
    let threads = 6;
    let wins: Vec<AtomicUsize> = (0..names).map(|_| AtomicUsize::new(0)).collect();
    let d = mkdir(a, ROOT_INO, "d");
    let barrier = Barrier::new(threads);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let m = if t % 2 == 0 { a } else { b };
            let (wins, barrier) = (&wins, &barrier);
            sc.spawn(move || {
                for (k, w) in wins.iter().enumerate() {
                    barrier.wait();
                    let kind = if k % 2 == 0 { Kind::File } else { Kind::Dir };
                    match m.create(d.ino, format!("n{k}").as_bytes(), node(kind)) {
                        Ok(_) => {
                            w.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(FsError::Exists) => {}
                        Err(e) => panic!("create: {e}"),
                    }
                }
            });
        }
    });
    for (k, w) in wins.iter().enumerate() {
        assert_eq!(w.load(Ordering::Relaxed), 1, "winners of n{k}");
    }
    assert_eq!(entries(a, d.ino).len(), names);
    assert_eq!(nlink(b, d.ino), 2 + names as u32 / 2);
    check_tree(a);
}

fn racing_renames_keep_tree_consistent(a: &dyn Meta, b: &dyn Meta) {
    let dirs = [
        mkdir(a, ROOT_INO, "A").ino,
        mkdir(a, ROOT_INO, "B").ino,
        ROOT_INO,
    ];
    let sub = mkdir(a, dirs[0], "sub").ino;
    let dirs = [dirs[0], dirs[1], dirs[2], sub];
    for k in 0..6 {
        mkfile(a, dirs[0], &format!("f{k}"));
    }
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let m = if t % 2 == 0 { a } else { b };
            sc.spawn(move || {
                let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t + 1) * 0x1234_5678));
                for _ in 0..60 {
                    let from = dirs[r.below(4) as usize];
                    let to = dirs[r.below(4) as usize];
                    let name = format!("f{}", r.below(6));
                    let other = format!("f{}", r.below(6));
                    let res = match r.below(6) {
                        0 | 1 => m
                            .rename(from, name.as_bytes(), to, other.as_bytes(), false, false)
                            .map(drop),
                        2 => m
                            .rename(from, name.as_bytes(), to, other.as_bytes(), false, true)
                            .map(drop),
                        3 => match m.lookup(from, name.as_bytes()) {
                            Ok(i) => m.link(i.ino, to, other.as_bytes()).map(drop),
                            Err(e) => Err(e),
                        },
                        4 => m.unlink(from, name.as_bytes()).map(drop),
                        _ => m.create(to, name.as_bytes(), node(Kind::File)).map(drop),
                    };
                    match res {
                        Ok(()) | Err(FsError::NotFound | FsError::Exists) => {}
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            });
        }
    });
    check_tree(a);
    check_tree(b);
}

fn racing_dir_swaps_make_no_cycle(a: &dyn Meta, b: &dyn Meta) {
    let x = mkdir(a, ROOT_INO, "x").ino;
    let y = mkdir(a, ROOT_INO, "y").ino;
    for round in 0..8 {
        let barrier = Barrier::new(2);
        let results: Vec<Result<(), FsError>> = std::thread::scope(|sc| {
            let h1 = sc.spawn(|| {
                barrier.wait();
                a.rename(ROOT_INO, b"x", y, b"x", false, false).map(drop)
            });
            let h2 = sc.spawn(|| {
                barrier.wait();
                b.rename(ROOT_INO, b"y", x, b"y", false, false).map(drop)
            });
            vec![h1.join().unwrap(), h2.join().unwrap()]
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {results:?}");
        for r in &results {
            assert!(matches!(r, Ok(()) | Err(FsError::Invalid(_))), "{r:?}");
        }
        check_tree(a);
        // Back to both at the root.
        if results[0].is_ok() {
            a.rename(y, b"x", ROOT_INO, b"x", false, false).unwrap();
        } else {
            a.rename(x, b"y", ROOT_INO, b"y", false, false).unwrap();
        }
    }
    // The same deeper down, where the two moves share no directory: p/x/z
    // into q/y, and q into p/x/z. Only the ancestor walks see each other.
    let p = mkdir(a, ROOT_INO, "p").ino;
    let q = mkdir(a, ROOT_INO, "q").ino;
    let x = mkdir(a, p, "x").ino;
    let z = mkdir(a, x, "z").ino;
    let y = mkdir(a, q, "y").ino;
    for round in 0..8 {
        let barrier = Barrier::new(2);
        let results: Vec<Result<(), FsError>> = std::thread::scope(|sc| {
            let h1 = sc.spawn(|| {
                barrier.wait();
                a.rename(p, b"x", y, b"x", false, false).map(drop)
            });
            let h2 = sc.spawn(|| {
                barrier.wait();
                b.rename(ROOT_INO, b"q", z, b"q", false, false).map(drop)
            });
            vec![h1.join().unwrap(), h2.join().unwrap()]
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "deep round {round}: {results:?}");
        check_tree(a);
        if results[0].is_ok() {
            a.rename(y, b"x", p, b"x", false, false).unwrap();
        } else {
            a.rename(z, b"q", ROOT_INO, b"q", false, false).unwrap();
        }
    }
}

// ---- etcd only -----------------------------------------------------------

mod etcd_only {
    use super::*;

    /// A host's copies (`-o local_copy`) are recorded with the host, in
    /// the registration itself; the next registration says again what the
    /// datanode is (a mount without the option makes it shared), and a
    /// record without a host reads as before. SQLite refuses copies.
    #[test]
    fn a_datanode_is_recorded_with_the_host_whose_copies_it_holds() {
        let p = etcd("host_copies");
        let a =
            p.a.register_datanode("DS-a", Path::new("/local/a"), Some("host-a"))
                .unwrap();
        let s3 =
            p.a.register_datanode("DS-s", Path::new("s3://b/p"), None)
                .unwrap();
        let host_of = |m: &EtcdMeta, id: DnId| {
            m.datanode_records()
                .unwrap()
                .into_iter()
                .find(|r| r.id == id)
                .unwrap()
                .host
        };
        assert_eq!(
            host_of(&p.b, a).as_deref(),
            Some("host-a"),
            "the other daemon sees it"
        );
        assert_eq!(host_of(&p.b, s3), None);
        assert_eq!(
            p.b.register_datanode("DS-a", Path::new("/local/a"), None)
                .unwrap(),
            a
        );
        assert_eq!(host_of(&p.a, a), None);
        let (_d, sqlite) = super::sqlite();
        let e = sqlite
            .register_datanode("DS-a", Path::new("/local/a"), Some("host-a"))
            .unwrap_err();
        assert!(e.to_string().contains("etcd"), "{e}");
        assert!(sqlite.datanode_records().unwrap().is_empty());
    }

    /// The positional layout's `dn` record becomes the registry at open.
    #[test]
    fn etcd_record_of_the_positional_layout_is_upgraded_at_open() {
        let server = EtcdServer::shared();
        let (conn, name) = server.connect("positional");
        let key = conn.key("dn");
        conn.run(|mut c| async move {
            c.put(key, r#"{"dirs":["/old/a","/old/b"],"replication":2}"#, None)
                .await
        })
        .unwrap();
        positional_upgrade(&EtcdMeta::open(conn, UID, GID).unwrap());
        let again = EtcdMeta::open(server.connect_to(&name), UID, GID).unwrap();
        assert_eq!(again.datanode_records().unwrap().len(), 3);
    }

    /// A second daemon opening the filesystem sees it as it is: the root
    /// and counters are not initialised twice.
    #[test]
    fn second_daemon_sees_the_namespace() {
        let p = etcd("second_daemon");
        let d = mkdir(&p.a, ROOT_INO, "d");
        let id = p.a.alloc(Counter::Block).unwrap();
        let e = p.a.reserve_epochs(10).unwrap();
        let late = EtcdMeta::open(p.etcd.clone(), 1, 1).unwrap();
        assert_eq!(late.backend(), "etcd");
        assert_eq!(late.lookup(ROOT_INO, b"d").unwrap(), d);
        assert_eq!(late.get(ROOT_INO).unwrap().uid, UID);
        assert_eq!(nlink(&late, ROOT_INO), 3);
        assert!(late.alloc(Counter::Block).unwrap() > id);
        assert_eq!(late.reserve_epochs(1).unwrap(), e + 10);
        assert!(late.alloc(Counter::Ino).unwrap() > d.ino);
    }

    /// A file of more blocks than one etcd Txn may touch keys: deleting it
    /// still returns every block and leaves no `bid/` index key behind.
    #[test]
    fn large_file_deletes_in_one_step() {
        let p = etcd("large_file");
        let f = mkfile(&p.a, ROOT_INO, "big");
        let n = 300u64;
        let rows: Vec<BlockRow> = (0..n).map(|i| block(f.ino, i, 5000 + i, vec![0])).collect();
        for chunk in rows.chunks(40) {
            let ch: Vec<Change> = chunk.iter().cloned().map(Change::PutBlock).collect();
            p.a.commit(&ch, false).unwrap();
        }
        assert!(on(&p.b, 5000 + n - 1, 0));
        let index_keys = || {
            let key = p.etcd.key("bid/");
            p.etcd
                .run(|mut c| async move {
                    let o = etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only();
                    c.get(key, Some(o)).await
                })
                .unwrap()
                .count()
        };
        assert_eq!(index_keys(), n as i64);
        p.a.unlink(ROOT_INO, b"big").unwrap();
        assert_eq!(p.b.delete_inode(f.ino).unwrap(), rows);
        assert!(p.a.all_blocks().unwrap().is_empty());
        assert!(!on(&p.a, 5000, 0));
        assert_eq!(index_keys(), 0, "stale block index keys");
    }

    /// A filesystem written before listing cookies existed (entries
    /// without a cookie and no `o/` listing) is upgraded when a daemon
    /// opens it: every entry is listed again, each once.
    #[test]
    fn entries_without_cookies_are_upgraded() {
        let p = etcd("cookie_upgrade");
        let d = mkdir(&p.a, ROOT_INO, "d");
        for k in 0..120 {
            mkfile(&p.a, d.ino, &format!("f{k}"));
        }
        let raw = |prefix: &str| {
            let key = p.etcd.key(prefix);
            p.etcd
                .run(|mut c| async move {
                    let o = etcd_client::GetOptions::new().with_prefix();
                    c.get(key, Some(o)).await
                })
                .unwrap()
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect::<Vec<_>>()
        };
        // Back to the old layout.
        for (k, v) in raw("d/") {
            let mut rec: serde_json::Value = serde_json::from_slice(&v).unwrap();
            rec.as_object_mut().unwrap().remove("cookie");
            let v = serde_json::to_vec(&rec).unwrap();
            p.etcd
                .run(|mut c| async move { c.put(k, v, None).await })
                .unwrap();
        }
        for k in [p.etcd.key("o/"), p.etcd.key("c/layout")] {
            p.etcd
                .run(|mut c| async move {
                    let o = etcd_client::DeleteOptions::new().with_prefix();
                    c.delete(k, Some(o)).await
                })
                .unwrap();
        }
        assert!(list_all(&p.a, d.ino).unwrap().is_empty());
        let late = EtcdMeta::open(p.etcd.clone(), UID, GID).unwrap();
        let listed = cookies(&late, d.ino);
        assert_eq!(listed.len(), 120);
        assert_eq!(listed.values().collect::<HashSet<_>>().len(), 120);
        assert_eq!(cookies(&late, ROOT_INO).len(), 1);
        // New entries get cookies of their own.
        mkfile(&late, d.ino, "new");
        assert_eq!(cookies(&p.b, d.ino).len(), 121);
        check_tree(&late);
    }

    /// A step too large for one Txn fails whole: nothing of it is applied.
    #[test]
    fn oversized_commit_applies_nothing() {
        let p = etcd("oversized_commit");
        let files: Vec<Inode> = (0..140)
            .map(|k| mkfile(&p.a, ROOT_INO, &format!("f{k}")))
            .collect();
        let ch: Vec<Change> = files
            .iter()
            .map(|f| Change::SetLastEpoch {
                ino: f.ino,
                epoch: 77,
            })
            .collect();
        assert_err!(p.a.commit(&ch, false), FsError::Meta(_));
        assert!(
            files
                .iter()
                .all(|f| p.b.get(f.ino).unwrap().last_epoch == 0)
        );
        // Within the limit it goes through.
        p.a.commit(&ch[..100], false).unwrap();
        assert!(
            files[..100]
                .iter()
                .all(|f| p.b.get(f.ino).unwrap().last_epoch == 77)
        );
    }

    /// Racing rmdir against creates inside the directory: either the
    /// directory went away empty or it stays with every created entry.
    #[test]
    fn rmdir_races_create_inside() {
        let p = etcd("rmdir_race");
        for round in 0..10 {
            let name = format!("d{round}");
            let d = mkdir(&p.a, ROOT_INO, &name);
            let barrier = Barrier::new(2);
            let (gone, made) = std::thread::scope(|sc| {
                let h1 = sc.spawn(|| {
                    barrier.wait();
                    p.a.rmdir(ROOT_INO, name.as_bytes())
                });
                let h2 = sc.spawn(|| {
                    barrier.wait();
                    p.b.create(d.ino, b"child", node(Kind::File))
                });
                (h1.join().unwrap(), h2.join().unwrap())
            });
            match (gone, made) {
                (Ok(_), Err(FsError::NotFound)) => assert_err!(p.b.get(d.ino), FsError::NotFound),
                (Err(FsError::NotEmpty), Ok(c)) => {
                    assert_eq!(p.b.lookup(d.ino, b"child").unwrap().ino, c.ino)
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        check_tree(&p.a);
    }
}

//! The namespace rules on the in-memory [`Mem`]: every refusal with its
//! error (and that it changes nothing), and every effect on links, times,
//! attributes and listing cookies. The backends' own storage of these
//! effects is tested on SQLite and etcd in `tests/meta_conformance.rs`.

use std::collections::{HashMap, HashSet};

use super::mem::Mem;
use crate::error::FsError;
use crate::meta::types::*;

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

fn mkfile(m: &mut Mem, parent: u64, name: &str) -> Inode {
    m.create(parent, name.as_bytes(), node(Kind::File)).unwrap()
}

fn mkdir(m: &mut Mem, parent: u64, name: &str) -> Inode {
    m.create(parent, name.as_bytes(), node(Kind::Dir)).unwrap()
}

fn nlink(m: &mut Mem, ino: u64) -> u32 {
    m.get(ino).unwrap().nlink
}

fn names(m: &Mem, dir: u64) -> Vec<Vec<u8>> {
    m.list(dir).into_iter().map(|e| e.0).collect()
}

/// name -> cookie of every entry of `dir`.
fn cookies(m: &Mem, dir: u64) -> HashMap<Vec<u8>, u64> {
    m.list(dir).into_iter().map(|e| (e.0, e.2)).collect()
}

/// `$e` fails with `$p` and leaves the tree as it was.
macro_rules! refused {
    ($m:ident, $e:expr, $p:pat) => {{
        let before = $m.clone();
        match $e {
            Err($p) => {}
            other => panic!(
                "{}: expected {}, got {:?}",
                stringify!($e),
                stringify!($p),
                other
            ),
        }
        assert!($m.same_tree(&before), "{} changed the tree", stringify!($e));
    }};
}

/// No cycle; each directory's nlink is 2 + its subdirectories and its
/// `..` is where it is listed; each other inode's nlink is its number of
/// names; every entry points at an inode.
fn check_tree(m: &mut Mem) {
    let mut names_of: HashMap<u64, u32> = HashMap::new();
    let mut seen = HashSet::new();
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        assert!(seen.insert(d), "directory {d} reached twice: a cycle");
        let entries = m.list(d);
        let mut subdirs = 0;
        for (name, ino, _) in entries {
            let i = m
                .get(ino)
                .unwrap_or_else(|e| panic!("entry {name:?} -> {ino}: {e}"));
            if i.kind == Kind::Dir {
                subdirs += 1;
                assert_eq!(m.parent_of(ino).unwrap(), d, "`..` of {ino}");
                stack.push(ino);
            } else {
                *names_of.entry(ino).or_default() += 1;
            }
        }
        assert_eq!(nlink(m, d), 2 + subdirs, "nlink of directory {d}");
    }
    for (ino, n) in names_of {
        assert_eq!(nlink(m, ino), n, "nlink of {ino}");
    }
}

// ---- create, lookup --------------------------------------------------------

#[test]
fn create_makes_the_node_and_stamps_its_directory() {
    let mut m = Mem::new();
    let mut n = node(Kind::File);
    n.mode = 0o100_4755; // kind bits are not stored
    let f = m.create(ROOT_INO, b"f", n).unwrap();
    assert_eq!(
        (f.kind, f.mode, f.nlink, f.size, f.rdev),
        (Kind::File, 0o4755, 1, 0, 0)
    );
    assert_eq!(
        (f.uid, f.gid, f.block_size, f.last_epoch),
        (7, 8, 1 << 20, 0)
    );
    assert!(f.atime == f.mtime && f.mtime == f.ctime && f.ctime == f.crtime);
    assert_eq!(m.get(f.ino).unwrap(), f);
    assert_eq!(m.lookup(ROOT_INO, b"f").unwrap(), f);
    let root = m.get(ROOT_INO).unwrap();
    assert_eq!((root.nlink, root.mtime, root.ctime), (2, f.ctime, f.ctime));

    let d = mkdir(&mut m, ROOT_INO, "d");
    assert_eq!((d.kind, d.nlink), (Kind::Dir, 2));
    assert_eq!(
        nlink(&mut m, ROOT_INO),
        3,
        "a subdirectory links its parent"
    );
    let mut fifo = node(Kind::Fifo);
    fifo.rdev = 9;
    fifo.xattrs = vec![(b"system.posix_acl_access".to_vec(), b"acl".to_vec())];
    let p = m.create(d.ino, b"pipe", fifo).unwrap();
    assert_eq!((p.kind, p.rdev), (Kind::Fifo, 9));
    assert_eq!(
        m.getxattr(p.ino, b"system.posix_acl_access").as_deref(),
        Some(&b"acl"[..]),
        "born with its attributes"
    );
    assert_eq!(nlink(&mut m, d.ino), 2, "files do not link their directory");
    assert_eq!(names(&m, ROOT_INO), [b"f".to_vec(), b"d".to_vec()]);
}

#[test]
fn create_refuses_taken_names_and_non_directories() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
    mkdir(&mut m, ROOT_INO, "d");
    refused!(
        m,
        m.create(ROOT_INO, b"f", node(Kind::File)),
        FsError::Exists
    );
    refused!(
        m,
        m.create(ROOT_INO, b"d", node(Kind::Dir)),
        FsError::Exists
    );
    refused!(
        m,
        m.create(ROOT_INO, b"f", node(Kind::Dir)),
        FsError::Exists
    );
    refused!(m, m.create(f.ino, b"x", node(Kind::File)), FsError::NotDir);
    refused!(
        m,
        m.create(999_999, b"x", node(Kind::File)),
        FsError::NotFound
    );
}

#[test]
fn lookup_refusals() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
    assert!(matches!(
        m.lookup(ROOT_INO, b"nope"),
        Err(FsError::NotFound)
    ));
    assert!(matches!(m.lookup(f.ino, b"x"), Err(FsError::NotDir)));
    assert!(matches!(m.lookup(999_999, b"x"), Err(FsError::NotFound)));
    assert!(matches!(m.get(999_999), Err(FsError::NotFound)));
}

// ---- link, unlink, rmdir ---------------------------------------------------

#[test]
fn nlink_accounting() {
    let mut m = Mem::new();
    let m = &mut m;
    let a = mkdir(m, ROOT_INO, "a");
    let b = mkdir(m, a.ino, "b");
    assert_eq!(
        (nlink(m, ROOT_INO), nlink(m, a.ino), nlink(m, b.ino)),
        (3, 3, 2)
    );
    mkfile(m, a.ino, "f");
    assert_eq!(nlink(m, a.ino), 3, "files do not count");
    let c = mkdir(m, ROOT_INO, "c");
    assert_eq!(nlink(m, ROOT_INO), 4);
    m.rename((a.ino, b"b"), (c.ino, b"b"), false, false)
        .unwrap();
    assert_eq!((nlink(m, a.ino), nlink(m, c.ino)), (2, 3));
    m.rename((ROOT_INO, b"a"), (c.ino, b"a"), false, false)
        .unwrap();
    assert_eq!((nlink(m, ROOT_INO), nlink(m, c.ino)), (3, 4));
    m.rmdir(c.ino, b"b").unwrap();
    assert_eq!(nlink(m, c.ino), 3);
    check_tree(m);
}

#[test]
fn link_adds_a_name_with_a_place_of_its_own() {
    let mut m = Mem::new();
    let d = mkdir(&mut m, ROOT_INO, "d");
    let f = mkfile(&mut m, ROOT_INO, "f");
    let l = m.link(f.ino, d.ino, b"l").unwrap();
    assert_eq!((l.ino, l.nlink), (f.ino, 2));
    assert!(l.ctime > f.ctime, "ctime stamped");
    assert_eq!(m.get(f.ino).unwrap(), l);
    assert_eq!(m.get(d.ino).unwrap().mtime, l.ctime, "directory stamped");
    assert_eq!(
        nlink(&mut m, d.ino),
        2,
        "a link to a file is no subdirectory"
    );
    assert_eq!(m.lookup(d.ino, b"l").unwrap().ino, f.ino);
    assert_ne!(
        cookies(&m, d.ino)[&b"l"[..]],
        cookies(&m, ROOT_INO)[&b"f"[..]]
    );

    refused!(m, m.link(d.ino, ROOT_INO, b"dl"), FsError::NotPermitted(_));
    refused!(m, m.link(f.ino, ROOT_INO, b"d"), FsError::Exists);
    refused!(m, m.link(999_999, ROOT_INO, b"x"), FsError::NotFound);
    refused!(m, m.link(f.ino, f.ino, b"x"), FsError::NotDir);
    refused!(m, m.link(f.ino, 999_999, b"x"), FsError::NotFound);
}

#[test]
fn unlink_keeps_the_inode_until_it_is_deleted() {
    let mut m = Mem::new();
    let d = mkdir(&mut m, ROOT_INO, "d");
    let f = mkfile(&mut m, ROOT_INO, "f");
    m.link(f.ino, d.ino, b"l").unwrap();
    let one = m.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(one.nlink, 1);
    assert_eq!(m.get(ROOT_INO).unwrap().mtime, one.ctime);
    assert!(matches!(m.lookup(ROOT_INO, b"f"), Err(FsError::NotFound)));
    let last = m.unlink(d.ino, b"l").unwrap();
    assert_eq!((last.ino, last.nlink), (f.ino, 0));
    assert!(last.ctime > one.ctime);
    assert_eq!(m.get(f.ino).unwrap(), last, "kept until delete_inode");

    refused!(m, m.unlink(ROOT_INO, b"f"), FsError::NotFound);
    refused!(m, m.unlink(ROOT_INO, b"d"), FsError::IsDir);
    refused!(m, m.unlink(999_999, b"x"), FsError::NotFound);
    let g = mkfile(&mut m, ROOT_INO, "g");
    refused!(m, m.unlink(g.ino, b"x"), FsError::NotDir);
}

#[test]
fn rmdir_takes_only_empty_directories_with_their_attributes() {
    let mut m = Mem::new();
    let d = mkdir(&mut m, ROOT_INO, "d");
    let g = mkfile(&mut m, d.ino, "g");
    refused!(m, m.rmdir(ROOT_INO, b"d"), FsError::NotEmpty);
    refused!(m, m.rmdir(d.ino, b"g"), FsError::NotDir);
    refused!(m, m.rmdir(ROOT_INO, b"nope"), FsError::NotFound);
    refused!(m, m.rmdir(g.ino, b"x"), FsError::NotDir);
    refused!(m, m.rmdir(999_999, b"x"), FsError::NotFound);
    m.unlink(d.ino, b"g").unwrap();
    m.setxattr(d.ino, b"user.k", b"v", (false, false)).unwrap();
    assert_eq!(nlink(&mut m, ROOT_INO), 3);
    assert_eq!(m.rmdir(ROOT_INO, b"d").unwrap(), d.ino);
    assert!(matches!(m.get(d.ino), Err(FsError::NotFound)));
    assert_eq!(m.getxattr(d.ino, b"user.k"), None);
    assert_eq!(nlink(&mut m, ROOT_INO), 2);
    assert!(names(&m, ROOT_INO).is_empty());
}

// ---- rename ----------------------------------------------------------------

#[test]
fn rename_moves_the_entry_with_its_place() {
    let mut m = Mem::new();
    let a = mkfile(&mut m, ROOT_INO, "a");
    let place = cookies(&m, ROOT_INO)[&b"a"[..]];
    assert_eq!(
        m.rename((ROOT_INO, b"a"), (ROOT_INO, b"b"), false, false)
            .unwrap(),
        None
    );
    assert!(matches!(m.lookup(ROOT_INO, b"a"), Err(FsError::NotFound)));
    assert_eq!(m.lookup(ROOT_INO, b"b").unwrap().ino, a.ino);
    assert_eq!(cookies(&m, ROOT_INO)[&b"b"[..]], place, "same place");
    let b = m.get(a.ino).unwrap();
    assert!(b.ctime > a.ctime, "the renamed inode's ctime is stamped");
    assert_eq!(m.get(ROOT_INO).unwrap().mtime, b.ctime);

    let d = mkdir(&mut m, ROOT_INO, "d");
    m.rename((ROOT_INO, b"b"), (d.ino, b"c"), false, false)
        .unwrap();
    assert_eq!(names(&m, ROOT_INO), vec![b"d".to_vec()]);
    assert_eq!(cookies(&m, d.ino)[&b"c"[..]], place, "moves along");
    let (root, dir) = (m.get(ROOT_INO).unwrap(), m.get(d.ino).unwrap());
    assert_eq!(root.mtime, dir.mtime, "both directories stamped");
    assert_eq!(root.ctime, m.get(a.ino).unwrap().ctime);
    check_tree(&mut m);
}

#[test]
fn rename_onto_the_same_inode_does_nothing() {
    let mut m = Mem::new();
    let d = mkdir(&mut m, ROOT_INO, "d");
    let a = mkfile(&mut m, d.ino, "c");
    m.link(a.ino, ROOT_INO, b"hard").unwrap();
    let before = m.clone();
    assert_eq!(
        m.rename((d.ino, b"c"), (d.ino, b"c"), false, false)
            .unwrap(),
        None
    );
    assert_eq!(
        m.rename((d.ino, b"c"), (ROOT_INO, b"hard"), false, false)
            .unwrap(),
        None
    );
    assert_eq!(
        m.rename((d.ino, b"c"), (ROOT_INO, b"hard"), true, true)
            .unwrap(),
        None,
        "whatever the flags"
    );
    assert!(m.same_tree(&before));
}

#[test]
fn rename_refusals_of_missing_names_and_non_directories() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
    let r = |m: &mut Mem, from: (u64, &[u8]), to: (u64, &[u8])| m.rename(from, to, false, false);
    refused!(
        m,
        r(&mut m, (ROOT_INO, b"nope"), (ROOT_INO, b"x")),
        FsError::NotFound
    );
    refused!(
        m,
        r(&mut m, (ROOT_INO, b"f"), (f.ino, b"x")),
        FsError::NotDir
    );
    refused!(
        m,
        r(&mut m, (f.ino, b"x"), (ROOT_INO, b"y")),
        FsError::NotDir
    );
    refused!(
        m,
        r(&mut m, (999_999, b"x"), (ROOT_INO, b"y")),
        FsError::NotFound
    );
    refused!(
        m,
        r(&mut m, (ROOT_INO, b"f"), (999_999, b"y")),
        FsError::NotFound
    );
    // The target directory is checked before the source name.
    refused!(
        m,
        r(&mut m, (ROOT_INO, b"nope"), (f.ino, b"y")),
        FsError::NotDir
    );
}

#[test]
fn rename_over_a_file_unlinks_it_and_drops_its_place() {
    let mut m = Mem::new();
    let a = mkfile(&mut m, ROOT_INO, "a");
    let b = mkfile(&mut m, ROOT_INO, "b");
    let c0 = cookies(&m, ROOT_INO);
    let gone = m
        .rename((ROOT_INO, b"a"), (ROOT_INO, b"b"), false, false)
        .unwrap()
        .unwrap();
    assert_eq!((gone.ino, gone.nlink), (b.ino, 0));
    assert!(gone.ctime > b.ctime);
    assert_eq!(m.get(b.ino).unwrap(), gone, "kept until delete_inode");
    assert_eq!(m.lookup(ROOT_INO, b"b").unwrap().ino, a.ino);
    assert_eq!(
        cookies(&m, ROOT_INO),
        HashMap::from([(b"b".to_vec(), c0[&b"a"[..]])]),
        "the replaced entry's place is gone"
    );
    // A replaced file with another name keeps it.
    let c = mkfile(&mut m, ROOT_INO, "c");
    m.link(c.ino, ROOT_INO, b"c2").unwrap();
    let gone = m
        .rename((ROOT_INO, b"b"), (ROOT_INO, b"c"), false, false)
        .unwrap()
        .unwrap();
    assert_eq!((gone.ino, gone.nlink), (c.ino, 1));
    assert_eq!(m.path_of(c.ino), "/c2");
    refused!(
        m,
        m.rename((ROOT_INO, b"c"), (ROOT_INO, b"c2"), true, false),
        FsError::Exists
    );
    check_tree(&mut m);
}

#[test]
fn rename_of_directories_and_its_refusals() {
    let mut m = Mem::new();
    let x = mkdir(&mut m, ROOT_INO, "x");
    let y = mkdir(&mut m, x.ino, "y");
    let e = mkdir(&mut m, ROOT_INO, "empty");
    let full = mkdir(&mut m, ROOT_INO, "full");
    mkfile(&mut m, full.ino, "f");
    let f = mkfile(&mut m, ROOT_INO, "file");
    let r = |m: &mut Mem, name: &[u8], to: (u64, &[u8]), noreplace| {
        m.rename((ROOT_INO, name), to, noreplace, false)
    };
    refused!(
        m,
        r(&mut m, b"x", (y.ino, b"z"), false),
        FsError::Invalid(_)
    );
    refused!(
        m,
        r(&mut m, b"x", (x.ino, b"z"), false),
        FsError::Invalid(_)
    );
    refused!(
        m,
        r(&mut m, b"x", (ROOT_INO, b"full"), false),
        FsError::NotEmpty
    );
    refused!(
        m,
        r(&mut m, b"x", (ROOT_INO, b"empty"), true),
        FsError::Exists
    );
    refused!(
        m,
        r(&mut m, b"x", (ROOT_INO, b"file"), false),
        FsError::NotDir
    );
    refused!(
        m,
        r(&mut m, b"file", (ROOT_INO, b"empty"), false),
        FsError::IsDir
    );
    // A moving directory is checked against its own subtree first.
    refused!(m, r(&mut m, b"x", (y.ino, b"z"), true), FsError::Invalid(_));

    // Over an empty directory: it is gone with its attributes, and the
    // parent lost a subdirectory.
    m.setxattr(e.ino, b"user.a", b"1", (false, false)).unwrap();
    assert_eq!(nlink(&mut m, ROOT_INO), 5);
    assert_eq!(r(&mut m, b"x", (ROOT_INO, b"empty"), false).unwrap(), None);
    assert!(matches!(m.get(e.ino), Err(FsError::NotFound)));
    assert_eq!(m.getxattr(e.ino, b"user.a"), None);
    assert_eq!(m.lookup(ROOT_INO, b"empty").unwrap().ino, x.ino);
    assert_eq!(nlink(&mut m, ROOT_INO), 4);
    assert_eq!(m.parent_of(y.ino).unwrap(), x.ino);
    // Moving a directory down and back up: `..` and links follow.
    m.rename((ROOT_INO, b"empty"), (full.ino, b"x"), false, false)
        .unwrap();
    assert_eq!(m.parent_of(x.ino).unwrap(), full.ino);
    assert_eq!((nlink(&mut m, ROOT_INO), nlink(&mut m, full.ino)), (3, 3));
    assert_eq!(m.path_of(y.ino), "/full/x/y");
    m.rename((full.ino, b"x"), (ROOT_INO, b"x"), false, false)
        .unwrap();
    assert_eq!(m.parent_of(x.ino).unwrap(), ROOT_INO);
    assert_eq!(m.lookup(ROOT_INO, b"file").unwrap().ino, f.ino);
    check_tree(&mut m);
}

#[test]
fn rename_exchange_swaps_entries_and_places() {
    let mut m = Mem::new();
    let a = mkdir(&mut m, ROOT_INO, "a");
    let b = mkdir(&mut m, ROOT_INO, "b");
    let f = mkfile(&mut m, a.ino, "f");
    let sub = mkdir(&mut m, b.ino, "sub");
    mkfile(&mut m, sub.ino, "inside");
    let (ca, cb) = (cookies(&m, a.ino), cookies(&m, b.ino));
    assert_eq!((nlink(&mut m, a.ino), nlink(&mut m, b.ino)), (2, 3));
    assert_eq!(
        m.rename((a.ino, b"f"), (b.ino, b"sub"), false, true)
            .unwrap(),
        None
    );
    assert_eq!(m.lookup(a.ino, b"f").unwrap().ino, sub.ino);
    assert_eq!(m.lookup(b.ino, b"sub").unwrap().ino, f.ino);
    assert_eq!(
        cookies(&m, a.ino)[&b"f"[..]],
        cb[&b"sub"[..]],
        "places move"
    );
    assert_eq!(cookies(&m, b.ino)[&b"sub"[..]], ca[&b"f"[..]]);
    assert_eq!(
        (nlink(&mut m, a.ino), nlink(&mut m, b.ino)),
        (3, 2),
        "the subdirectory moved"
    );
    assert_eq!(m.parent_of(sub.ino).unwrap(), a.ino);
    assert_eq!(m.path_of(f.ino), "/b/sub");
    let (fi, si) = (m.get(f.ino).unwrap(), m.get(sub.ino).unwrap());
    assert!(fi.ctime > f.ctime && fi.ctime == si.ctime, "both stamped");
    assert_eq!(si.nlink, 2, "a non-empty directory may be exchanged");
    // Within one directory.
    let g = mkfile(&mut m, ROOT_INO, "g");
    let c0 = cookies(&m, ROOT_INO);
    m.rename((ROOT_INO, b"a"), (ROOT_INO, b"g"), false, true)
        .unwrap();
    assert_eq!(m.lookup(ROOT_INO, b"a").unwrap().ino, g.ino);
    assert_eq!(m.lookup(ROOT_INO, b"g").unwrap().ino, a.ino);
    let c1 = cookies(&m, ROOT_INO);
    assert_eq!(
        (c1[&b"a"[..]], c1[&b"g"[..]]),
        (c0[&b"g"[..]], c0[&b"a"[..]])
    );
    assert_eq!(nlink(&mut m, ROOT_INO), 4);
    refused!(
        m,
        m.rename((ROOT_INO, b"a"), (ROOT_INO, b"nope"), false, true),
        FsError::NotFound
    );
    refused!(
        m,
        m.rename((ROOT_INO, b"b"), (b.ino, b"sub"), false, true),
        FsError::Invalid(_)
    );
    check_tree(&mut m);
}

/// Random moves, exchanges, links and removals of files among four
/// directories (one below another) keep every count right.
#[test]
fn random_steps_keep_the_tree_consistent() {
    let mut m = Mem::new();
    let a = mkdir(&mut m, ROOT_INO, "A").ino;
    let b = mkdir(&mut m, ROOT_INO, "B").ino;
    let sub = mkdir(&mut m, a, "sub").ino;
    let dirs = [a, b, ROOT_INO, sub];
    for k in 0..6 {
        mkfile(&mut m, a, &format!("f{k}"));
    }
    let mut r = 0x9e37_79b9_7f4a_7c15u64;
    let mut below = |n: u64| {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r % n
    };
    for _ in 0..2000 {
        let from = dirs[below(4) as usize];
        let to = dirs[below(4) as usize];
        let name = format!("f{}", below(6));
        let other = format!("f{}", below(6));
        let (name, other) = (name.as_bytes(), other.as_bytes());
        let res = match below(6) {
            0 | 1 => m.rename((from, name), (to, other), false, false).map(drop),
            2 => m.rename((from, name), (to, other), false, true).map(drop),
            3 => match m.lookup(from, name) {
                Ok(i) => m.link(i.ino, to, other).map(drop),
                Err(e) => Err(e),
            },
            4 => m.unlink(from, name).map(drop),
            _ => m.create(to, name, node(Kind::File)).map(drop),
        };
        match res {
            Ok(()) | Err(FsError::NotFound | FsError::Exists) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    check_tree(&mut m);
}

// ---- attributes ------------------------------------------------------------

#[test]
fn set_attrs_changes_what_is_given_and_stamps_ctime() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
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
    assert!(j.ctime > f.ctime, "ctime defaults to now");
    assert_eq!((j.size, j.nlink, j.crtime), (f.size, f.nlink, f.crtime));
    assert_eq!(m.get(f.ino).unwrap(), j);
    refused!(
        m,
        m.set_attrs(999_999, &AttrChange::default()),
        FsError::NotFound
    );
}

#[test]
fn xattr_create_replace_and_remove() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
    m.setxattr(f.ino, b"user.b", b"1", (true, false)).unwrap();
    let stamped = m.get(f.ino).unwrap().ctime;
    assert!(stamped > f.ctime, "a change stamps ctime");
    refused!(
        m,
        m.setxattr(f.ino, b"user.b", b"2", (true, false)),
        FsError::Exists
    );
    refused!(
        m,
        m.setxattr(f.ino, b"user.c", b"2", (false, true)),
        FsError::NoXattr
    );
    refused!(
        m,
        m.setxattr(f.ino, b"user.c", b"2", (true, true)),
        FsError::NoXattr
    );
    m.setxattr(f.ino, b"user.b", b"3", (false, true)).unwrap();
    assert_eq!(m.getxattr(f.ino, b"user.b").as_deref(), Some(&b"3"[..]));
    m.setxattr(f.ino, b"user.a", b"", (false, false)).unwrap();
    m.setxattr(f.ino, b"user.a", b"overwritten", (false, false))
        .unwrap();
    assert_eq!(
        m.getxattr(f.ino, b"user.a").as_deref(),
        Some(&b"overwritten"[..])
    );
    let before = m.get(f.ino).unwrap().ctime;
    m.removexattr(f.ino, b"user.a").unwrap();
    assert!(m.get(f.ino).unwrap().ctime > before);
    refused!(m, m.removexattr(f.ino, b"user.a"), FsError::NoXattr);
    refused!(
        m,
        m.setxattr(999_999, b"user.a", b"", (false, false)),
        FsError::NotFound
    );
    assert_eq!(m.xattr_names(f.ino), [b"user.b".to_vec()]);
}

#[test]
fn xattr_update_decides_on_current_values_and_commits_attributes() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
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
    assert!(i.ctime > f.ctime);
    assert_eq!(m.get(f.ino).unwrap(), i);
    // A refusal and an empty edit change nothing, not even ctime.
    refused!(
        m,
        m.update_xattrs(f.ino, &[b"user.a"], XattrLimits::NONE, &mut |_, _| {
            Err(FsError::Access)
        }),
        FsError::Access
    );
    let before = m.clone();
    let same = m
        .update_xattrs(
            f.ino,
            &[b"user.a", b"user.z"],
            XattrLimits::NONE,
            &mut |_, cur| {
                assert_eq!(cur, &[Some(b"1".to_vec()), None][..]);
                Ok(XattrEdit::default())
            },
        )
        .unwrap();
    assert_eq!(same, i);
    assert!(m.same_tree(&before));
}

#[test]
fn xattr_limits_refuse_growth_beyond_them_and_allow_shrinking() {
    let mut m = Mem::new();
    let f = mkfile(&mut m, ROOT_INO, "f");
    m.setxattr(f.ino, b"user.a", b"1", (false, false)).unwrap();
    let put = |m: &mut Mem, name: &[u8], len: Option<usize>, lim: XattrLimits| {
        m.update_xattrs(f.ino, &[], lim, &mut |_, _| {
            Ok(XattrEdit {
                set: vec![(name.to_vec(), len.map(|l| vec![b'v'; l]))],
                attrs: None,
            })
        })
    };
    // "user.a" + 1 byte is 7 bytes, its name "user.a\0" 7.
    let lim = XattrLimits {
        total: 100,
        names: 1000,
    };
    put(&mut m, b"user.b", Some(60), lim).unwrap();
    refused!(
        m,
        put(&mut m, b"user.c", Some(30), lim),
        FsError::XattrSpace {
            used: 109,
            limit: 100,
            ..
        }
    );
    put(&mut m, b"user.b", Some(87), lim).unwrap();
    let names = XattrLimits {
        total: u64::MAX,
        names: 20,
    };
    refused!(
        m,
        put(&mut m, b"user.cc", Some(0), names),
        FsError::XattrSpace { .. }
    );
    // Shrinking an inode that is over the limits is allowed, by a smaller
    // value or by a removal.
    let tight = XattrLimits {
        total: 10,
        names: 10,
    };
    put(&mut m, b"user.b", Some(3), tight).unwrap();
    put(&mut m, b"user.a", None, tight).unwrap();
    assert_eq!(m.xattr_names(f.ino), [b"user.b".to_vec()]);
}

// ---- walks -----------------------------------------------------------------

#[test]
fn parent_and_path_follow_first_names() {
    let mut m = Mem::new();
    assert_eq!(m.path_of(ROOT_INO), "/");
    assert_eq!(m.parent_of(ROOT_INO).unwrap(), ROOT_INO);
    let a = mkdir(&mut m, ROOT_INO, "a");
    let b = mkdir(&mut m, a.ino, "b");
    let f = mkfile(&mut m, b.ino, "f");
    assert_eq!(m.path_of(f.ino), "/a/b/f");
    assert_eq!(m.parent_of(b.ino).unwrap(), a.ino);
    m.rename((a.ino, b"b"), (ROOT_INO, b"c"), false, false)
        .unwrap();
    assert_eq!(m.path_of(f.ino), "/c/f");
    assert_eq!(m.parent_of(b.ino).unwrap(), ROOT_INO);
    m.unlink(b.ino, b"f").unwrap();
    assert_eq!(m.path_of(f.ino), format!("<ino {}>", f.ino));
    assert_eq!(m.path_of(999_999), "<ino 999999>");
    assert_eq!(m.parent_of(999_999).unwrap(), ROOT_INO, "no name: the root");
}

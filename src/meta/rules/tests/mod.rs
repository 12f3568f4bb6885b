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

mod entries;
mod rename;
mod xattrs;

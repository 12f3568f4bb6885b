//! The rule of rename: moves, replacements, RENAME_NOREPLACE and
//! RENAME_EXCHANGE, and what links, times and listing places do.

use super::*;

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

//! The rules of one entry: create, lookup, link, unlink, rmdir, setattr,
//! and the walks up the tree.

use super::*;

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

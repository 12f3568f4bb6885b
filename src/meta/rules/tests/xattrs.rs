//! The rules of extended attributes: XATTR_CREATE / XATTR_REPLACE, the
//! one read-modify-write step, and the limits.

use super::*;

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

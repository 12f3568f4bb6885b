//! The rules of extended attributes: the one read-modify-write step every
//! change goes through, and what XATTR_CREATE / XATTR_REPLACE and removal
//! refuse. The limits themselves are [`XattrLimits::check`].

use super::{Tx, inode};
use crate::error::{FsError, FsResult};
use crate::meta::types::{DecideXattrs, Inode, XattrEdit, XattrLimits};

/// Reads the inode and the values of `names`, lets `decide` say what
/// changes, and applies that with ctime = `now` (or the attribute change
/// the edit carries) unless it is empty. A change that sets a value is
/// checked against `limits` first; every refusal comes before a write.
pub fn update_xattrs(
    tx: &mut impl Tx,
    ino: u64,
    names: &[&[u8]],
    limits: XattrLimits,
    decide: &mut DecideXattrs<'_>,
    now: i64,
) -> FsResult<Inode> {
    let mut i = inode(tx, ino)?;
    let current = names
        .iter()
        .map(|n| tx.xattr(ino, n))
        .collect::<FsResult<Vec<_>>>()?;
    let edit = decide(&i, &current)?;
    if edit.is_empty() {
        return Ok(i);
    }
    if edit.set.iter().any(|(_, v)| v.is_some()) {
        limits.check(ino, &tx.xattr_sizes(ino)?, &edit.set)?;
    }
    for (name, value) in &edit.set {
        match value {
            Some(v) => tx.put_xattr(ino, name, v)?,
            None => tx.remove_xattr(ino, name)?,
        }
    }
    match &edit.attrs {
        Some(ch) => ch.apply(&mut i, now),
        None => i.ctime = now,
    }
    tx.put_attrs(&i)?;
    Ok(i)
}

/// setxattr of `name` whose value now is `current`: `EEXIST` under
/// XATTR_CREATE if it has one, `ENODATA` under XATTR_REPLACE if not.
pub fn set_one(
    current: &Option<Vec<u8>>,
    name: &[u8],
    value: &[u8],
    create: bool,
    replace: bool,
) -> FsResult<XattrEdit> {
    match (current, create, replace) {
        (Some(_), true, _) => Err(FsError::Exists),
        (None, _, true) => Err(FsError::NoXattr),
        _ => Ok(XattrEdit {
            set: vec![(name.to_vec(), Some(value.to_vec()))],
            attrs: None,
        }),
    }
}

/// removexattr of `name` whose value now is `current`: `ENODATA` if it
/// has none.
pub fn remove_one(current: &Option<Vec<u8>>, name: &[u8]) -> FsResult<XattrEdit> {
    if current.is_none() {
        return Err(FsError::NoXattr);
    }
    Ok(XattrEdit {
        set: vec![(name.to_vec(), None)],
        attrs: None,
    })
}

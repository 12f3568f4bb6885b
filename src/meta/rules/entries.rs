//! The rules of one entry at a time: lookup, create, link, unlink,
//! rmdir, setattr, and the walks up the tree (`..`, paths).

use super::{Entry, Tx, inode};
use crate::error::{FsError, FsResult};
use crate::meta::types::{AttrChange, Inode, Kind, NewNode, ROOT_INO};

/// The directory `ino`: `NotFound` if it is not there, `NotDir` if it is
/// something else.
pub fn require_dir(tx: &mut impl Tx, ino: u64) -> FsResult<Inode> {
    let i = inode(tx, ino)?;
    if i.kind != Kind::Dir {
        return Err(FsError::NotDir);
    }
    Ok(i)
}

pub fn lookup(tx: &mut impl Tx, parent: u64, name: &[u8]) -> FsResult<Inode> {
    require_dir(tx, parent)?;
    let e = tx.entry(parent, name)?.ok_or(FsError::NotFound)?;
    inode(tx, e.ino)
}

/// `..` of a directory: where its name is; the root, and a directory
/// whose name is gone, answer the root.
pub fn parent_of(tx: &mut impl Tx, dir: u64) -> FsResult<u64> {
    if dir == ROOT_INO {
        return Ok(ROOT_INO);
    }
    Ok(tx.first_parent(dir)?.unwrap_or(ROOT_INO))
}

/// A new node `parent/name` with inode number `ino`, listed at `cookie`
/// (both given before the step, so a retried step keeps them). A
/// directory starts with two links and adds one to its parent; the mode
/// keeps permission bits only.
pub fn create(
    tx: &mut impl Tx,
    parent: u64,
    name: &[u8],
    n: &NewNode<'_>,
    (ino, cookie): (u64, u64),
    now: i64,
) -> FsResult<Inode> {
    require_dir(tx, parent)?;
    if tx.entry(parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    let is_dir = n.kind == Kind::Dir;
    let inode = Inode {
        ino,
        kind: n.kind,
        mode: n.mode & 0o7777,
        uid: n.uid,
        gid: n.gid,
        nlink: if is_dir { 2 } else { 1 },
        // A symlink's size is its target's length (lstat, `ls -l`).
        size: n.target.map_or(0, |t| t.len() as u64),
        rdev: n.rdev,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        block_size: n.block_size,
        last_epoch: 0,
    };
    tx.insert_inode(&inode, n.target)?;
    tx.put_entry(parent, name, Entry { ino, cookie }, n.kind, None)?;
    for (k, v) in &n.xattrs {
        tx.put_xattr(ino, k, v)?;
    }
    tx.touch_dir(parent, is_dir as i64, now)?;
    Ok(inode)
}

/// Another name `parent/name` for `ino`, listed at `cookie`: never for a
/// directory (`EPERM`), never over an existing name.
pub fn link(
    tx: &mut impl Tx,
    ino: u64,
    (parent, name): (u64, &[u8]),
    cookie: u64,
    now: i64,
) -> FsResult<Inode> {
    require_dir(tx, parent)?;
    let i = inode(tx, ino)?;
    if i.kind == Kind::Dir {
        return Err(FsError::NotPermitted("hard links to directories"));
    }
    if tx.entry(parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    tx.put_entry(parent, name, Entry { ino, cookie }, i.kind, None)?;
    tx.add_nlink(ino, 1, now)?;
    tx.touch_dir(parent, 0, now)?;
    inode(tx, ino)
}

/// Removes a name that is not a directory's (`EISDIR`); the inode stays,
/// with one link fewer, until it is deleted.
pub fn unlink(tx: &mut impl Tx, parent: u64, name: &[u8], now: i64) -> FsResult<Inode> {
    require_dir(tx, parent)?;
    let e = tx.entry(parent, name)?.ok_or(FsError::NotFound)?;
    let i = inode(tx, e.ino)?;
    if i.kind == Kind::Dir {
        return Err(FsError::IsDir);
    }
    tx.remove_entry(parent, name, e)?;
    tx.add_nlink(e.ino, -1, now)?;
    tx.touch_dir(parent, 0, now)?;
    inode(tx, e.ino)
}

/// Removes an empty directory (`ENOTDIR` for anything else, `ENOTEMPTY`)
/// with its attributes; its parent loses a link.
pub fn rmdir(tx: &mut impl Tx, parent: u64, name: &[u8], now: i64) -> FsResult<u64> {
    require_dir(tx, parent)?;
    let e = tx.entry(parent, name)?.ok_or(FsError::NotFound)?;
    if inode(tx, e.ino)?.kind != Kind::Dir {
        return Err(FsError::NotDir);
    }
    if !tx.is_empty_dir(e.ino)? {
        return Err(FsError::NotEmpty);
    }
    tx.remove_entry(parent, name, e)?;
    tx.drop_inode(e.ino)?;
    tx.touch_dir(parent, -1, now)?;
    Ok(e.ino)
}

/// Applies `ch`; ctime is the one given, else `now`.
pub fn set_attrs(tx: &mut impl Tx, ino: u64, ch: &AttrChange, now: i64) -> FsResult<Inode> {
    let mut i = inode(tx, ino)?;
    ch.apply(&mut i, now);
    tx.put_attrs(&i)?;
    Ok(i)
}

/// Path of an inode through its first names; `<ino N>` where the chain
/// breaks, for the inode N where it broke.
pub fn path_of(tx: &mut impl Tx, mut ino: u64) -> FsResult<String> {
    let mut parts = Vec::new();
    while ino != ROOT_INO && parts.len() < 256 {
        match tx.first_name(ino)? {
            Some((p, n)) => {
                parts.push(String::from_utf8_lossy(&n).into_owned());
                ino = p;
            }
            None => return Ok(format!("<ino {ino}>")),
        }
    }
    parts.reverse();
    Ok(format!("/{}", parts.join("/")))
}

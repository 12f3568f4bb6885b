//! The namespace steps, each the body of one [`super::stm::run`] attempt.
//! They follow the SQLite backend statement by statement, so both give the
//! same answers and the same refusals.

use super::records::*;
use super::stm::Stm;
use crate::error::{FsError, FsResult};
use crate::meta::types::*;

/// More ancestors than this means a cycle in the stored tree.
const MAX_DEPTH: usize = 4096;

/// Ids a step was given before it started (so a retried attempt keeps
/// them): the new inode's number and its entry's cookie.
pub(super) struct Ids {
    pub ino: u64,
    pub cookie: u64,
}

pub(super) fn create(
    s: &mut Stm<'_>,
    parent: u64,
    name: &[u8],
    n: &NewNode<'_>,
    ids: &Ids,
    now: i64,
) -> FsResult<Inode> {
    let ino = ids.ino;
    s.require_dir(parent)?;
    if s.lookup_in(parent, name)?.is_some() {
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
        size: 0,
        rdev: n.rdev,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        block_size: n.block_size,
        last_epoch: 0,
    };
    s.put_inode(&InodeRec {
        inode: inode.clone(),
        target: n.target.map(hex),
    })?;
    let d = Dentry {
        ino,
        kind: n.kind,
        cookie: ids.cookie,
    };
    s.set_entry(parent, name, d, None)?;
    for (k, v) in &n.xattrs {
        s.put(&xattr_key(ino, k), v.clone());
    }
    s.touch_dir(parent, is_dir as i64, now)?;
    Ok(inode)
}

pub(super) fn link(
    s: &mut Stm<'_>,
    ino: u64,
    (parent, name): (u64, &[u8]),
    cookie: u64,
    now: i64,
) -> FsResult<Inode> {
    s.require_dir(parent)?;
    let mut r = s.inode(ino)?;
    if r.inode.kind == Kind::Dir {
        return Err(FsError::NotPermitted("hard links to directories"));
    }
    if s.lookup_in(parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    let kind = r.inode.kind;
    s.set_entry(parent, name, Dentry { ino, kind, cookie }, None)?;
    r.inode.nlink += 1;
    r.inode.ctime = now;
    s.put_inode(&r)?;
    s.touch_dir(parent, 0, now)?;
    Ok(r.inode)
}

pub(super) fn unlink(s: &mut Stm<'_>, parent: u64, name: &[u8], now: i64) -> FsResult<Inode> {
    s.require_dir(parent)?;
    let d = s.lookup_in(parent, name)?.ok_or(FsError::NotFound)?;
    let mut r = s.inode(d.ino)?;
    if r.inode.kind == Kind::Dir {
        return Err(FsError::IsDir);
    }
    s.remove_entry(parent, name, d);
    r.inode.nlink = r.inode.nlink.saturating_sub(1);
    r.inode.ctime = now;
    s.put_inode(&r)?;
    s.touch_dir(parent, 0, now)?;
    Ok(r.inode)
}

/// Deletes a directory's inode and its xattrs (its entry is the caller's).
fn drop_dir(s: &mut Stm<'_>, dir: u64) {
    s.delete(&inode_key(dir));
    let x = xattrs_of(dir);
    s.delete_range(&x, &super::stm::prefix_end(&x));
}

pub(super) fn rmdir(s: &mut Stm<'_>, parent: u64, name: &[u8], now: i64) -> FsResult<u64> {
    s.require_dir(parent)?;
    let d = s.lookup_in(parent, name)?.ok_or(FsError::NotFound)?;
    let r = s.inode(d.ino)?;
    if r.inode.kind != Kind::Dir {
        return Err(FsError::NotDir);
    }
    // Reading the directory's inode (above) makes any concurrent entry
    // change in it a conflict, so emptiness holds at the commit.
    if !s.is_empty_dir(d.ino)? {
        return Err(FsError::NotEmpty);
    }
    s.remove_entry(parent, name, d);
    drop_dir(s, d.ino);
    s.touch_dir(parent, -1, now)?;
    Ok(d.ino)
}

/// Whether `dir` is `ancestor` or below it. Each step reads the `p/` names
/// of a directory on the path, so a concurrent move of any of them (which
/// adds a name there) conflicts with this attempt.
fn is_within(s: &mut Stm<'_>, mut dir: u64, ancestor: u64) -> FsResult<bool> {
    for _ in 0..MAX_DEPTH {
        if dir == ancestor {
            return Ok(true);
        }
        if dir == ROOT_INO {
            return Ok(false);
        }
        dir = s.first_name(dir)?.map_or(ROOT_INO, |(p, _)| p);
    }
    Err(FsError::Meta(format!(
        "directory {dir} is more than {MAX_DEPTH} levels deep: a cycle?"
    )))
}

fn bump_ctime(s: &mut Stm<'_>, ino: u64, now: i64) -> FsResult<()> {
    s.update_inode(ino, |i| i.ctime = now)
}

pub(super) struct Rename<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub newparent: u64,
    pub newname: &'a [u8],
    pub noreplace: bool,
    pub exchange: bool,
}

pub(super) fn rename(s: &mut Stm<'_>, r: &Rename<'_>, now: i64) -> FsResult<Option<Inode>> {
    let (parent, name, newparent, newname) = (r.parent, r.name, r.newparent, r.newname);
    s.require_dir(parent)?;
    s.require_dir(newparent)?;
    let src = s.lookup_in(parent, name)?.ok_or(FsError::NotFound)?;
    let src_i = s.inode(src.ino)?.inode;
    let dst = s.lookup_in(newparent, newname)?;
    if dst.map(|d| d.ino) == Some(src.ino) {
        return Ok(None);
    }
    let src_dir = src_i.kind == Kind::Dir;
    if src_dir && is_within(s, newparent, src.ino)? {
        return Err(FsError::Invalid(
            "cannot move a directory into itself".into(),
        ));
    }
    // Cookies move with their inodes, so that a listing meets each renamed
    // inode once in a directory, at its old place.
    let src_d = Dentry {
        kind: src_i.kind,
        ..src
    };
    if r.exchange {
        let dst = dst.ok_or(FsError::NotFound)?;
        let dst_i = s.inode(dst.ino)?.inode;
        let dst_d = Dentry {
            kind: dst_i.kind,
            ..dst
        };
        s.remove_entry(parent, name, src);
        s.remove_entry(newparent, newname, dst);
        s.set_entry(parent, name, dst_d, None)?;
        s.set_entry(newparent, newname, src_d, None)?;
        if parent != newparent {
            let d_src = src_dir as i64;
            let d_dst = (dst_i.kind == Kind::Dir) as i64;
            s.touch_dir(parent, d_dst - d_src, now)?;
            s.touch_dir(newparent, d_src - d_dst, now)?;
        } else {
            s.touch_dir(parent, 0, now)?;
        }
        bump_ctime(s, src.ino, now)?;
        bump_ctime(s, dst.ino, now)?;
        return Ok(None);
    }
    let mut replaced = None;
    if let Some(dst) = dst {
        if r.noreplace {
            return Err(FsError::Exists);
        }
        let mut dst_r = s.inode(dst.ino)?;
        match (src_dir, dst_r.inode.kind == Kind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) => {
                if !s.is_empty_dir(dst.ino)? {
                    return Err(FsError::NotEmpty);
                }
                drop_dir(s, dst.ino);
                s.touch_dir(newparent, -1, now)?;
            }
            (false, false) => {
                dst_r.inode.nlink = dst_r.inode.nlink.saturating_sub(1);
                dst_r.inode.ctime = now;
                s.put_inode(&dst_r)?;
                replaced = Some(dst_r.inode);
            }
        }
    }
    s.remove_entry(parent, name, src);
    s.set_entry(newparent, newname, src_d, dst)?;
    let dir_delta = src_dir as i64;
    if parent != newparent {
        s.touch_dir(parent, -dir_delta, now)?;
        s.touch_dir(newparent, dir_delta, now)?;
    } else {
        s.touch_dir(parent, 0, now)?;
    }
    bump_ctime(s, src.ino, now)?;
    Ok(replaced)
}

pub(super) fn set_attrs(s: &mut Stm<'_>, ino: u64, ch: &AttrChange, now: i64) -> FsResult<Inode> {
    let mut r = s.inode(ino)?;
    ch.apply(&mut r.inode, now);
    s.put_inode(&r)?;
    Ok(r.inode)
}

/// The body of `update_xattrs`. Reading the inode makes a concurrent
/// change of its attributes (which rewrites it: ctime) a conflict, so the
/// limits hold at the commit.
pub(super) fn update_xattrs(
    s: &mut Stm<'_>,
    ino: u64,
    names: &[&[u8]],
    limits: XattrLimits,
    decide: &mut DecideXattrs<'_>,
    now: i64,
) -> FsResult<Inode> {
    let mut r = s.inode(ino)?;
    let current = names
        .iter()
        .map(|n| s.get(&xattr_key(ino, n)))
        .collect::<FsResult<Vec<_>>>()?;
    let edit = decide(&r.inode, &current)?;
    if edit.is_empty() {
        return Ok(r.inode);
    }
    if edit.set.iter().any(|(_, v)| v.is_some()) {
        let p = xattrs_of(ino);
        let sizes = s
            .scan(&p, &super::stm::prefix_end(&p), None)?
            .into_iter()
            .map(|(k, v)| Ok((name_in(&k)?, v.len() as u64)))
            .collect::<FsResult<Vec<_>>>()?;
        limits.check(ino, &sizes, &edit.set)?;
    }
    for (name, value) in &edit.set {
        let key = xattr_key(ino, name);
        match value {
            Some(v) => s.put(&key, v.clone()),
            None => s.delete(&key),
        }
    }
    match &edit.attrs {
        Some(ch) => ch.apply(&mut r.inode, now),
        None => r.inode.ctime = now,
    }
    s.put_inode(&r)?;
    Ok(r.inode)
}

/// Path of an inode through its first names; `<ino N>` where the chain
/// breaks.
pub(super) fn path_of(s: &mut Stm<'_>, mut ino: u64) -> FsResult<String> {
    let mut parts = Vec::new();
    while ino != ROOT_INO && parts.len() < 256 {
        match s.first_name(ino)? {
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

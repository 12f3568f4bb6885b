//! The rule of rename: replacing a file or an empty directory,
//! RENAME_NOREPLACE and RENAME_EXCHANGE, no directory below itself, and
//! what links, ctimes and listing cookies do (docs/SEMANTICS.md, "Files
//! and directories" and "Directory listings").

use super::{Tx, inode, require_dir};
use crate::error::{FsError, FsResult};
use crate::meta::types::{Inode, Kind, ROOT_INO};

/// More ancestors than this means a cycle in the stored tree.
const MAX_DEPTH: usize = 4096;

/// What to rename: `parent/name` to `newparent/newname`.
#[derive(Debug, Clone, Copy)]
pub struct Rename<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub newparent: u64,
    pub newname: &'a [u8],
    /// RENAME_NOREPLACE: `EEXIST` if the new name is taken.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: swap the two entries (`ENOENT` if one is missing).
    pub exchange: bool,
}

/// Whether `dir` is `ancestor` or below it. A backend that reads each
/// directory's name on the way (etcd) sees a concurrent move of any of
/// them as a conflict.
fn is_within(tx: &mut impl Tx, mut dir: u64, ancestor: u64) -> FsResult<bool> {
    for _ in 0..MAX_DEPTH {
        if dir == ancestor {
            return Ok(true);
        }
        if dir == ROOT_INO {
            return Ok(false);
        }
        dir = tx.first_parent(dir)?.unwrap_or(ROOT_INO);
    }
    Err(FsError::Meta(format!(
        "directory {dir} is more than {MAX_DEPTH} levels deep: a cycle?"
    )))
}

/// Renames; returns the replaced file (after its nlink drop), if any.
///
/// Refusals, in this order: either directory missing or not one; the
/// source missing; a directory moved into itself or below (`EINVAL`);
/// then for an exchange the target missing, otherwise a taken target
/// under RENAME_NOREPLACE (`EEXIST`), a directory over a non-directory
/// (`ENOTDIR`) or the reverse (`EISDIR`), a non-empty directory replaced
/// (`ENOTEMPTY`). Renaming onto itself, or onto another name of the same
/// inode, does nothing. Every refusal comes before the first write.
///
/// Listing cookies move with their inodes, so a listing meets each
/// renamed inode once in a directory, at its old place; a replaced entry's
/// place is gone.
pub fn rename(tx: &mut impl Tx, r: &Rename<'_>, now: i64) -> FsResult<Option<Inode>> {
    let (parent, name, newparent, newname) = (r.parent, r.name, r.newparent, r.newname);
    require_dir(tx, parent)?;
    require_dir(tx, newparent)?;
    let src = tx.entry(parent, name)?.ok_or(FsError::NotFound)?;
    let src_i = inode(tx, src.ino)?;
    let dst = tx.entry(newparent, newname)?;
    if dst.map(|d| d.ino) == Some(src.ino) {
        return Ok(None);
    }
    let src_dir = src_i.kind == Kind::Dir;
    if src_dir && is_within(tx, newparent, src.ino)? {
        return Err(FsError::Invalid(
            "cannot move a directory into itself".into(),
        ));
    }
    if r.exchange {
        let dst = dst.ok_or(FsError::NotFound)?;
        let dst_i = inode(tx, dst.ino)?;
        tx.remove_entry(parent, name, src)?;
        tx.remove_entry(newparent, newname, dst)?;
        tx.put_entry(parent, name, dst, dst_i.kind, None)?;
        tx.put_entry(newparent, newname, src, src_i.kind, None)?;
        if parent != newparent {
            let d_src = src_dir as i64;
            let d_dst = (dst_i.kind == Kind::Dir) as i64;
            tx.touch_dir(parent, d_dst - d_src, now)?;
            tx.touch_dir(newparent, d_src - d_dst, now)?;
        } else {
            tx.touch_dir(parent, 0, now)?;
        }
        tx.set_ctime(src.ino, now)?;
        tx.set_ctime(dst.ino, now)?;
        return Ok(None);
    }
    let mut replaced = None;
    if let Some(dst) = dst {
        if r.noreplace {
            return Err(FsError::Exists);
        }
        let dst_i = inode(tx, dst.ino)?;
        match (src_dir, dst_i.kind == Kind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) => {
                if !tx.is_empty_dir(dst.ino)? {
                    return Err(FsError::NotEmpty);
                }
                tx.drop_inode(dst.ino)?;
                tx.touch_dir(newparent, -1, now)?;
            }
            (false, false) => {
                tx.add_nlink(dst.ino, -1, now)?;
                replaced = Some(inode(tx, dst.ino)?);
            }
        }
    }
    tx.remove_entry(parent, name, src)?;
    tx.put_entry(newparent, newname, src, src_i.kind, dst)?;
    let dir_delta = src_dir as i64;
    if parent != newparent {
        tx.touch_dir(parent, -dir_delta, now)?;
        tx.touch_dir(newparent, dir_delta, now)?;
    } else {
        tx.touch_dir(parent, 0, now)?;
    }
    tx.set_ctime(src.ino, now)?;
    Ok(replaced)
}

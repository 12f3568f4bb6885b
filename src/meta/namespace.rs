//! [`Namespace`]: inodes, directory entries and extended attributes, the
//! part of the metadata every FUSE request reads.
//!
//! What each step refuses and which writes it makes is decided once, for
//! every backend, in [`super::rules`]; a backend supplies the reads and
//! writes inside its own transaction.

use super::rules;
use super::types::{AttrChange, BlockRow, DecideXattrs, DirEntry, Inode, NewNode, XattrLimits};
use crate::error::FsResult;

/// The namespace of leasefs. Every method is one atomic step of the
/// backend. Errors use the filesystem's own [`crate::error::FsError`]
/// (NotFound, Exists, NotEmpty, ...), so both backends give the same
/// errno for the same refusal.
pub trait Namespace: Send + Sync {
    fn get(&self, ino: u64) -> FsResult<Inode>;
    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// The parent of a directory (`..`); the root is its own parent.
    fn parent_of(&self, dir: u64) -> FsResult<u64>;
    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode>;
    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>>;
    /// A hard link: another name for `ino`.
    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// Removes a non-directory entry; returns the inode after the change
    /// (nlink 0 means the last name is gone).
    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode>;
    /// Removes an empty directory; returns its inode number.
    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64>;
    /// Renames; returns the replaced inode (after its nlink drop), if any.
    /// `exchange` swaps the two entries (RENAME_EXCHANGE).
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>>;
    /// The entries of `dir` whose cookie is above `after`, in cookie
    /// order, at most `limit` of them. A page costs O(`limit`), whatever
    /// the size of the directory.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>>;
    fn set_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode>;
    /// Path of an inode, for logs and listings (first name found).
    fn path_of(&self, ino: u64) -> String;
    /// Inodes with no name left (unlinked while open when a daemon died).
    fn orphans(&self) -> FsResult<Vec<u64>>;
    /// Deletes an inode whose last name and last open handle are gone;
    /// returns its blocks for replica deletion.
    fn delete_inode(&self, ino: u64) -> FsResult<Vec<BlockRow>>;
    /// Totals for statfs: (files, bytes).
    fn usage(&self) -> FsResult<(u64, u64)>;

    // ---- xattrs --------------------------------------------------------
    fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>>;
    /// The inode and its attribute `name`, if it has one, in one read: a
    /// write open needs both (whether the file has capabilities), so
    /// does a create (the directory and its default ACL), and each read
    /// of the store is a transaction that showed in their latency.
    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, Option<Vec<u8>>)>;
    fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>>;
    /// One read-modify-write of an inode's attributes: reads the inode and
    /// the values of `names`, lets `decide` say what changes, and commits
    /// that (ctime stamped) unless it is empty, refusing with
    /// `XattrSpace` what `limits` do not allow. `decide` may run more than
    /// once (a retried etcd step) and must have no other effect.
    fn update_xattrs(
        &self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode>;

    /// `create` / `replace`: XATTR_CREATE / XATTR_REPLACE semantics.
    fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
            rules::xattrs::set_one(&cur[0], name, value, create, replace)
        })
        .map(drop)
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
            rules::xattrs::remove_one(&cur[0], name)
        })
        .map(drop)
    }
}

/// Every entry of `dir`, page by page, in cookie order.
pub fn list_all(m: &dyn Namespace, dir: u64) -> FsResult<Vec<DirEntry>> {
    const PAGE: usize = 1024;
    let mut all: Vec<DirEntry> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.cookie);
        let page = m.readdir(dir, after, PAGE)?;
        let done = page.len() < PAGE;
        all.extend(page);
        if done {
            return Ok(all);
        }
    }
}

//! The namespace rules, written once for every backend: what lookup,
//! create, link, unlink, rmdir, rename, setattr and the xattr changes
//! refuse (and with which error, in which order), and which writes they
//! make: nlink and ctime changes, where listing cookies go, what a
//! replaced file or directory loses.
//!
//! A backend runs a rule inside one of its transactions, through [`Tx`]:
//! the reads a rule needs and the writes it decides, each of which the
//! backend maps to its own storage (SQL statements; etcd keys, where one
//! entry is three keys). The rules are tested once, against an in-memory
//! [`Tx`] (`tests/`); what depends on a backend (that its reads and
//! writes store what the rules decided, its atomicity, its races) is
//! tested on both in `tests/meta_conformance.rs`.

mod entries;
mod rename;
pub mod xattrs;

#[cfg(test)]
mod mem;
#[cfg(test)]
mod tests;

pub use entries::{
    create, link, lookup, parent_of, path_of, require_dir, rmdir, set_attrs, unlink,
};
pub use rename::{Rename, rename};
pub use xattrs::update_xattrs;

use super::types::{Inode, Kind};
use crate::error::{FsError, FsResult};

/// A directory entry as a rule sees it: the inode it names and its place
/// in the directory's listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub ino: u64,
    pub cookie: u64,
}

/// The reads and writes of one backend transaction that the rules use.
/// Reads see the transaction's own writes. A write of an inode that is
/// not there changes nothing (as an SQL UPDATE of no row).
pub trait Tx {
    fn inode(&mut self, ino: u64) -> FsResult<Option<Inode>>;
    fn entry(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<Entry>>;
    fn is_empty_dir(&mut self, dir: u64) -> FsResult<bool>;
    /// The directory of one name of `ino` (a directory has one name).
    fn first_parent(&mut self, ino: u64) -> FsResult<Option<u64>>;
    /// One (parent, name) of `ino`.
    fn first_name(&mut self, ino: u64) -> FsResult<Option<(u64, Vec<u8>)>>;
    fn xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>>;
    /// (name, value length) of every attribute of `ino`.
    fn xattr_sizes(&mut self, ino: u64) -> FsResult<Vec<(Vec<u8>, u64)>>;

    /// A new inode; `target` is a symlink's.
    fn insert_inode(&mut self, i: &Inode, target: Option<&[u8]>) -> FsResult<()>;
    /// Stores `i`'s mode, owner, group, atime, mtime and ctime.
    fn put_attrs(&mut self, i: &Inode) -> FsResult<()>;
    /// Adds `delta` to the link count (never below 0 where the backend
    /// can tell) and sets ctime.
    fn add_nlink(&mut self, ino: u64, delta: i64, ctime: i64) -> FsResult<()>;
    fn set_ctime(&mut self, ino: u64, ctime: i64) -> FsResult<()>;
    /// A change of the directory's entries: mtime = ctime = `now`, and
    /// `nlink_delta` subdirectories more or fewer.
    fn touch_dir(&mut self, dir: u64, nlink_delta: i64, now: i64) -> FsResult<()>;
    /// Points `parent/name` at `e` (an inode of kind `kind`), replacing
    /// the entry `replacing` that is there, if any.
    fn put_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        e: Entry,
        kind: Kind,
        replacing: Option<Entry>,
    ) -> FsResult<()>;
    fn remove_entry(&mut self, parent: u64, name: &[u8], e: Entry) -> FsResult<()>;
    /// Deletes an inode that has no entry left (an empty directory) and
    /// its attributes.
    fn drop_inode(&mut self, ino: u64) -> FsResult<()>;
    fn put_xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()>;
    fn remove_xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()>;
}

/// The inode `ino`; `NotFound` if there is none.
fn inode(tx: &mut impl Tx, ino: u64) -> FsResult<Inode> {
    tx.inode(ino)?.ok_or(FsError::NotFound)
}

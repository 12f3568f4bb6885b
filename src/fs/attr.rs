//! The attributes the core reports, free of fuser types.

use crate::meta::{Inode, Kind};

#[derive(Debug, Clone)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    /// True while a writer holds the file: callers must not cache it.
    pub under_construction: bool,
}

impl Attr {
    pub fn from_inode(i: &Inode) -> Attr {
        Attr {
            ino: i.ino,
            kind: i.kind,
            perm: (i.mode & 0o7777) as u16,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            size: i.size,
            rdev: i.rdev,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            under_construction: false,
        }
    }
}

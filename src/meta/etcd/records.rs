//! The key layout of the etcd backend and its records.
//!
//! Under the filesystem's prefix (never `lease/`, `mounts/`, `elect/` or
//! `hk/`, which belong to the cluster lease layer):
//!
//! | key                               | value                           |
//! |-----------------------------------|---------------------------------|
//! | `i/<ino>`                         | [`InodeRec`] (JSON)             |
//! | `d/<parent>/<name hex>`           | [`Dentry`]: child ino, kind, cookie |
//! | `o/<parent>/<cookie>`             | [`Listed`]: the entry, for listings |
//! | `p/<ino>/<parent>/<name hex>`     | empty: one per name of `ino`    |
//! | `x/<ino>/<name hex>`              | the xattr's raw value           |
//! | `b/<ino>/<idx>`                   | [`BlockRow`] (JSON)             |
//! | `bid/<block id>`                  | [`BlockAt`]: where the row is   |
//! | `uc/<ino>`                        | [`UnderConstruction`] (JSON)    |
//! | `c/<name>`                        | counter, decimal                |
//! | `a/<election hex>/<seq>`          | [`AuditEvent`] (JSON)           |
//! | `fsid`                            | the filesystem ID               |
//! | `dn/<id>`                         | [`DatanodeRecord`] (JSON)       |
//! | `dnclaim/<path hex>`              | the storage ID claimed for a    |
//! |                                   | new object-store datanode       |
//! | `dn`                              | [`PositionalDatanodes`] (JSON): |
//! |                                   | the positional layout's list,   |
//! |                                   | turned into `dn/` at open       |
//!
//! Numbers are 16 hex digits, so keys sort like the numbers; names are hex
//! so they sort like the bytes (SQLite's BLOB order) and may hold any byte.
//! `p/` lets `path_of` and `..` find a name of an inode without a scan;
//! `o/` lists a directory in cookie order, a page per range read.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::stm::{Stm, prefix_end};
use crate::error::{FsError, FsResult};
use crate::meta::rules::Entry;
use crate::meta::types::*;

pub(super) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

pub(super) fn unhex(s: &str) -> FsResult<Vec<u8>> {
    let bad = || FsError::Meta(format!("bad hex in etcd key or record: {s:?}"));
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

fn num(s: &str) -> FsResult<u64> {
    u64::from_str_radix(s, 16).map_err(|_| FsError::Meta(format!("bad number in etcd key: {s:?}")))
}

pub(super) const INODES: &str = "i/";
pub(super) const BLOCKS: &str = "b/";
pub(super) const UCS: &str = "uc/";
pub(super) const POSITIONAL_DATANODES: &str = "dn";
pub(super) const DATANODES: &str = "dn/";
pub(super) const FILESYSTEM_ID: &str = "fsid";

pub(super) fn inode_key(ino: u64) -> String {
    format!("i/{ino:016x}")
}
pub(super) fn dentry_key(parent: u64, name: &[u8]) -> String {
    format!("d/{parent:016x}/{}", hex(name))
}
pub(super) fn dentries_of(dir: u64) -> String {
    format!("d/{dir:016x}/")
}
pub(super) fn name_key(ino: u64, parent: u64, name: &[u8]) -> String {
    format!("p/{ino:016x}/{parent:016x}/{}", hex(name))
}
pub(super) fn listed_key(parent: u64, cookie: u64) -> String {
    format!("o/{parent:016x}/{cookie:016x}")
}
pub(super) fn listing_of(dir: u64) -> String {
    format!("o/{dir:016x}/")
}
pub(super) fn names_of(ino: u64) -> String {
    format!("p/{ino:016x}/")
}
pub(super) fn xattr_key(ino: u64, name: &[u8]) -> String {
    format!("x/{ino:016x}/{}", hex(name))
}
pub(super) fn xattrs_of(ino: u64) -> String {
    format!("x/{ino:016x}/")
}
pub(super) fn block_key(ino: u64, idx: u64) -> String {
    format!("b/{ino:016x}/{idx:016x}")
}
pub(super) fn blocks_of(ino: u64) -> String {
    format!("b/{ino:016x}/")
}
pub(super) fn block_index_key(block_id: u64) -> String {
    format!("bid/{block_id:016x}")
}
pub(super) fn uc_key(ino: u64) -> String {
    format!("uc/{ino:016x}")
}
pub(super) fn claim_key(path: &std::path::Path) -> String {
    format!("dnclaim/{}", hex(path.as_os_str().as_encoded_bytes()))
}
pub(super) fn datanode_key(id: DnId) -> String {
    format!("{DATANODES}{:016x}", id.0)
}

pub(super) fn counter_key(name: &str) -> String {
    format!("c/{name}")
}
pub(super) fn fences_of(owner: &str) -> String {
    format!("f/{}/", hex(owner.as_bytes()))
}
pub(super) fn fence_key(owner: &str, pgid: u32) -> String {
    format!("{}{pgid:08x}", fences_of(owner))
}
pub(super) fn audit_of(election: &str) -> String {
    format!("a/{}/", hex(election.as_bytes()))
}
pub(super) fn audit_key(election: &str, seq: u64) -> String {
    format!("{}{seq:016x}", audit_of(election))
}
/// The events user `uid` recorded, by sequence (each names its event's key).
pub(super) fn audit_by_user(uid: u32) -> String {
    format!("au/{uid:08x}/")
}
pub(super) fn audit_user_key(uid: u32, seq: u64) -> String {
    format!("{}{seq:016x}", audit_by_user(uid))
}

/// The last component of `key`, decoded from hex.
pub(super) fn name_in(key: &str) -> FsResult<Vec<u8>> {
    unhex(key.rsplit('/').next().unwrap_or_default())
}

/// (parent, name) from a `p/<ino>/<parent>/<name>` or a
/// `d/<parent>/<name>` key.
pub(super) fn parse_name_key(key: &str) -> FsResult<(u64, Vec<u8>)> {
    let mut it = key.rsplit('/');
    let name = unhex(it.next().unwrap_or_default())?;
    let parent = num(it.next().unwrap_or_default())?;
    Ok((parent, name))
}

/// An inode as stored, with its symlink target (hex).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct InodeRec {
    #[serde(flatten)]
    pub inode: Inode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct Dentry {
    pub ino: u64,
    pub kind: Kind,
    /// Its place in listings; 0 in entries written before cookies existed
    /// (given one at the next mount, see `EtcdMeta::open`).
    #[serde(default)]
    pub cookie: u64,
}

/// A directory entry as its directory's listing holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Listed {
    /// The name, hex.
    pub name: String,
    pub ino: u64,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct BlockAt {
    pub ino: u64,
    pub idx: u64,
}

/// What the positional layout recorded: the `--datanode` list of the last
/// mount, whose places block rows name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct PositionalDatanodes {
    pub dirs: Vec<String>,
    pub replication: Option<usize>,
}

pub(super) fn encode<T: Serialize>(v: &T) -> FsResult<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| FsError::Meta(format!("cannot encode a record: {e}")))
}

pub(super) fn decode<T: DeserializeOwned>(key: &str, v: &[u8]) -> FsResult<T> {
    serde_json::from_slice(v).map_err(|e| FsError::Meta(format!("corrupt record at {key}: {e}")))
}

/// Typed reads and writes of the records, in one attempt.
impl Stm<'_> {
    pub fn get_json<T: DeserializeOwned>(&mut self, key: &str) -> FsResult<Option<T>> {
        self.get(key)?.map(|v| decode(key, &v)).transpose()
    }

    pub fn put_json<T: Serialize>(&mut self, key: &str, v: &T) -> FsResult<()> {
        self.put(key, encode(v)?);
        Ok(())
    }

    /// Every record whose key starts with `prefix`, in key order.
    pub fn scan_json<T: DeserializeOwned>(&mut self, prefix: &str) -> FsResult<Vec<(String, T)>> {
        self.scan(prefix, &prefix_end(prefix), None)?
            .into_iter()
            .map(|(k, v)| {
                let t = decode(&k, &v)?;
                Ok((k, t))
            })
            .collect()
    }

    pub fn find_inode(&mut self, ino: u64) -> FsResult<Option<InodeRec>> {
        self.get_json(&inode_key(ino))
    }

    /// The inode `ino` with its symlink target; `NotFound` without one.
    pub fn inode_rec(&mut self, ino: u64) -> FsResult<InodeRec> {
        self.find_inode(ino)?.ok_or(FsError::NotFound)
    }

    pub fn put_inode(&mut self, r: &InodeRec) -> FsResult<()> {
        self.put_json(&inode_key(r.inode.ino), r)
    }

    /// Applies `f` to the inode if it exists (like an SQL UPDATE, which
    /// changes nothing when the row is missing).
    pub fn update_inode(&mut self, ino: u64, f: impl FnOnce(&mut Inode)) -> FsResult<()> {
        if let Some(mut r) = self.find_inode(ino)? {
            f(&mut r.inode);
            self.put_inode(&r)?;
        }
        Ok(())
    }

    /// Points `parent/name` at `d`, replacing the entry `old` that was
    /// there, if any; keeps the `p/` names and the `o/` listing in step.
    pub fn set_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        d: Dentry,
        old: Option<Entry>,
    ) -> FsResult<()> {
        if let Some(o) = old {
            self.delete(&name_key(o.ino, parent, name));
            self.delete(&listed_key(parent, o.cookie));
        }
        self.put_json(&dentry_key(parent, name), &d)?;
        self.put(&name_key(d.ino, parent, name), Vec::new());
        let listed = Listed {
            name: hex(name),
            ino: d.ino,
            kind: d.kind,
        };
        self.put_json(&listed_key(parent, d.cookie), &listed)
    }

    pub fn counter(&mut self, name: &str) -> FsResult<Option<u64>> {
        let key = counter_key(name);
        match self.get(&key)? {
            None => Ok(None),
            Some(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| FsError::Meta(format!("corrupt counter {key}"))),
        }
    }

    pub fn set_counter(&mut self, name: &str, v: u64) {
        self.put(&counter_key(name), v.to_string().into_bytes());
    }

    /// Removes the file's blocks from index `from` on and returns them. The
    /// rows go with one range deletion and their `bid/` index keys with
    /// [`Stm::delete_later`], so a file of any length fits one Txn.
    pub fn drop_blocks_from(&mut self, ino: u64, from: u64) -> FsResult<Vec<BlockRow>> {
        let start = block_key(ino, from);
        let end = prefix_end(&blocks_of(ino));
        let rows: Vec<BlockRow> = self
            .scan(&start, &end, None)?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect::<FsResult<_>>()?;
        if rows.is_empty() {
            return Ok(rows);
        }
        // The scan's range compare catches rows added or changed under us;
        // a concurrent removal is caught through the inode, which every
        // removal rewrites (or, without an inode, through each row).
        match self.find_inode(ino)? {
            Some(r) => self.put_inode(&r)?,
            None => {
                for b in &rows {
                    self.get(&block_key(ino, b.idx))?;
                }
            }
        }
        self.delete_range(&start, &end);
        for b in &rows {
            self.delete_later(block_index_key(b.block_id));
        }
        Ok(rows)
    }
}

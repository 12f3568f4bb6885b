//! The records every metadata backend stores: inodes, blocks, files under
//! construction, the datanode registry, election audit events and
//! election fences.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use crate::storage::identity::DnId;

pub const ROOT_INO: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    pub fn from_i64(v: i64) -> Kind {
        match v {
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => Kind::File,
        }
    }
    /// The kind encoded in the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// One inode as stored. `mode` holds permission bits only (incl. setuid,
/// setgid, sticky); the kind is separate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: u64,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    pub block_size: u64,
    pub last_epoch: u64,
}

/// One block of a file and where its replicas are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRow {
    pub ino: u64,
    pub idx: u64,
    pub block_id: u64,
    pub gs: u64,
    pub len: u64,
    pub finalized: bool,
    /// The datanodes holding replicas, by registry id (never by place in
    /// the `--datanode` list).
    pub replicas: Vec<DnId>,
}

/// A small block whose bytes the metadata store keeps until its replicas
/// are known durable (the block journal, `pipeline::journal`): the bytes
/// its fsync was acknowledged with, under the stamp they were written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRow {
    pub block_id: u64,
    pub gs: u64,
    pub data: Vec<u8>,
}

impl JournalRow {
    /// The row keeping `data`, the bytes of block `row`.
    pub fn of(row: &BlockRow, data: &[u8]) -> JournalRow {
        JournalRow {
            block_id: row.block_id,
            gs: row.gs,
            data: data.to_vec(),
        }
    }
}

/// The registry's record of one datanode (a storage directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRecord {
    pub id: DnId,
    /// The storage ID in the directory's identity file; `None` for a
    /// datanode of the positional layout not yet given one.
    pub storage_id: Option<String>,
    /// Where the directory was last attached.
    pub path: PathBuf,
    pub state: AdminState,
    /// The host whose copies it holds (a directory of a mount with `-o
    /// local_copy`, by that host's id): such a datanode counts toward
    /// nothing and is only ever attached by its own host. `None`: a shared
    /// datanode, counted toward the replication factor (docs/SEMANTICS.md,
    /// "Host-local copies"). Left out of the JSON when `None`, so records
    /// of earlier releases read the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// What an operator (or an upgrade) made of a datanode; whether it is up
/// (live, full, dead) is known only to running daemons. The admin states
/// follow HDFS's decommissioning (docs/SEMANTICS.md, "Datanode
/// administration").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminState {
    /// Recorded by the positional layout (its id is its old place in the
    /// `--datanode` list) and not yet given an identity file: the upgrade
    /// at mount finishes it.
    Upgrading,
    /// Takes part in placement while it is live.
    Normal,
    /// Takes no new replica and does not count toward the replication
    /// factor; serves reads while housekeeping copies its blocks until
    /// each is held R times by normal datanodes.
    Decommissioning,
    /// Every block it holds is held R times elsewhere: safe to remove.
    /// Still serves reads.
    Decommissioned,
    /// Removed by the operator: a tombstone, so that its storage ID is
    /// never taken for a new datanode and its id never reused. No block
    /// row lists it (rows that still do, over etcd for a moment, mean
    /// nothing).
    Removed,
}

impl AdminState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Upgrading => "upgrading",
            AdminState::Normal => "normal",
            AdminState::Decommissioning => "decommissioning",
            AdminState::Decommissioned => "decommissioned",
            AdminState::Removed => "removed",
        }
    }

    pub fn parse(s: &str) -> Option<AdminState> {
        match s {
            "upgrading" => Some(AdminState::Upgrading),
            "normal" => Some(AdminState::Normal),
            "decommissioning" => Some(AdminState::Decommissioning),
            "decommissioned" => Some(AdminState::Decommissioned),
            "removed" => Some(AdminState::Removed),
            _ => None,
        }
    }

    /// Whether replicas on it count toward the replication factor and it
    /// may take new ones (when it is also live).
    pub fn in_service(self) -> bool {
        matches!(self, AdminState::Normal | AdminState::Upgrading)
    }
}

/// A file under construction, persisted with its holder as in HDFS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderConstruction {
    pub ino: u64,
    pub holder: String,
    pub pid: u32,
    pub comm: String,
    pub epoch: u64,
    pub mount_id: String,
    pub since_ms: u64,
}

/// One row of the election audit table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// The election directory, as a path inside the mount.
    pub election: String,
    /// elected, lost, resigned, expired, preempted, ...
    pub event: String,
    pub who: String,
    pub host: String,
    pub pid: u32,
    pub epoch: u64,
    pub at_ms: u64,
    pub why: String,
}

impl AuditEvent {
    /// Whether recording this event would only repeat what `history` (the
    /// election's events) already says: a second `elected` of one term, an
    /// end that a successor records on a term's behalf (`expired`,
    /// `preempted`) when the term's end is recorded already, or the very
    /// same event again (a retried write whose answer was lost). Backends
    /// leave such events out, so that every term has one start, and an
    /// elector and the daemon may both try to record how a term ended.
    /// Events without an epoch (0: the daemons' housekeeping leadership)
    /// are never left out.
    pub fn is_redundant(&self, history: &[AuditEvent]) -> bool {
        if self.epoch == 0 {
            return false;
        }
        let same_term = |e: &&AuditEvent| e.epoch == self.epoch && e.election == self.election;
        match self.event.as_str() {
            "elected" => history
                .iter()
                .filter(same_term)
                .any(|e| e.event == "elected"),
            "expired" | "preempted" => history.iter().filter(same_term).any(|e| {
                matches!(
                    e.event.as_str(),
                    "lost" | "resigned" | "expired" | "preempted"
                )
            }),
            _ => history.iter().any(|e| e == self),
        }
    }
}

/// A durable election fence: the process tree running the command of one
/// election term (docs/SEMANTICS.md, "Fencing"). Kept until no process of
/// that tree is left, so that a daemon restarted on the same data
/// directory goes on refusing it once its term is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// The daemon lineage that registered it: `host:DATA` (the host and
    /// the data directory), the same for every restart of that daemon.
    pub owner: String,
    /// The command's pid: its process group and its session.
    pub pgid: u32,
    /// The command's start time (clock ticks after boot) and the boot:
    /// with them a later process that reuses the number is told apart.
    pub start_ticks: u64,
    pub boot_id: String,
    /// The command's cgroup (as `/proc/PID/cgroup` names it), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The election file, as a path inside the mount, and its inode.
    pub leader: String,
    pub ino: u64,
    /// The term's epoch.
    pub epoch: u64,
    /// The elector that leads the term: its id and pid.
    pub who: String,
    pub pid: u32,
}

/// What a new node is.
pub struct NewNode<'a> {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub target: Option<&'a [u8]>,
    pub block_size: u64,
    /// Extended attributes the node is born with (the ACLs it inherits),
    /// stored in the same step as the node itself.
    pub xattrs: Vec<Xattr>,
}

/// The first cookie a directory entry can have: FUSE offsets 1 and 2 are
/// `.` and `..`, so an entry's cookie is its offset in a listing.
pub const FIRST_COOKIE: u64 = 3;

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
    /// The entry's place in listings of its directory: unique in the
    /// directory, never reused, and carried along when the inode is
    /// renamed, so a listing resumed after a cookie returns every entry
    /// that stayed in place exactly once, whatever was added or removed.
    pub cookie: u64,
}

/// An extended attribute: name and value.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// How [`crate::meta::Namespace::update_xattrs`] decides its change from the
/// inode and the current values of the attributes it asked for.
pub type DecideXattrs<'a> =
    dyn FnMut(&Inode, &[Option<Vec<u8>>]) -> crate::error::FsResult<XattrEdit> + 'a;

/// What [`crate::meta::Namespace::update_xattrs`] changes, decided from the
/// inode and the current values of the attributes it asked for.
#[derive(Debug, Default, Clone)]
pub struct XattrEdit {
    /// `(name, Some(value))` sets, `(name, None)` removes.
    pub set: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Attribute changes committed in the same step (the mode an access
    /// ACL implies, a chmod with the ACL it rewrites).
    pub attrs: Option<AttrChange>,
}

impl XattrEdit {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.attrs.is_none()
    }
}

/// How much extended-attribute data one inode may hold; see
/// [`XattrLimits::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrLimits {
    /// Names and values of all of an inode's attributes together.
    pub total: u64,
    /// Its list of names as `listxattr` returns it (each name and a NUL).
    pub names: u64,
}

impl XattrLimits {
    pub const NONE: XattrLimits = XattrLimits {
        total: u64::MAX,
        names: u64::MAX,
    };

    /// Refuses (`XattrSpace`) a change that would leave the inode over a
    /// limit and uses more than before; `existing` are (name, value length)
    /// of every stored attribute. A change that shrinks is always allowed,
    /// so an inode over the limits can still be cleaned up.
    pub fn check(
        &self,
        ino: u64,
        existing: &[(Vec<u8>, u64)],
        set: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> crate::error::FsResult<()> {
        let usage = |entries: &mut dyn Iterator<Item = (usize, u64)>| {
            entries.fold((0u64, 0u64), |(t, n), (name, value)| {
                (t + name as u64 + value, n + name as u64 + 1)
            })
        };
        let before = usage(&mut existing.iter().map(|(n, v)| (n.len(), *v)));
        let mut after_map: std::collections::BTreeMap<&[u8], u64> =
            existing.iter().map(|(n, v)| (n.as_slice(), *v)).collect();
        for (n, v) in set {
            match v {
                Some(v) => after_map.insert(n.as_slice(), v.len() as u64),
                None => after_map.remove(n.as_slice()),
            };
        }
        let after = usage(&mut after_map.iter().map(|(n, v)| (n.len(), *v)));
        let grows = after.0 > before.0 || after.1 > before.1;
        if grows && (after.0 > self.total || after.1 > self.names) {
            return Err(crate::error::FsError::XattrSpace {
                ino,
                used: after.0,
                limit: self.total,
            });
        }
        Ok(())
    }
}

/// Size of the filesystem that holds a metadata store, for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreSpace {
    pub total_bytes: u64,
    pub avail_bytes: u64,
}

/// Attribute changes of `setattr` (size is handled by the write path).
#[derive(Debug, Default, Clone)]
pub struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
    pub ctime: Option<i64>,
}

impl AttrChange {
    /// Applies the change to `i`; ctime becomes the given one, else `now`.
    pub fn apply(&self, i: &mut Inode, now: i64) {
        if let Some(m) = self.mode {
            i.mode = m & 0o7777;
        }
        if let Some(u) = self.uid {
            i.uid = u;
        }
        if let Some(g) = self.gid {
            i.gid = g;
        }
        if let Some(a) = self.atime {
            i.atime = a;
        }
        if let Some(m) = self.mtime {
            i.mtime = m;
        }
        i.ctime = self.ctime.unwrap_or(now);
    }
}

pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, epoch: u64, at_ms: u64) -> AuditEvent {
        AuditEvent {
            election: "/el".into(),
            event: event.into(),
            who: "a".into(),
            host: "h".into(),
            pid: 1,
            epoch,
            at_ms,
            why: String::new(),
        }
    }

    /// Every term gets one start, and a successor's account of how a term
    /// ended is left out when the term's end is recorded already; a
    /// leader's own late `lost` is kept, an exact repeat is not; other
    /// terms, other elections and events without an epoch are
    /// independent.
    #[test]
    fn redundant_audit_events() {
        let mut h = vec![ev("elected", 7, 1)];
        assert!(ev("elected", 7, 2).is_redundant(&h), "second start");
        assert!(!ev("preempted", 7, 3).is_redundant(&h));
        h.push(ev("preempted", 7, 3));
        for end in ["expired", "preempted"] {
            assert!(ev(end, 7, 4).is_redundant(&h), "second guess: {end}");
        }
        assert!(!ev("lost", 7, 5).is_redundant(&h), "late lost");
        h.push(ev("lost", 7, 5));
        assert!(ev("lost", 7, 5).is_redundant(&h), "a retried write");
        assert!(!ev("lost", 7, 6).is_redundant(&h), "a later lost");
        assert!(!ev("expired", 8, 6).is_redundant(&h), "another term");
        assert!(!ev("elected", 8, 6).is_redundant(&h));
        let other = AuditEvent {
            election: "/other".into(),
            ..ev("elected", 7, 7)
        };
        assert!(!other.is_redundant(&h), "another election");
        let hk = ev("elected", 0, 9);
        assert!(!hk.is_redundant(&[hk.clone(), hk.clone()]), "no epoch");
    }
}

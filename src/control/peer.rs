//! Who is on the other end of a control connection (`SO_PEERCRED`, plus
//! the supplementary groups of that process), and the permission checks
//! the control requests make on their behalf: the same rules the kernel
//! applies to the mount (owner, group, other bits, and a POSIX access ACL
//! where one is stored), with root allowed everything.

use std::os::unix::net::UnixStream;

use crate::fs::acl::{self, Acl, Entry, Tag};
use crate::meta::{Inode, Namespace};

/// Read, write and search (execute) bits, as in a mode's `rwx`.
pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const SEARCH: u32 = 1;

/// The credentials of a connected client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The client's process (thread-group id) when it connected.
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, from `/proc/<pid>/status`; empty if unknown.
    pub groups: Vec<u32>,
}

impl Peer {
    /// The peer of a connected Unix socket.
    pub fn of(conn: &UnixStream) -> nix::Result<Peer> {
        let c = nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials)?;
        let pid = c.pid().max(0) as u32;
        Ok(Peer {
            pid,
            uid: c.uid(),
            gid: c.gid(),
            groups: supplementary_groups(pid),
        })
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether the peer may access `inode` for `want` (a mask of
    /// [`READ`], [`WRITE`], [`SEARCH`]), given its access ACL in the
    /// kernel's xattr format if it has one.
    pub fn may(&self, inode: &Inode, acl: Option<&[u8]>, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        if let Some(a) = acl.and_then(|v| Acl::parse(v).ok().flatten()) {
            return self.acl_allows(inode, a.entries(), want);
        }
        let bits = if self.uid == inode.uid {
            inode.mode >> 6
        } else if self.in_group(inode.gid) {
            inode.mode >> 3
        } else {
            inode.mode
        };
        bits & want == want
    }

    /// POSIX.1e access check, as Linux's `posix_acl_permission`: the
    /// owner entry, then named users (masked), then the owning and named
    /// groups (masked; any match that grants suffices, a match that does
    /// not denies), then other.
    fn acl_allows(&self, inode: &Inode, entries: &[Entry], want: u32) -> bool {
        let perm = |tag: Tag| {
            entries
                .iter()
                .find(|e| e.tag == tag)
                .map(|e| u32::from(e.perm))
        };
        let mask = perm(Tag::Mask).unwrap_or(7);
        let grants = |p: u32| p & want == want;
        if self.uid == inode.uid {
            return perm(Tag::UserObj).is_some_and(grants);
        }
        if let Some(e) = entries
            .iter()
            .find(|e| e.tag == Tag::User && e.id == self.uid)
        {
            return grants(u32::from(e.perm) & mask);
        }
        let mut matched = false;
        for e in entries {
            let member = match e.tag {
                Tag::GroupObj => self.in_group(inode.gid),
                Tag::Group => self.in_group(e.id),
                _ => false,
            };
            if member {
                if grants(u32::from(e.perm) & mask) {
                    return true;
                }
                matched = true;
            }
        }
        !matched && perm(Tag::Other).is_some_and(grants)
    }

    /// Whether the peer may access `ino` for `want`, reading its inode and
    /// ACL from the store.
    pub fn may_ino(&self, meta: &dyn Namespace, ino: u64, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        let Ok(inode) = meta.get(ino) else {
            return false;
        };
        let acl = meta.getxattr(ino, acl::ACCESS).ok();
        self.may(&inode, acl.as_deref(), want)
    }
}

/// `Groups:` of `/proc/<pid>/status`.
fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Kind;

    const READ: u32 = 4;

    fn inode(mode: u32, uid: u32, gid: u32) -> Inode {
        Inode {
            ino: 2,
            kind: Kind::File,
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            crtime: 0,
            block_size: 0,
            last_epoch: 0,
        }
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    const ACL_USER_OBJ: u16 = 0x01;
    const ACL_USER: u16 = 0x02;
    const ACL_GROUP_OBJ: u16 = 0x04;
    const ACL_MASK: u16 = 0x10;
    const ACL_OTHER: u16 = 0x20;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn mode_bits_decide_by_owner_then_group_then_other() {
        let f = inode(0o640, 1000, 100);
        assert!(peer(1000, 1000, &[]).may(&f, None, WRITE));
        assert!(!peer(2000, 100, &[]).may(&f, None, WRITE));
        assert!(peer(2000, 100, &[]).may(&f, None, READ));
        assert!(
            peer(2000, 5, &[100]).may(&f, None, READ),
            "supplementary group"
        );
        assert!(!peer(65534, 65534, &[]).may(&f, None, READ));
        assert!(peer(0, 0, &[]).may(&f, None, WRITE), "root");
        // The owner class decides even when others have more.
        let g = inode(0o077, 1000, 100);
        assert!(!peer(1000, 100, &[]).may(&g, None, READ));
    }

    #[test]
    fn an_access_acl_grants_named_users_through_its_mask() {
        let f = inode(0o640, 1000, 100);
        let a = acl(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_USER, 6, 65534),
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_MASK, 6, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]);
        assert!(peer(65534, 65534, &[]).may(&f, Some(&a), WRITE));
        assert!(!peer(4242, 4242, &[]).may(&f, Some(&a), READ));
        let masked = acl(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_USER, 6, 65534),
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_MASK, 4, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]);
        assert!(!peer(65534, 65534, &[]).may(&f, Some(&masked), WRITE));
        assert!(peer(65534, 65534, &[]).may(&f, Some(&masked), READ));
        // Not an ACL: the mode decides.
        assert!(!peer(65534, 65534, &[]).may(&f, Some(b"junk"), READ));
    }
}

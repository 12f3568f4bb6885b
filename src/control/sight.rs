//! Which names of the namespace a control request may show its peer: only
//! what the peer could find with `ls` and `stat` (docs/SEMANTICS.md,
//! "The control socket"). A path is shown when the peer may read and
//! search every directory on it, from the mount root down to the file's
//! parent, judged as [`Peer::may_ino`] judges (mode, owner, groups, access
//! ACL); root sees every path. A name the daemon cannot walk again (a
//! file with no name left, shown as `<ino N>`; a name that is not UTF-8)
//! is shown to root only.

use std::collections::HashMap;

use super::peer::{Peer, READ, SEARCH};
use crate::fs::core::Core;
use crate::meta::ROOT_INO;

/// One peer's view, remembering the directories already judged (a
/// listing names many files of the same directories).
pub struct Sight<'a> {
    core: &'a Core,
    peer: &'a Peer,
    /// A directory's path -> its inode when the peer may list it, `None`
    /// when the peer may not list it or something above it.
    dirs: HashMap<String, Option<u64>>,
}

impl<'a> Sight<'a> {
    pub fn new(core: &'a Core, peer: &'a Peer) -> Sight<'a> {
        Sight {
            core,
            peer,
            dirs: HashMap::new(),
        }
    }

    /// Whether `rel` (a path from the mount root, `/a/b/file`) may be
    /// shown to the peer.
    pub fn shows(&mut self, rel: &str) -> bool {
        if self.peer.is_root() {
            return true;
        }
        let Some(inside) = rel.strip_prefix('/') else {
            return false;
        };
        let parent = match inside.rsplit_once('/') {
            Some((dir, _)) => dir,
            None => "",
        };
        self.listable(parent).is_some()
    }

    /// The inode of directory `dir` (`a/b`, "" for the root) if the peer
    /// may list it and every directory above it.
    fn listable(&mut self, dir: &str) -> Option<u64> {
        if let Some(known) = self.dirs.get(dir) {
            return *known;
        }
        let found = if dir.is_empty() {
            Some(ROOT_INO)
        } else {
            let (above, name) = dir.rsplit_once('/').unwrap_or(("", dir));
            self.listable(above).and_then(|up| {
                self.core
                    .meta()
                    .lookup(up, name.as_bytes())
                    .ok()
                    .map(|e| e.ino)
            })
        };
        let ino = found.filter(|&ino| self.peer.may_ino(&**self.core.meta(), ino, READ | SEARCH));
        self.dirs.insert(dir.to_string(), ino);
        ino
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MountOptions;
    use crate::fs::testing::{TestFs, caller, node};
    use crate::meta::Kind;

    /// The kernel's ACL xattr: version 2, then (tag, perm, id) entries.
    fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn a_path_shows_where_every_directory_on_it_may_be_listed() {
        let s = TestFs::new(MountOptions::default(), 1);
        let c = s.core.clone();
        let root = caller(std::process::id());
        let dir = |parent: u64, name: &str, mode: u32| {
            let mut n = node(Kind::Dir);
            n.mode = mode;
            c.mknode(parent, name.as_bytes(), n, root)
                .expect("mkdir")
                .ino
        };
        let public = dir(ROOT_INO, "pub", 0o755);
        dir(public, "deep", 0o755);
        let listless = dir(ROOT_INO, "home", 0o711);
        dir(listless, "www", 0o755);
        dir(ROOT_INO, "closed", 0o700);
        let granted = dir(ROOT_INO, "granted", 0o700);
        // user::rwx, user:1000:r-x, group::---, mask::r-x, other::---
        let acl = acl_bytes(&[
            (0x01, 7, u32::MAX),
            (0x02, 5, 1000),
            (0x04, 0, u32::MAX),
            (0x10, 5, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        c.setxattr(granted, b"system.posix_acl_access", &acl, 0, root)
            .expect("set the ACL");

        let user = |uid: u32| Peer {
            pid: 1,
            uid,
            gid: uid,
            groups: Vec::new(),
        };
        let (alice, bob, admin) = (user(1000), user(1001), user(0));
        let mut a = Sight::new(&c, &alice);
        let mut b = Sight::new(&c, &bob);
        let mut r = Sight::new(&c, &admin);
        for (path, to_users) in [
            ("/f", true),
            ("/pub/f", true),
            ("/pub/deep/f", true),
            ("/pub/missing/f", false),
            ("/home/f", false),
            ("/home/www/f", false),
            ("/closed/f", false),
            ("<ino 42>", false),
        ] {
            assert_eq!(a.shows(path), to_users, "{path} to uid 1000");
            assert_eq!(b.shows(path), to_users, "{path} to uid 1001");
            assert!(r.shows(path), "{path} to root");
        }
        assert!(a.shows("/granted/f"), "the ACL grants uid 1000");
        assert!(!b.shows("/granted/f"), "but not uid 1001");
    }
}

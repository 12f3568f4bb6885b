//! Extended attributes of [`Core`]: the virtual `user.leasefs.*` ones, the
//! limits every inode's stored attributes keep to, and POSIX ACLs, whose
//! rules (see `acl`) keep the mode and the ACL of an inode consistent.

use std::cell::OnceCell;

use super::acl::{self, Acl};
use super::core::{Caller, Core};
use super::privs;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::meta::{AttrChange, Inode, Kind, ROOT_INO, Xattr, XattrEdit, XattrLimits};

pub const XATTR_LEASE: &str = "user.leasefs.lease";
pub const XATTR_EPOCH: &str = "user.leasefs.epoch";
pub const XATTR_STREAM: &str = "user.leasefs.stream";
pub const XATTR_DATA: &str = "user.leasefs.data";
/// On the mount root: the soft limit in milliseconds, so clients that renew
/// their own leases (spout, elect) can pick a safe renewal interval.
pub const XATTR_SOFT_LIMIT: &str = "user.leasefs.soft_limit_ms";
/// On the mount root: the write buffer shared by all streams (bytes
/// allowed, in use, peak, and how often a writer waited for it).
pub const XATTR_WRITE_BUFFER: &str = "user.leasefs.write_buffer";
/// On the mount root: the abstract socket name of the daemon's control
/// service, for users who cannot reach `DATA/control.sock`.
pub const XATTR_CONTROL: &str = "user.leasefs.control";

/// The largest value (the kernel's `XATTR_SIZE_MAX`, as XFS allows).
pub const VALUE_MAX: usize = 64 * 1024;
/// What one inode may hold: names and values together, and its list of
/// names (the kernel's `XATTR_LIST_MAX`, beyond which `listxattr` fails).
pub const LIMITS: XattrLimits = XattrLimits {
    total: 256 * 1024,
    names: 64 * 1024,
};

/// Whether a viewer of uid `viewer` is shown a lease holder's pid and
/// process name: root, and the holder's own user (`holder`: the uid that
/// opened the file, unknown for a holder on another daemon). The one rule
/// for `user.leasefs.lease`, `leasefs leases` and `fsck`: what a user
/// could not learn from `/proc` (whose `fd` links only the owner and root
/// may read) is not told here either.
pub fn holder_shown(viewer: u32, holder: Option<u32>) -> bool {
    viewer == 0 || holder == Some(viewer)
}

fn is_virtual(name: &[u8]) -> bool {
    name.starts_with(b"user.leasefs.")
}

impl Core {
    /// An attribute of `ino` as `caller` may see it (the lease's holder
    /// only as [`holder_shown`] allows).
    pub fn getxattr(&self, ino: u64, name: &[u8], caller: Caller) -> FsResult<Vec<u8>> {
        match std::str::from_utf8(name).unwrap_or("") {
            XATTR_LEASE => self.lease_json(ino, caller),
            XATTR_EPOCH => Ok(self.last_epoch(ino)?.to_string().into_bytes()),
            XATTR_STREAM => self
                .stream_stats_json(ino)
                .map(String::into_bytes)
                .ok_or(FsError::NoXattr),
            XATTR_DATA if ino == ROOT_INO => {
                Ok(self.data_dir.to_string_lossy().into_owned().into_bytes())
            }
            XATTR_SOFT_LIMIT if ino == ROOT_INO => {
                Ok(self.opts.soft_limit.as_millis().to_string().into_bytes())
            }
            XATTR_WRITE_BUFFER if ino == ROOT_INO => Ok(self.write_buffer_json()),
            XATTR_CONTROL if ino == ROOT_INO => self
                .control_address
                .get()
                .map(|n| n.as_bytes().to_vec())
                .ok_or(FsError::NoXattr),
            _ => self.meta().getxattr(ino, name),
        }
    }

    /// `user.leasefs.write_buffer`: the write buffer's use, in bytes.
    fn write_buffer_json(&self) -> Vec<u8> {
        let st = self.ctx.budget.stats();
        let p = self.ctx.packet_size as u64;
        serde_json::json!({
            "bytes": st.units as u64 * p,
            "used": st.used as u64 * p,
            "peak": st.peak as u64 * p,
            "waits": st.waits,
            "waiting": st.waiting,
        })
        .to_string()
        .into_bytes()
    }

    /// `user.leasefs.lease`: the lease as one line of JSON; `holder` and
    /// `comm` are `null` unless [`holder_shown`] to `caller`.
    fn lease_json(&self, ino: u64, caller: Caller) -> FsResult<Vec<u8>> {
        let mut info = self.leases.info(ino);
        info.epoch = self.last_epoch(ino)?;
        let holder_uid = info
            .handle
            .and_then(|fh| self.handles().get(fh).ok().map(|h| h.uid));
        let shown = holder_shown(caller.uid, holder_uid);
        if !shown {
            info.holder = None;
            info.comm = None;
        }
        let free = info.state == crate::lease::LeaseState::Free;
        let mut v = serde_json::to_value(&info).map_err(|e| FsError::Io(e.to_string()))?;
        // Free here, but maybe held on another daemon of the namespace:
        // shown with the daemon that holds it.
        let remote = match &self.cluster {
            Some(cl) if free => cl.remote_holder(ino),
            _ => None,
        };
        if let Some(o) = v.as_object_mut() {
            o.remove("file");
            if let Some(c) = remote {
                // Its user is not known here: only root sees who.
                let shown = holder_shown(caller.uid, None);
                o.insert("state".into(), "held".into());
                o.insert(
                    "holder".into(),
                    shown.then(|| format!("{}:{}", c.host, c.pid)).into(),
                );
                o.insert("comm".into(), shown.then_some(c.comm).into());
                o.insert("opened_wall_ms".into(), c.since_ms.into());
                o.insert("daemon".into(), c.mount_id.into());
            }
        }
        Ok(v.to_string().into_bytes())
    }

    /// Stores an attribute within [`LIMITS`]; ACLs go through their rules.
    pub fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        caller: Caller,
    ) -> FsResult<()> {
        self.may_change(caller)?;
        if is_virtual(name) {
            return Err(FsError::NotPermitted(
                "user.leasefs.* attributes are read-only",
            ));
        }
        if value.len() > VALUE_MAX {
            return Err(FsError::XattrTooBig {
                len: value.len(),
                max: VALUE_MAX,
            });
        }
        if name == acl::ACCESS || name == acl::DEFAULT {
            return self.set_acl(ino, name, Acl::parse(value)?, caller);
        }
        let (create, replace) = (
            flags & libc::XATTR_CREATE != 0,
            flags & libc::XATTR_REPLACE != 0,
        );
        self.meta()
            .update_xattrs(
                ino,
                &[name],
                LIMITS,
                &mut |_, cur| match (&cur[0], create, replace) {
                    (Some(_), true, _) => Err(FsError::Exists),
                    (None, _, true) => Err(FsError::NoXattr),
                    _ => Ok(XattrEdit {
                        set: vec![(name.to_vec(), Some(value.to_vec()))],
                        attrs: None,
                    }),
                },
            )?;
        if name == privs::CAPABILITY {
            self.handles.note_caps(ino);
        }
        Ok(())
    }

    /// Sets (or with `None` removes) an ACL. An access ACL sets the mode's
    /// permission bits and is stored only when it says more than they can;
    /// setting it clears setgid for a caller outside the file's group
    /// without CAP_FSETID (the kernel's `posix_acl_update_mode`).
    fn set_acl(&self, ino: u64, name: &[u8], a: Option<Acl>, caller: Caller) -> FsResult<()> {
        let access = name == acl::ACCESS;
        let creds = OnceCell::new();
        let i = self
            .meta()
            .update_xattrs(ino, &[name], LIMITS, &mut |i, cur| {
                let mut edit = XattrEdit::default();
                if !access && i.kind != Kind::Dir {
                    return match a {
                        Some(_) => Err(FsError::Access),
                        None => Ok(edit),
                    };
                }
                let store = match &a {
                    Some(a) if access => {
                        let (perm, equiv) = a.equiv_mode();
                        let mut mode = (i.mode & !0o777) | perm;
                        if mode & libc::S_ISGID != 0 {
                            let c = creds.get_or_init(|| proc_info::creds(caller.pid));
                            if !c.in_group(i.gid) && !c.cap_fsetid {
                                mode &= !libc::S_ISGID;
                            }
                        }
                        edit.attrs = Some(AttrChange {
                            mode: Some(mode),
                            ..AttrChange::default()
                        });
                        (!equiv).then(|| a.to_bytes())
                    }
                    Some(a) => Some(a.to_bytes()),
                    None => None,
                };
                match store {
                    Some(v) => edit.set.push((name.to_vec(), Some(v))),
                    None if cur[0].is_some() => edit.set.push((name.to_vec(), None)),
                    None => {}
                }
                Ok(edit)
            })?;
        if access {
            self.handles.note_privs(ino, privs::mode_bits(&i), true);
        }
        Ok(())
    }

    /// The stored attributes. The virtual ones are read by name only: a
    /// copy that keeps attributes (`cp -a`, `rsync -X`) must neither carry
    /// a lease's state to another file nor try to remove it here.
    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        self.meta().listxattr(ino)
    }

    /// Removes an attribute; removing an ACL that is not stored succeeds,
    /// as on ext4 (the mode alone is then the ACL).
    pub fn removexattr(&self, ino: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        if is_virtual(name) {
            return Err(FsError::NotPermitted(
                "user.leasefs.* attributes are read-only",
            ));
        }
        if name == acl::ACCESS || name == acl::DEFAULT {
            return self.set_acl(ino, name, None, caller);
        }
        let i = self
            .meta()
            .update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
                if cur[0].is_none() {
                    return Err(FsError::NoXattr);
                }
                Ok(XattrEdit {
                    set: vec![(name.to_vec(), None)],
                    attrs: None,
                })
            })?;
        if name == privs::CAPABILITY {
            self.handles.note_privs(ino, privs::mode_bits(&i), false);
        }
        Ok(())
    }

    /// Commits attribute changes; a mode change also rewrites the access
    /// ACL's owner, mask (or group) and other entries, in the same step.
    pub(super) fn commit_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode> {
        let Some(mode) = ch.mode else {
            return self.meta().set_attrs(ino, ch);
        };
        let i =
            self.meta()
                .update_xattrs(ino, &[acl::ACCESS], XattrLimits::NONE, &mut |_, cur| {
                    let mut edit = XattrEdit {
                        set: Vec::new(),
                        attrs: Some(ch.clone()),
                    };
                    // A stored value is valid (it was checked when set); one
                    // that is not is left for `setfacl` to replace.
                    if let Some(Ok(Some(mut a))) = cur[0].as_deref().map(Acl::parse) {
                        a.chmod(mode);
                        edit.set.push((acl::ACCESS.to_vec(), Some(a.to_bytes())));
                    }
                    Ok(edit)
                })?;
        self.handles.note_privs(ino, privs::mode_bits(&i), true);
        Ok(i)
    }

    /// The permission bits and the ACLs of a node created in `dir` with
    /// `mode`: a default ACL of the directory is inherited (a new
    /// directory keeps it as its own default too) and the umask ignored;
    /// without one the umask applies. Symlinks take neither.
    pub(super) fn new_node_acls(
        &self,
        dir_default: Option<&[u8]>,
        kind: Kind,
        mode: u32,
        umask: u32,
    ) -> FsResult<(u32, Vec<Xattr>)> {
        if kind == Kind::Symlink {
            return Ok((mode, Vec::new()));
        }
        let default = dir_default.and_then(|v| Acl::parse(v).ok().flatten());
        let Some(default) = default else {
            return Ok((mode & !(umask & 0o777), Vec::new()));
        };
        let (mode, access) = default.inherit(mode);
        let mut xattrs = Vec::new();
        if let Some(a) = access {
            xattrs.push((acl::ACCESS.to_vec(), a.to_bytes()));
        }
        if kind == Kind::Dir {
            xattrs.push((acl::DEFAULT.to_vec(), default.to_bytes()));
        }
        Ok((mode, xattrs))
    }
}

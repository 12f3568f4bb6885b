//! Privileges a regular file loses when its data changes, as on ext4 (the
//! kernel's `file_remove_privs` and `setattr_should_drop_suidgid`): a
//! write or truncation by a caller without CAP_FSETID clears setuid, and
//! setgid where it makes a program setgid (group execute set) or where the
//! caller is not in the file's group; file capabilities
//! (`security.capability`) go with any write or truncation. With
//! `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves all of this to the daemon.
//! See docs/SEMANTICS.md, "Setuid, setgid and capabilities".

use std::cell::OnceCell;

use super::core::{Caller, Core, Reply};
use super::handles::Handle;
use super::proc_info;
use crate::error::FsResult;
use crate::meta::{AttrChange, Inode, Kind, XattrEdit, XattrLimits};
use crate::sync::{Arc, Ordering};

pub const CAPABILITY: &[u8] = b"security.capability";

/// `OpenFile::privs` bits: the mode has setuid or setgid ...
pub const MODE: u8 = 1;
/// ... the file has capabilities.
pub const CAPS: u8 = 2;

/// Whether a change may clear setuid and setgid: the kernel tells for
/// writes (`FUSE_WRITE_KILL_SUIDGID`); for truncations fuser drops its
/// flag, so the daemon asks the caller's capabilities itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    Yes,
    No,
    UnlessCapFsetid,
}

/// The mode a regular file keeps after a data change by a caller without
/// CAP_FSETID. Setgid without group execute marks mandatory locking, not a
/// setgid program: it stays for members of the file's group.
pub fn killed_mode(mode: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group()) {
        m &= !libc::S_ISGID;
    }
    m
}

/// The `OpenFile::privs` bits of a file with this mode.
pub fn mode_bits(i: &Inode) -> u8 {
    if i.kind == Kind::File && i.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        MODE
    } else {
        0
    }
}

/// The `OpenFile::privs` bits a writer opening `i` starts from
/// (`has_caps`: the file has `security.capability`).
pub fn at_open(i: &Inode, has_caps: bool) -> u8 {
    mode_bits(i) | if has_caps { CAPS } else { 0 }
}

impl Core {
    /// Records what a writer of `ino` must drop, if the file is open here.
    pub(super) fn note_privs(&self, ino: u64, bits: u8, keep_caps: bool) {
        if let Some(f) = self.files.get(&ino) {
            let caps = if keep_caps {
                f.privs.load(Ordering::Relaxed) & CAPS
            } else {
                0
            };
            f.privs.store(bits | caps, Ordering::Relaxed);
        }
    }

    /// Whether a write with the kernel's kill flag `kill` must first drop
    /// privileges (cheap: what the daemon already knows of the file).
    pub(super) fn privs_to_drop(&self, ino: u64, kill: bool) -> bool {
        self.files.get(&ino).is_some_and(|f| {
            let p = f.privs.load(Ordering::Relaxed);
            p & CAPS != 0 || (kill && p & MODE != 0)
        })
    }

    /// The write of `Core::write` once privileges are dropped. The drop
    /// is a metadata commit: on the request thread only when it is local.
    pub(super) fn drop_privs_then_write(
        self: &Arc<Self>,
        h: Arc<Handle>,
        offset: u64,
        data: &[u8],
        (caller, kill_suidgid): (Caller, bool),
        reply: Reply<u32>,
    ) {
        let kill = if kill_suidgid { Kill::Yes } else { Kill::No };
        if self.cluster.is_some() {
            let (me, data) = (self.clone(), data.to_vec());
            self.ctx
                .rt
                .spawn_blocking(move || match me.drop_privs(h.ino, caller, kill) {
                    Ok(()) => me.write_checked(&h, offset, &data, reply),
                    Err(e) => reply(Err(e)),
                });
            return;
        }
        match self.drop_privs(h.ino, caller, kill) {
            Ok(()) => self.write_checked(&h, offset, data, reply),
            Err(e) => reply(Err(e)),
        }
    }

    /// Drops what a data change of `ino` by `caller` removes, in one
    /// metadata step.
    pub(super) fn drop_privs(&self, ino: u64, caller: Caller, kill: Kill) -> FsResult<()> {
        let creds = OnceCell::new();
        let creds = || creds.get_or_init(|| proc_info::creds(caller.pid)).clone();
        let i = self
            .meta
            .update_xattrs(ino, &[CAPABILITY], XattrLimits::NONE, &mut |i, cur| {
                let mut edit = XattrEdit::default();
                if cur[0].is_some() {
                    edit.set.push((CAPABILITY.to_vec(), None));
                }
                if mode_bits(i) != 0 {
                    let kill = match kill {
                        Kill::Yes => true,
                        Kill::No => false,
                        Kill::UnlessCapFsetid => !creds().cap_fsetid,
                    };
                    let m = killed_mode(i.mode, || creds().in_group(i.gid));
                    if kill && m != i.mode {
                        edit.attrs = Some(AttrChange {
                            mode: Some(m),
                            ..AttrChange::default()
                        });
                    }
                }
                Ok(edit)
            })?;
        self.note_privs(ino, mode_bits(&i), false);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_goes() {
        assert_eq!(killed_mode(0o4755, || true), 0o755);
        assert_eq!(killed_mode(0o4700, || false), 0o700);
    }

    #[test]
    fn setgid_of_a_program_goes() {
        assert_eq!(killed_mode(0o6775, || true), 0o775);
        assert_eq!(killed_mode(0o2710, || true), 0o710);
    }

    #[test]
    fn setgid_without_group_execute_stays_for_group_members_only() {
        assert_eq!(killed_mode(0o2664, || true), 0o2664);
        assert_eq!(killed_mode(0o2664, || false), 0o664);
        assert_eq!(killed_mode(0o6644, || true), 0o2644);
    }

    #[test]
    fn other_bits_are_untouched() {
        assert_eq!(killed_mode(0o1777, || false), 0o1777);
        assert_eq!(killed_mode(0o644, || false), 0o644);
    }
}

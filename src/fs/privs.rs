//! Privileges a regular file loses when its data changes, as on ext4 (the
//! kernel's `file_remove_privs` and `setattr_should_drop_suidgid`): a
//! write or truncation by a caller without CAP_FSETID clears setuid, and
//! setgid where it makes a program setgid (group execute set) or where the
//! caller is not in the file's group; file capabilities
//! (`security.capability`) go with any write or truncation. With
//! `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves all of this to the daemon.
//! See docs/SEMANTICS.md, "Setuid, setgid and capabilities".

use std::cell::OnceCell;

use super::proc_info;
use super::request::Caller;
use crate::error::FsResult;
use crate::meta::{AttrChange, Inode, Kind, Meta, XattrEdit, XattrLimits};

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

/// Drops what a data change of `ino` by `caller` removes, in one
/// metadata step; returns the inode after it, and whether its mode
/// changed (setuid or setgid cleared).
pub fn drop(meta: &dyn Meta, ino: u64, caller: Caller, kill: Kill) -> FsResult<(Inode, bool)> {
    let mode_changed = std::cell::Cell::new(false);
    let creds = OnceCell::new();
    let creds = || creds.get_or_init(|| proc_info::creds(caller.pid)).clone();
    meta.update_xattrs(ino, &[CAPABILITY], XattrLimits::NONE, &mut |i, cur| {
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
            mode_changed.set(kill && m != i.mode);
            if kill && m != i.mode {
                edit.attrs = Some(AttrChange {
                    mode: Some(m),
                    ..AttrChange::default()
                });
            }
        }
        Ok(edit)
    })
    .map(|i| (i, mode_changed.get()))
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

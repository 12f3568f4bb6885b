//! Which directories the daemon keeps replicas and its state in: only
//! those no other user can change. The daemon usually runs as root, and a
//! user who could rename or replace an entry of a datanode directory
//! (`rbw/` made a symbolic link to `/etc/cron.d`) would have root create,
//! write or delete files of their choosing.
//!
//! The rule, as OpenSSH's `StrictModes` checks a home directory and HDFS
//! `dfs.datanode.data.dir.perm` a data directory: the directory itself
//! must be owned by the daemon's user and writable by no one else (no
//! group or other write bit); every directory above it, up to `/`, must be
//! owned by root or the daemon's user, and writable by no one else unless
//! it is sticky (`/tmp`): in a sticky directory another user cannot rename
//! or remove an entry they do not own, and the entry below it is checked
//! to be root's or the daemon's. The walk opens each component relative
//! to its parent with `O_NOFOLLOW`, so what is checked is what is opened:
//! a symbolic link anywhere in the path is refused (give the path it
//! points to; the CLI resolves the paths it is given before the check).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use super::error::StorageError;

/// Flags of a directory opened to be trusted: never through a symbolic
/// link, never inherited by a child process.
pub(crate) const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Mode of the directories leasefs creates for replicas (HDFS's default
/// `dfs.datanode.data.dir.perm`): replica files are the filesystem's
/// contents, which only the daemon may read.
pub const DATANODE_DIR_MODE: u32 = 0o700;

/// Creates the directory `d` and its missing parents with mode 0700 (as
/// HDFS creates its data directories): replica files are every user's
/// file contents. What was created is checked when it is opened.
pub fn create_private_dirs(d: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATANODE_DIR_MODE)
        .create(d)
}

/// Opens the directory `path` after checking that no user other than the
/// daemon's (and root) can change it or any directory above it (see the
/// module doc); the descriptor is the directory checked.
pub fn open_trusted_dir(path: &Path) -> Result<OwnedFd, StorageError> {
    let euid = nix::unistd::geteuid().as_raw();
    let path = std::path::absolute(path).map_err(|e| StorageError::io(path, e))?;
    let errno = |at: &Path, e: Errno| StorageError::io(at, std::io::Error::from(e));
    let mut fd = open("/", DIR_FLAGS, Mode::empty()).map_err(|e| errno(Path::new("/"), e))?;
    let mut at = PathBuf::from("/");
    let comps: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::RootDir | Component::CurDir => None,
            Component::ParentDir | Component::Prefix(_) => Some(Err(())),
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| untrusted(&path, "a path with '..' (give the resolved path)".into()))?;
    let last = comps.len();
    check(
        &at,
        &fstat(&fd).map_err(|e| errno(&at, e))?,
        euid,
        last == 0,
    )?;
    for (i, name) in comps.into_iter().enumerate() {
        at.push(name);
        let Some((next, st)) = open_child(&fd, name, &at)? else {
            return Err(errno(&at, Errno::ENOENT));
        };
        check(&at, &st, euid, i + 1 == last)?;
        fd = next;
    }
    Ok(fd)
}

/// Opens the directory `name` in `parent` (`at` names it), never through
/// a symbolic link, with its status; `None` when it does not exist. A
/// link is refused (`Untrusted`); anything else but a directory is an
/// I/O error (`ENOTDIR`).
pub(crate) fn open_child(
    parent: &OwnedFd,
    name: &OsStr,
    at: &Path,
) -> Result<Option<(OwnedFd, FileStat)>, StorageError> {
    let errno = |e: Errno| StorageError::io(at, std::io::Error::from(e));
    match openat(parent, name.as_bytes(), DIR_FLAGS, Mode::empty()) {
        Ok(fd) => {
            let st = fstat(&fd).map_err(errno)?;
            Ok(Some((fd, st)))
        }
        Err(Errno::ENOENT) => Ok(None),
        // O_NOFOLLOW with O_DIRECTORY: ELOOP or ENOTDIR for a link; a
        // file in place of a directory is an I/O error (a failed disk).
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
            let st = fstatat(parent, name.as_bytes(), AtFlags::AT_SYMLINK_NOFOLLOW);
            if st.is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) {
                Err(untrusted(
                    at,
                    "a symbolic link (give the path it points to)".into(),
                ))
            } else {
                Err(errno(e))
            }
        }
        Err(e) => Err(errno(e)),
    }
}

/// Checks one directory of the walk: `own` for the directory itself (the
/// daemon's, writable by no one else), else a directory above it.
fn check(at: &Path, st: &FileStat, euid: u32, own: bool) -> Result<(), StorageError> {
    let mode = st.st_mode & 0o7777;
    if own {
        if st.st_uid != euid {
            return Err(untrusted(
                at,
                format!(
                    "owned by uid {}, not by the daemon's user (uid {euid})",
                    st.st_uid
                ),
            ));
        }
        if mode & 0o022 != 0 {
            return Err(untrusted(
                at,
                format!("mode {mode:04o} lets other users change it (chmod go-w)"),
            ));
        }
        return Ok(());
    }
    check_dir_stat(at, st, euid)
}

/// A directory above a trusted one, or inside one (`rbw/`): root's or the
/// daemon's, and writable by no one else unless sticky.
pub(crate) fn check_dir_stat(at: &Path, st: &FileStat, euid: u32) -> Result<(), StorageError> {
    let mode = st.st_mode & 0o7777;
    if st.st_uid != 0 && st.st_uid != euid {
        return Err(untrusted(
            at,
            format!(
                "owned by uid {}, neither root nor the daemon's user (uid {euid})",
                st.st_uid
            ),
        ));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(untrusted(
            at,
            format!("mode {mode:04o} lets other users replace what is in it (chmod go-w)"),
        ));
    }
    Ok(())
}

fn untrusted(path: &Path, why: String) -> StorageError {
    StorageError::Untrusted {
        path: path.to_path_buf(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_directory_others_can_change_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dir.path().join("a/dn");
        std::fs::create_dir_all(&dn).unwrap();
        chmod(&dn, 0o700);
        open_trusted_dir(&dn).unwrap();
        // Writable by others: the directory itself, or one above it.
        chmod(&dn, 0o770);
        let e = open_trusted_dir(&dn).unwrap_err().to_string();
        assert!(e.contains("mode 0770") && e.contains("a/dn"), "{e}");
        chmod(&dn, 0o755);
        chmod(dn.parent().unwrap(), 0o777);
        let e = open_trusted_dir(&dn).unwrap_err().to_string();
        assert!(e.contains("mode 0777"), "{e}");
        // Sticky above is fine (as /tmp is).
        chmod(dn.parent().unwrap(), 0o1777);
        open_trusted_dir(&dn).unwrap();
        // A symbolic link in the path is refused.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("a"), &link).unwrap();
        let e = open_trusted_dir(&link.join("dn")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        if nix::unistd::geteuid().is_root() {
            // Owned by another user: refused, however its mode.
            nix::unistd::chown(&dn, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = open_trusted_dir(&dn).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
    }
}

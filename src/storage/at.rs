//! A datanode's directories held open, and every file operation inside
//! them made relative to those descriptors (`openat`, `renameat`,
//! `unlinkat`, `fstatat`) without following a symbolic link: a name in
//! `rbw/` that another user turned into a link is an error, never a way
//! to make the daemon (root) create, write, truncate or delete a file
//! elsewhere. The directories themselves are opened with `O_NOFOLLOW`,
//! from a root checked by [`super::trust`], at attach and again at each
//! heartbeat (which fails, leaving the datanode dead and the descriptors
//! held as they were, when the checks do); replacing `rbw/` in between
//! changes nothing the daemon does. Every name used here is one component (made by
//! [`super::layout`] or read from the directory), so the descriptor and
//! `O_NOFOLLOW` on the last component together cover the whole path.
//!
//! Cost: one system call per operation, as with paths (the kernel walks
//! one component instead of the whole path).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};

use super::error::StorageError;
use super::trust::{DATANODE_DIR_MODE, DIR_FLAGS, check_dir_stat, open_child, open_trusted_dir};
use crate::sync::Arc;

/// The directories of a datanode, as [`Dirs::dir`] indexes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sub {
    Rbw = 0,
    Finalized = 1,
    Tmp = 2,
    Root = 3,
}

impl Sub {
    fn name(self) -> &'static str {
        match self {
            Sub::Rbw => "rbw",
            Sub::Finalized => "finalized",
            Sub::Tmp => "tmp",
            Sub::Root => ".",
        }
    }
}

/// Mode of replica, checksum and temporary files: readable by the daemon
/// only (they are the contents of every user's files).
const FILE_MODE: u32 = 0o600;

fn nix_io(at: &Path, e: Errno) -> StorageError {
    StorageError::io(at, io::Error::from(e))
}

/// A directory held open, with the path errors name it by. Every file
/// operation of the storage module inside a datanode goes through one:
/// names are single components, opened relative to the descriptor with
/// `O_NOFOLLOW`, and directories below are opened the same way and
/// checked (see [`DirFd::child_dir`]).
#[derive(Debug)]
pub(crate) struct DirFd {
    fd: OwnedFd,
    pub path: PathBuf,
}

impl DirFd {
    /// The directory `path`, checked by [`open_trusted_dir`]: no other
    /// user can change it or a directory above it.
    pub fn open_trusted(path: &Path) -> Result<DirFd, StorageError> {
        Ok(DirFd {
            fd: open_trusted_dir(path)?,
            path: path.to_path_buf(),
        })
    }

    fn err(&self, name: &str, e: Errno) -> StorageError {
        nix_io(&self.path.join(name), e)
    }

    /// The directory `name` in this one, created with mode 0700 when
    /// missing and `create`; `None` when missing and not `create`. It is
    /// opened without following a link, and refused (`Untrusted`) when it
    /// is a link, not the daemon's or root's, or writable by anyone else.
    pub fn child_dir(&self, name: &str, create: bool) -> Result<Option<DirFd>, StorageError> {
        let path = self.path.join(name);
        if create {
            match mkdirat(&self.fd, name, Mode::from_bits_truncate(DATANODE_DIR_MODE)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(nix_io(&path, e)),
            }
        }
        let Some((fd, st)) = open_child(&self.fd, name.as_ref(), &path)? else {
            return if create {
                Err(nix_io(&path, Errno::ENOENT))
            } else {
                Ok(None)
            };
        };
        check_dir_stat(&path, &st, nix::unistd::geteuid().as_raw())?;
        if st.st_mode & 0o022 != 0 {
            return Err(StorageError::Untrusted {
                why: format!(
                    "mode {:04o} lets other users change it (chmod go-w)",
                    st.st_mode & 0o7777
                ),
                path,
            });
        }
        Ok(Some(DirFd { fd, path }))
    }

    /// Creates the directory `name` (mode 0700); `false` when the name
    /// exists already.
    pub fn mkdir_new(&self, name: &str) -> Result<bool, StorageError> {
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(DATANODE_DIR_MODE)) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(self.err(name, e)),
        }
    }

    /// `fsync` of the directory, making entries created, renamed or
    /// removed in it durable.
    pub fn fsync(&self) -> Result<(), StorageError> {
        nix::unistd::fsync(&self.fd).map_err(|e| nix_io(&self.path, e))
    }

    /// Device and inode.
    fn inode(&self) -> Result<(u64, u64), StorageError> {
        let st = fstat(&self.fd).map_err(|e| nix_io(&self.path, e))?;
        Ok((st.st_dev, st.st_ino))
    }

    /// The file `name`, opened with `flags` (never through a link; mode
    /// 0600 when created).
    pub fn open_file(&self, name: &str, flags: OFlag) -> Result<File, Errno> {
        openat(
            &self.fd,
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(FILE_MODE),
        )
        .map(File::from)
    }

    /// The text of the small file `name` (an identity file, a flush
    /// mark), or `None` if there is none.
    pub fn read_text(&self, name: &str) -> Result<Option<String>, StorageError> {
        let path = self.path.join(name);
        let mut file = match self.open_file(name, OFlag::O_RDONLY) {
            Ok(f) => f,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(nix_io(&path, e)),
        };
        let mut text = String::new();
        io::Read::read_to_string(&mut file, &mut text).map_err(|e| StorageError::io(&path, e))?;
        Ok(Some(text))
    }

    /// Writes `bytes` to a new temporary file beside `name` and syncs it;
    /// the caller puts it in place. Returns its name. Nothing is left
    /// behind on failure.
    pub fn write_synced_temp(&self, name: &str, bytes: &[u8]) -> Result<String, StorageError> {
        let tmp = format!(
            ".{name}.{}.{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let written = self
            .open_file(&tmp, flags)
            .map_err(io::Error::from)
            .and_then(|mut f| {
                io::Write::write_all(&mut f, bytes)?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = self.unlink(&tmp);
            return Err(StorageError::io(&self.path.join(&tmp), e));
        }
        Ok(tmp)
    }

    /// Puts `bytes` in place as the file `name`, crash-safely: a temporary
    /// file, synced, renamed over `name`, then the directory synced, so a
    /// crash leaves the old file or the new one.
    pub fn replace_durably(&self, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
        let tmp = self.write_synced_temp(name, bytes)?;
        if let Err(e) = self.rename(&tmp, self, name) {
            let _ = self.unlink(&tmp);
            return Err(nix_io(&self.path.join(name), e));
        }
        self.fsync()
    }

    /// The entry's own status (a link is not followed); `None` if missing.
    pub fn lstat(&self, name: &str) -> Result<Option<FileStat>, StorageError> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err(name, e)),
        }
    }

    /// Removes the entry `name` (a link itself, never what it points to;
    /// not a directory); says whether it was there.
    pub fn unlink(&self, name: &str) -> Result<bool, StorageError> {
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(self.err(name, e)),
        }
    }

    /// Removes `name` whatever it is: a directory with everything in it
    /// (each level opened as [`DirFd::child_dir`] opens it, so nothing
    /// outside is reached), else the entry itself.
    pub fn remove_tree(&self, name: &str) -> Result<(), StorageError> {
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EISDIR) => {}
            Err(e) => return Err(self.err(name, e)),
        }
        if let Some(sub) = self.child_dir(name, false)? {
            for n in sub.names()? {
                sub.remove_tree(&n)?;
            }
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(self.err(name, e)),
        }
    }

    /// Renames the entry `from` here (whatever it is; a rename follows no
    /// link) to `to` in `dir`.
    pub fn rename(&self, from: &str, dir: &DirFd, to: &str) -> Result<(), Errno> {
        renameat(&self.fd, from, &dir.fd, to)
    }

    /// A hard link `to` of the entry `from` (`EEXIST` never replaces).
    pub fn link(&self, from: &str, to: &str) -> Result<(), Errno> {
        linkat(&self.fd, from, &self.fd, to, AtFlags::empty())
    }

    /// The names in the directory (without `.` and `..`; names that are
    /// not UTF-8 are none of the daemon's and left out).
    pub fn names(&self) -> Result<Vec<String>, StorageError> {
        let mut dir = Dir::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| nix_io(&self.path, e))?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| nix_io(&self.path, e))?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if let Ok(name) = name.to_str() {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Free bytes for unprivileged use on the directory's filesystem.
    pub fn free_bytes(&self) -> Result<u64, StorageError> {
        let st = nix::sys::statvfs::fstatvfs(&self.fd).map_err(|e| nix_io(&self.path, e))?;
        Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
    }

    /// Another descriptor of the directory, as a `File`.
    pub fn try_clone_file(&self) -> Result<File, StorageError> {
        self.fd
            .try_clone()
            .map(File::from)
            .map_err(|e| StorageError::io(&self.path, e))
    }
}

/// The directories of one datanode, held open for the life of the mount
/// (or until a heartbeat finds them recreated): its root, `rbw/`,
/// `finalized/` and `tmp/`.
#[derive(Debug)]
pub(crate) struct Dirs {
    dirs: [DirFd; 4],
    /// Device and inode of each: the heartbeat tells a recreated
    /// directory by them.
    pub inodes: [(u64, u64); 4],
}

impl Dirs {
    /// Opens the datanode at `root` (checked by [`open_trusted_dir`]),
    /// creating `rbw/`, `finalized/` and `tmp/` with mode 0700 as needed;
    /// each is opened as [`DirFd::child_dir`] opens it.
    pub fn open(root: &Path) -> Result<Dirs, StorageError> {
        Dirs::open_in(DirFd::open_trusted(root)?)
    }

    /// As [`Dirs::open`], the root already held as `rootd`.
    pub fn open_in(rootd: DirFd) -> Result<Dirs, StorageError> {
        let root = rootd.path.clone();
        let sub = |s: Sub| -> Result<DirFd, StorageError> {
            rootd
                .child_dir(s.name(), true)?
                .ok_or_else(|| nix_io(&root.join(s.name()), Errno::ENOENT))
        };
        let (rbw, fin, tmp) = (sub(Sub::Rbw)?, sub(Sub::Finalized)?, sub(Sub::Tmp)?);
        let dirs = [rbw, fin, tmp, rootd];
        let mut inodes = [(0, 0); 4];
        for (i, d) in dirs.iter().enumerate() {
            inodes[i] = d.inode()?;
        }
        Ok(Dirs { dirs, inodes })
    }

    pub fn dir(&self, s: Sub) -> &DirFd {
        &self.dirs[s as usize]
    }

    /// `fsync` of directory `s`.
    pub fn fsync(&self, s: Sub) -> Result<(), StorageError> {
        self.dir(s).fsync()
    }
}

/// One name in one of a datanode's directories, with the path errors and
/// messages name it by.
#[derive(Debug, Clone)]
pub(crate) struct At {
    pub dirs: Arc<Dirs>,
    pub sub: Sub,
    pub name: String,
    pub path: PathBuf,
}

impl At {
    fn dir(&self) -> &DirFd {
        self.dirs.dir(self.sub)
    }

    fn err(&self, e: Errno) -> StorageError {
        nix_io(&self.path, e)
    }

    fn open(&self, flags: OFlag) -> Result<File, StorageError> {
        self.dir()
            .open_file(&self.name, flags)
            .map_err(|e| self.err(e))
    }

    /// `fsync` of the directory the name is in (its entry made durable).
    pub fn fsync_dir(&self) -> Result<(), StorageError> {
        self.dir().fsync()
    }

    /// The entry's own status (a link is not followed).
    pub fn lstat(&self) -> Result<Option<FileStat>, StorageError> {
        self.dir().lstat(&self.name)
    }

    /// Whether the name exists (a link counts; nothing is followed).
    pub fn exists(&self) -> Result<bool, StorageError> {
        self.lstat().map(|s| s.is_some())
    }

    /// Length of the regular file; a missing one or anything else (a
    /// link) is an error.
    pub fn stat_len(&self) -> Result<u64, StorageError> {
        match self.lstat()? {
            Some(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG => {
                Ok(st.st_size as u64)
            }
            Some(_) => Err(self.err(Errno::ELOOP)),
            None => Err(self.err(Errno::ENOENT)),
        }
    }

    pub fn open_read(&self) -> Result<File, StorageError> {
        self.open(OFlag::O_RDONLY)
    }

    /// As [`At::open_read`], `None` when the name does not exist.
    pub fn open_read_if_exists(&self) -> Result<Option<File>, StorageError> {
        match self.dir().open_file(&self.name, OFlag::O_RDONLY) {
            Ok(f) => Ok(Some(f)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    pub fn open_rw(&self) -> Result<File, StorageError> {
        self.open(OFlag::O_RDWR)
    }

    /// A new file; `EEXIST` if the name exists (whatever it is).
    pub fn create_new(&self) -> io::Result<File> {
        self.dir()
            .open_file(&self.name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL)
            .map_err(io::Error::from)
    }

    /// The file, created if missing, emptied when `truncate`.
    pub fn create(&self, truncate: bool) -> Result<File, StorageError> {
        let t = if truncate {
            OFlag::O_TRUNC
        } else {
            OFlag::empty()
        };
        self.open(OFlag::O_WRONLY | OFlag::O_CREAT | t)
    }

    /// Removes the name if it exists (a link itself, never what it points
    /// to); says whether it did.
    pub fn remove_found(&self) -> Result<bool, StorageError> {
        self.dir().unlink(&self.name)
    }

    pub fn remove_if_exists(&self) -> Result<(), StorageError> {
        self.remove_found().map(drop)
    }

    /// Renames the entry (whatever it is; a rename follows no link) to
    /// `to`, in the same datanode.
    pub fn rename_to(&self, to: &At) -> Result<(), StorageError> {
        self.try_rename_to(to).map_err(|e| self.err(e))
    }

    pub fn try_rename_to(&self, to: &At) -> Result<(), Errno> {
        self.dir().rename(&self.name, to.dir(), &to.name)
    }

    /// Renames the entry into `dir` (under the same name).
    pub fn move_into(&self, dir: &DirFd) -> Result<(), StorageError> {
        self.dir()
            .rename(&self.name, dir, &self.name)
            .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn at(dirs: &Arc<Dirs>, sub: Sub, name: &str) -> At {
        At {
            dirs: dirs.clone(),
            sub,
            name: name.into(),
            path: PathBuf::from(name),
        }
    }

    /// A name that is a link to a file elsewhere is neither read, written,
    /// truncated nor created through; removing it removes the link.
    #[test]
    fn a_link_in_place_of_a_file_is_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("dn");
        std::fs::create_dir(&root).unwrap();
        let dirs = Arc::new(Dirs::open(&root).unwrap());
        let outside = t.path().join("secret");
        std::fs::write(&outside, b"root's").unwrap();
        symlink(&outside, root.join("rbw/blk_1")).unwrap();
        let a = at(&dirs, Sub::Rbw, "blk_1");
        assert!(a.open_read().is_err());
        assert!(a.open_rw().is_err());
        assert!(a.create(true).is_err());
        assert!(a.create_new().is_err());
        assert!(a.stat_len().is_err());
        assert!(
            Dirs::open(&root).is_ok(),
            "a link to a file is a file's matter"
        );
        assert!(a.remove_found().unwrap());
        assert_eq!(std::fs::read(&outside).unwrap(), b"root's");
    }

    /// The directories are held: `rbw/` renamed away and replaced by a
    /// link after they were opened changes nothing the daemon does, and
    /// opening them again refuses the link.
    #[test]
    fn held_directories_outlive_a_swap_and_a_link_is_refused_on_open() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("dn");
        std::fs::create_dir(&root).unwrap();
        let dirs = Arc::new(Dirs::open(&root).unwrap());
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::rename(root.join("rbw"), root.join("rbw.x")).unwrap();
        symlink(&elsewhere, root.join("rbw")).unwrap();
        at(&dirs, Sub::Rbw, "blk_2").create_new().unwrap();
        assert!(root.join("rbw.x/blk_2").exists());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        let e = Dirs::open(&root).unwrap_err().to_string();
        assert!(e.contains("rbw refused: a symbolic link"), "{e}");
        // A directory in it that others may write is refused too.
        std::fs::remove_file(root.join("rbw")).unwrap();
        std::fs::rename(root.join("rbw.x"), root.join("rbw")).unwrap();
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Dirs::open(&root).unwrap_err().to_string();
        assert!(e.contains("tmp refused: mode 0777"), "{e}");
    }

    /// Removing a tree goes through descriptors: a link inside goes, what
    /// it points to stays.
    #[test]
    fn remove_tree_removes_links_not_their_targets() {
        let t = tempfile::tempdir().unwrap();
        let root = DirFd::open_trusted(t.path()).unwrap();
        let q = root.child_dir("q", true).unwrap().unwrap();
        assert!(q.mkdir_new("e").unwrap());
        assert!(!q.mkdir_new("e").unwrap());
        let keep = t.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("f"), b"x").unwrap();
        symlink(&keep, t.path().join("q/e/link")).unwrap();
        std::fs::write(t.path().join("q/e/file"), b"y").unwrap();
        q.remove_tree("e").unwrap();
        assert!(!t.path().join("q/e").exists());
        assert!(keep.join("f").exists());
    }
}

//! What a power cut loses, and how to lose it.
//!
//! Every change reaches the backing directory at once, so that while the
//! filesystem runs it behaves exactly like a passthrough (SQLite's WAL,
//! its shared-memory file and fcntl locks included). Alongside, the journal
//! keeps what undoes each change that is not durable yet:
//!
//! - **Namespace changes** (create, mkdir, mknod, symlink, link, unlink,
//!   rmdir, rename) are kept in order, as a journaling filesystem's log.
//!   An fsync of a directory makes durable every change up to the last one
//!   that touched that directory (the log is committed as a prefix, as
//!   ext4 and XFS commit theirs). A removed file waits in the trash until
//!   its removal is durable.
//! - **File data and size** become durable only by an fsync or fdatasync of
//!   that file (or writes through an `O_SYNC`/`O_DSYNC` descriptor). Before
//!   the first change after a sync, the file's size is noted; before bytes
//!   of that durable size are overwritten or cut off, the old bytes are
//!   saved.
//!
//! [`Journal::cut`] undoes the pending namespace changes newest first and
//! puts back every file's durable bytes and size: the state a power cut
//! leaves. `syncfs(2)` never reaches a FUSE daemon (the kernel sends
//! FUSE_SYNCFS to virtiofs only), so, as on any FUSE filesystem, it makes
//! nothing durable here.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::fcntl::{OFlag, RenameFlags, openat, renameat, renameat2};
use nix::sys::stat::{Mode, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchownat, unlinkat};

/// A backing inode: (device, inode number).
pub type Key = (u64, u64);
/// A backing directory, held open (`O_PATH`) by whoever may still name it.
pub type DirFd = Arc<OwnedFd>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn io_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// How to undo one namespace change.
enum Undo {
    /// A new name (create, mkdir, mknod, symlink, link): removed again.
    Remove {
        dir: DirFd,
        name: OsString,
        is_dir: bool,
    },
    /// A removed file name: moved back from the trash.
    Restore {
        dir: DirFd,
        name: OsString,
        trash: OsString,
        key: Key,
    },
    /// A removed (empty) directory: made again. `was` is the removed
    /// directory's inode, which the undos of earlier changes inside it
    /// name it by (their descriptors are of the removed one).
    Remake {
        dir: DirFd,
        name: OsString,
        was: Key,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// A rename, and the entry it replaced (in the trash).
    Rename {
        from: DirFd,
        from_name: OsString,
        to: DirFd,
        to_name: OsString,
        replaced: Option<Trashed>,
        exchange: bool,
    },
}

/// An entry moved to the trash by a rename over it.
struct Trashed {
    trash: OsString,
    key: Key,
    is_dir: bool,
}

struct Pending {
    /// The directories whose fsync makes this change durable.
    dirs: [Key; 2],
    undo: Undo,
}

#[derive(Default)]
struct Namespace {
    pending: Vec<Pending>,
    /// Links the trash holds to each inode (`stat` subtracts them).
    trash_links: HashMap<Key, u32>,
}

/// A file's durable state while it has unsynced changes.
struct DataUndo {
    /// The file itself, read-write, whatever its name becomes.
    file: File,
    durable_len: u64,
    /// Durable bytes since overwritten or cut off: (offset, bytes).
    saved: Vec<(u64, Vec<u8>)>,
    /// Sorted, disjoint ranges of `saved`.
    covered: Vec<(u64, u64)>,
}

/// A change of a file's data, announced before it is made.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    Write { off: u64, len: u64 },
    SetLen(u64),
}

/// What a cut dropped.
#[derive(Debug, Default)]
pub struct CutReport {
    pub namespace_changes: usize,
    pub files: usize,
    pub bytes_restored: u64,
    /// In a [`Journal::cut`] with a subset: the pending sectors that
    /// survived (their new bytes were kept).
    pub sectors_kept: u64,
    pub errors: Vec<String>,
}

/// The unit a disk writes atomically, for a cut that keeps a random
/// subset of what was pending: a 4 KiB block is whole-old or whole-new.
pub const SECTOR: u64 = 4096;

/// A small deterministic generator (splitmix64): a cut with the same seed
/// over the same pending writes keeps the same subset.
pub struct Subset(u64);

impl Subset {
    pub fn new(seed: u64) -> Subset {
        Subset(seed)
    }

    /// Half of all sectors survive.
    fn keep(&mut self) -> bool {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) & 1 == 1
    }
}

pub struct Journal {
    trash: OwnedFd,
    ns: Mutex<Namespace>,
    data: Mutex<HashMap<Key, Arc<Mutex<Option<DataUndo>>>>>,
    seq: AtomicU64,
}

impl Journal {
    /// `trash`: a directory of the backing filesystem outside the tree the
    /// filesystem shows.
    pub fn new(trash: OwnedFd) -> Journal {
        Journal {
            trash,
            ns: Mutex::default(),
            data: Mutex::default(),
            seq: AtomicU64::new(0),
        }
    }

    fn trash_name(&self, what: &str) -> OsString {
        OsString::from(format!(
            "{what}.{}",
            self.seq.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Runs a change that adds a name (`f` makes it) and records its undo.
    pub fn add_name<T>(
        &self,
        dir_key: Key,
        dir: &DirFd,
        name: &OsStr,
        is_dir: bool,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let mut ns = lock(&self.ns);
        let v = f()?;
        ns.pending.push(Pending {
            dirs: [dir_key, dir_key],
            undo: Undo::Remove {
                dir: dir.clone(),
                name: name.to_owned(),
                is_dir,
            },
        });
        Ok(v)
    }

    /// Removes a file name: moved to the trash until the removal is durable.
    pub fn unlink(&self, dir_key: Key, dir: &DirFd, name: &OsStr) -> io::Result<()> {
        let mut ns = lock(&self.ns);
        let st =
            fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let trash = self.trash_name("unlinked");
        renameat(dir.as_fd(), name, self.trash.as_fd(), trash.as_os_str()).map_err(io_err)?;
        let key = (st.st_dev, st.st_ino);
        *ns.trash_links.entry(key).or_default() += 1;
        ns.pending.push(Pending {
            dirs: [dir_key, dir_key],
            undo: Undo::Restore {
                dir: dir.clone(),
                name: name.to_owned(),
                trash,
                key,
            },
        });
        Ok(())
    }

    /// Removes an empty directory; a cut makes it again.
    pub fn rmdir(&self, dir_key: Key, dir: &DirFd, name: &OsStr) -> io::Result<()> {
        let mut ns = lock(&self.ns);
        let st =
            fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err)?;
        unlinkat(dir.as_fd(), name, UnlinkatFlags::RemoveDir).map_err(io_err)?;
        ns.pending.push(Pending {
            dirs: [dir_key, dir_key],
            undo: Undo::Remake {
                dir: dir.clone(),
                name: name.to_owned(),
                was: (st.st_dev, st.st_ino),
                mode: st.st_mode & 0o7777,
                uid: st.st_uid,
                gid: st.st_gid,
            },
        });
        Ok(())
    }

    /// Renames; an entry it replaces waits in the trash until the rename is
    /// durable.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        from_key: Key,
        from: &DirFd,
        from_name: &OsStr,
        to_key: Key,
        to: &DirFd,
        to_name: &OsStr,
        flags: RenameFlags,
    ) -> io::Result<()> {
        let mut ns = lock(&self.ns);
        let nofollow = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        let src = fstatat(from.as_fd(), from_name, nofollow).map_err(io_err)?;
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let mut replaced = None;
        if exchange {
            renameat2(from.as_fd(), from_name, to.as_fd(), to_name, flags).map_err(io_err)?;
        } else {
            match fstatat(to.as_fd(), to_name, nofollow) {
                Ok(dst) => {
                    if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                        return Err(io::Error::from_raw_os_error(libc::EEXIST));
                    }
                    if (dst.st_dev, dst.st_ino) == (src.st_dev, src.st_ino) {
                        // Two names of one inode: rename does nothing.
                        return Ok(());
                    }
                    let is_dir = |m: u32| m & libc::S_IFMT == libc::S_IFDIR;
                    match (is_dir(src.st_mode), is_dir(dst.st_mode)) {
                        (true, false) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
                        (false, true) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
                        (true, true) if !dir_is_empty(to, to_name)? => {
                            return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
                        }
                        _ => {}
                    }
                    let trash = self.trash_name("replaced");
                    renameat(to.as_fd(), to_name, self.trash.as_fd(), trash.as_os_str())
                        .map_err(io_err)?;
                    if let Err(e) = renameat(from.as_fd(), from_name, to.as_fd(), to_name) {
                        // Put the target back: nothing happened.
                        let _ =
                            renameat(self.trash.as_fd(), trash.as_os_str(), to.as_fd(), to_name);
                        return Err(io_err(e));
                    }
                    let key = (dst.st_dev, dst.st_ino);
                    if !is_dir(dst.st_mode) {
                        *ns.trash_links.entry(key).or_default() += 1;
                    }
                    replaced = Some(Trashed {
                        trash,
                        key,
                        is_dir: is_dir(dst.st_mode),
                    });
                }
                Err(nix::Error::ENOENT) => {
                    renameat2(from.as_fd(), from_name, to.as_fd(), to_name, flags)
                        .map_err(io_err)?;
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        ns.pending.push(Pending {
            dirs: [from_key, to_key],
            undo: Undo::Rename {
                from: from.clone(),
                from_name: from_name.to_owned(),
                to: to.clone(),
                to_name: to_name.to_owned(),
                replaced,
                exchange,
            },
        });
        Ok(())
    }

    /// fsync of a directory: every namespace change up to the last one that
    /// touched it is durable now.
    pub fn sync_dir(&self, dir_key: Key) {
        let mut ns = lock(&self.ns);
        let Some(last) = ns.pending.iter().rposition(|p| p.dirs.contains(&dir_key)) else {
            return;
        };
        let done: Vec<Pending> = ns.pending.drain(..=last).collect();
        for p in done {
            self.forget_trash(&mut ns, p.undo);
        }
    }

    /// A durable removal: the trash lets go of what it kept.
    fn forget_trash(&self, ns: &mut Namespace, undo: Undo) {
        let (trash, key, is_dir) = match undo {
            Undo::Restore { trash, key, .. } => (trash, key, false),
            Undo::Rename {
                replaced: Some(t), ..
            } => (t.trash, t.key, t.is_dir),
            _ => return,
        };
        let flag = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        if let Err(e) = unlinkat(self.trash.as_fd(), trash.as_os_str(), flag) {
            eprintln!("powercut: cannot empty trash entry {trash:?}: {e}");
        }
        if !is_dir && let Some(n) = ns.trash_links.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                ns.trash_links.remove(&key);
            }
        }
    }

    /// Every pending namespace change made durable (a journal commit that
    /// writes back no file data, as a filesystem does on its own timer).
    pub fn commit_namespace(&self) -> usize {
        let mut ns = lock(&self.ns);
        let done: Vec<Pending> = ns.pending.drain(..).collect();
        let n = done.len();
        for p in done {
            self.forget_trash(&mut ns, p.undo);
        }
        n
    }

    /// Links the trash holds to `key` (not shown in `stat`'s link count).
    pub fn trash_links(&self, key: Key) -> u32 {
        lock(&self.ns).trash_links.get(&key).copied().unwrap_or(0)
    }

    /// Runs `f`, which changes the data or size of the file `target` (an
    /// `O_PATH` descriptor of inode `key`), after saving what a cut needs to
    /// put back. Writes to one file are serialised here, so the durable
    /// state noted is never that of a half-made write.
    pub fn modify<R>(
        &self,
        key: Key,
        target: &OwnedFd,
        change: Change,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        let slot = lock(&self.data).entry(key).or_default().clone();
        let mut undo = lock(&slot);
        if undo.is_none() {
            let file = reopen(target, libc::O_RDWR)?;
            let durable_len = file.metadata()?.len();
            *undo = Some(DataUndo {
                file,
                durable_len,
                saved: Vec::new(),
                covered: Vec::new(),
            });
        }
        let u = undo.as_mut().expect("set above");
        match change {
            Change::Write { off, len } => u.save(off, off.saturating_add(len))?,
            Change::SetLen(new) => {
                let cur = u.file.metadata()?.len();
                u.save(new, cur)?
            }
        }
        f()
    }

    /// fsync/fdatasync of a file: its data and size are durable now.
    pub fn sync_file(&self, key: Key) {
        let slot = lock(&self.data).get(&key).cloned();
        if let Some(slot) = slot {
            lock(&slot).take();
        }
    }

    /// (pending namespace changes, files with unsynced data).
    pub fn status(&self) -> (usize, usize) {
        let ops = lock(&self.ns).pending.len();
        let slots: Vec<_> = lock(&self.data).values().cloned().collect();
        let files = slots.iter().filter(|s| lock(s).is_some()).count();
        (ops, files)
    }

    /// The power cut: every pending namespace change undone, newest first,
    /// and every file's durable bytes and size put back. With `subset`, a
    /// random half of the overwritten sectors keep their new bytes instead:
    /// a disk writes back its volatile cache in any order, so at a cut
    /// between two flushes any subset of the writes since the last flush
    /// may have reached the platter (as CrashMonkey and ALICE model it).
    /// Sizes still go back to the durable size: what was appended past it
    /// is lost whole.
    pub fn cut(&self, mut subset: Option<Subset>) -> CutReport {
        let mut r = CutReport::default();
        let mut ns = lock(&self.ns);
        let pending = std::mem::take(&mut ns.pending);
        r.namespace_changes = pending.len();
        let mut remade = HashMap::new();
        for p in pending.into_iter().rev() {
            if let Err(e) = self.undo(p.undo, &mut remade) {
                r.errors.push(e);
            }
        }
        ns.trash_links.clear();
        drop(ns);
        let slots: Vec<_> = lock(&self.data).values().cloned().collect();
        for slot in slots {
            let Some(u) = lock(&slot).take() else {
                continue;
            };
            r.files += 1;
            match u.restore(subset.as_mut(), &mut r.sectors_kept) {
                Ok(n) => r.bytes_restored += n,
                Err(e) => r
                    .errors
                    .push(format!("restoring a file's durable data: {e}")),
            }
        }
        r
    }

    /// Undoes one change. `remade`: directories made again by this cut,
    /// by the inode they had: a change inside one (made before it was
    /// removed, so undone after it is made again) is undone in the new one.
    fn undo(&self, mut undo: Undo, remade: &mut HashMap<Key, DirFd>) -> Result<(), String> {
        let now = |d: &mut DirFd| {
            if let Ok(st) = nix::sys::stat::fstat(d.as_fd())
                && let Some(new) = remade.get(&(st.st_dev, st.st_ino))
            {
                *d = new.clone();
            }
        };
        match &mut undo {
            Undo::Remove { dir, .. } | Undo::Restore { dir, .. } | Undo::Remake { dir, .. } => {
                now(dir)
            }
            Undo::Rename { from, to, .. } => {
                now(from);
                now(to);
            }
        }
        let t = self.trash.as_fd();
        let r = match &undo {
            Undo::Remove { dir, name, is_dir } => {
                let flag = if *is_dir {
                    UnlinkatFlags::RemoveDir
                } else {
                    UnlinkatFlags::NoRemoveDir
                };
                unlinkat(dir.as_fd(), name.as_os_str(), flag)
            }
            Undo::Restore {
                dir, name, trash, ..
            } => renameat(t, trash.as_os_str(), dir.as_fd(), name.as_os_str()),
            Undo::Remake {
                dir,
                name,
                was,
                mode,
                uid,
                gid,
            } => mkdirat(
                dir.as_fd(),
                name.as_os_str(),
                Mode::from_bits_truncate(*mode),
            )
            .and_then(|()| {
                fchownat(
                    dir.as_fd(),
                    name.as_os_str(),
                    Some(Uid::from_raw(*uid)),
                    Some(Gid::from_raw(*gid)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
            })
            .and_then(|()| {
                let fd = openat(
                    dir.as_fd(),
                    name.as_os_str(),
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                remade.insert(*was, Arc::new(fd));
                Ok(())
            }),
            Undo::Rename {
                from,
                from_name,
                to,
                to_name,
                replaced,
                exchange,
            } => {
                let back = if *exchange {
                    renameat2(
                        to.as_fd(),
                        to_name.as_os_str(),
                        from.as_fd(),
                        from_name.as_os_str(),
                        RenameFlags::RENAME_EXCHANGE,
                    )
                } else {
                    renameat(
                        to.as_fd(),
                        to_name.as_os_str(),
                        from.as_fd(),
                        from_name.as_os_str(),
                    )
                };
                back.and_then(|()| match replaced {
                    Some(x) => renameat(t, x.trash.as_os_str(), to.as_fd(), to_name.as_os_str()),
                    None => Ok(()),
                })
            }
        };
        let what = match &undo {
            Undo::Remove { name, .. } => format!("the creation of {}", name.to_string_lossy()),
            Undo::Restore { name, .. } => format!("the removal of {}", name.to_string_lossy()),
            Undo::Remake { name, .. } => {
                format!("the removal of directory {}", name.to_string_lossy())
            }
            Undo::Rename {
                from_name, to_name, ..
            } => format!(
                "the rename of {} to {}",
                from_name.to_string_lossy(),
                to_name.to_string_lossy()
            ),
        };
        r.map_err(|e| format!("undoing {what}: {e}"))
    }
}

impl DataUndo {
    /// Saves the durable bytes of `from..to` not saved yet.
    fn save(&mut self, from: u64, to: u64) -> io::Result<()> {
        let to = to.min(self.durable_len);
        if from >= to {
            return Ok(());
        }
        for (a, b) in uncovered(&self.covered, from, to) {
            let mut buf = vec![0u8; (b - a) as usize];
            let mut got = 0;
            while got < buf.len() {
                match self.file.read_at(&mut buf[got..], a + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            self.saved.push((a, buf));
        }
        insert_range(&mut self.covered, from, to);
        Ok(())
    }

    /// Puts back the durable bytes (with `subset`, of the sectors it does
    /// not keep) and the length; returns the bytes written.
    fn restore(self, mut subset: Option<&mut Subset>, kept: &mut u64) -> io::Result<u64> {
        let mut n = 0;
        for (off, bytes) in &self.saved {
            let end = off + bytes.len() as u64;
            let mut at = *off;
            while at < end {
                let next = ((at / SECTOR + 1) * SECTOR).min(end);
                let piece = &bytes[(at - off) as usize..(next - off) as usize];
                if subset.as_mut().is_some_and(|s| s.keep()) {
                    *kept += 1;
                } else {
                    self.file.write_all_at(piece, at)?;
                    n += piece.len() as u64;
                }
                at = next;
            }
        }
        self.file.set_len(self.durable_len)?;
        Ok(n)
    }
}

/// Opens the inode an `O_PATH` descriptor names, with `flags`.
pub fn reopen(fd: &OwnedFd, flags: i32) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let flags = OFlag::from_bits_truncate(flags | libc::O_CLOEXEC);
    let fd = nix::fcntl::open(path.as_str(), flags, Mode::empty()).map_err(io_err)?;
    Ok(File::from(fd))
}

fn dir_is_empty(parent: &DirFd, name: &OsStr) -> io::Result<bool> {
    let fd = openat(
        parent.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)?;
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(io_err)?;
    for e in dir.iter() {
        let e = e.map_err(io_err)?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The parts of `from..to` not in the sorted, disjoint `ranges`.
fn uncovered(ranges: &[(u64, u64)], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    for &(a, b) in ranges {
        if b <= at {
            continue;
        }
        if a >= to {
            break;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
        if at >= to {
            return out;
        }
    }
    if at < to {
        out.push((at, to));
    }
    out
}

/// Adds `from..to` to the sorted, disjoint `ranges`, merging neighbours.
fn insert_range(ranges: &mut Vec<(u64, u64)>, from: u64, to: u64) {
    let (mut a, mut b) = (from, to);
    ranges.retain(|&(x, y)| {
        if y < a || x > b {
            true
        } else {
            a = a.min(x);
            b = b.max(y);
            false
        }
    });
    let at = ranges.partition_point(|&(x, _)| x < a);
    ranges.insert(at, (a, b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_subtract() {
        let mut r = Vec::new();
        insert_range(&mut r, 10, 20);
        insert_range(&mut r, 30, 40);
        assert_eq!(uncovered(&r, 0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(uncovered(&r, 12, 18), vec![]);
        insert_range(&mut r, 20, 30);
        assert_eq!(r, vec![(10, 40)]);
        assert_eq!(uncovered(&r, 5, 45), vec![(5, 10), (40, 45)]);
    }

    fn dir(p: &std::path::Path) -> DirFd {
        Arc::new(nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap())
    }

    fn key(p: &std::path::Path) -> Key {
        let m = std::fs::metadata(p).unwrap();
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    }

    #[test]
    fn a_cut_drops_unsynced_bytes_and_names_but_keeps_synced_ones() {
        let t = tempfile::tempdir().unwrap();
        let (root, trash) = (t.path().join("root"), t.path().join("trash"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&trash).unwrap();
        let j = Journal::new(Arc::try_unwrap(dir(&trash)).unwrap());
        let (rk, rd) = (key(&root), dir(&root));
        std::fs::write(root.join("old"), b"durable").unwrap();
        // A file created and written, its data synced.
        let f = root.join("new");
        j.add_name(rk, &rd, OsStr::new("new"), false, || {
            std::fs::write(&f, b"")
        })
        .unwrap();
        let pf: OwnedFd = nix::fcntl::open(&f, OFlag::O_PATH, Mode::empty()).unwrap();
        j.modify(key(&f), &pf, Change::Write { off: 0, len: 3 }, || {
            std::fs::write(&f, b"abc")
        })
        .unwrap();
        j.sync_file(key(&f));
        // The old file: overwritten and cut, never synced.
        let o = root.join("old");
        let po: OwnedFd = nix::fcntl::open(&o, OFlag::O_PATH, Mode::empty()).unwrap();
        j.modify(key(&o), &po, Change::SetLen(2), || {
            std::fs::File::options().write(true).open(&o)?.set_len(2)
        })
        .unwrap();
        j.modify(key(&o), &po, Change::Write { off: 2, len: 8 }, || {
            std::fs::File::options()
                .write(true)
                .open(&o)?
                .write_all_at(b"XXXXXXXX", 2)
        })
        .unwrap();
        // A removal made durable, then one that is not.
        std::fs::write(root.join("gone"), b"1").unwrap();
        std::fs::write(root.join("back"), b"2").unwrap();
        j.unlink(rk, &rd, OsStr::new("gone")).unwrap();
        j.sync_dir(rk);
        j.unlink(rk, &rd, OsStr::new("back")).unwrap();
        // Created after the directory's fsync: its name is lost.
        let late = root.join("late");
        j.add_name(rk, &rd, OsStr::new("late"), false, || {
            std::fs::write(&late, b"x")
        })
        .unwrap();
        let r = j.cut(None);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // The directory's fsync made the earlier create durable too (the
        // log is committed as a prefix), and the file's data was synced.
        assert_eq!(std::fs::read(&f).unwrap(), b"abc");
        assert!(!late.exists());
        assert_eq!(std::fs::read(&o).unwrap(), b"durable");
        assert!(!root.join("gone").exists());
        assert_eq!(std::fs::read(root.join("back")).unwrap(), b"2");
        assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0);
    }

    #[test]
    fn a_subset_cut_keeps_whole_sectors_old_or_new_and_the_durable_size() {
        let t = tempfile::tempdir().unwrap();
        let (root, trash) = (t.path().join("root"), t.path().join("trash"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&trash).unwrap();
        let j = Journal::new(Arc::try_unwrap(dir(&trash)).unwrap());
        let sectors = 64u64;
        let img = root.join("img");
        std::fs::write(&img, vec![b'o'; (sectors * SECTOR) as usize]).unwrap();
        let pf: OwnedFd = nix::fcntl::open(&img, OFlag::O_PATH, Mode::empty()).unwrap();
        // One write straddling sector boundaries, from mid-sector 0 to past
        // the end (an append the cut drops whatever the subset).
        let (off, len) = (100, sectors * SECTOR);
        j.modify(key(&img), &pf, Change::Write { off, len }, || {
            std::fs::File::options()
                .write(true)
                .open(&img)?
                .write_all_at(&vec![b'n'; len as usize], off)
        })
        .unwrap();
        let r = j.cut(Some(Subset::new(7)));
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let got = std::fs::read(&img).unwrap();
        assert_eq!(got.len() as u64, sectors * SECTOR, "the durable size");
        assert_eq!(&got[..100], &[b'o'; 100][..], "never written");
        let mut new = 0;
        for (i, s) in got.chunks(SECTOR as usize).enumerate() {
            let from = if i == 0 { 100 } else { 0 };
            let part = &s[from..];
            assert!(
                part.iter().all(|&b| b == part[0]),
                "sector {i} is torn inside"
            );
            new += u64::from(part[0] == b'n');
        }
        assert_eq!(new, r.sectors_kept);
        assert!(
            new > 0 && new < sectors,
            "a subset, not all or nothing: {new} of {sectors} sectors kept"
        );
    }

    #[test]
    fn a_rename_over_a_file_is_undone_with_the_file_it_replaced() {
        let t = tempfile::tempdir().unwrap();
        let (root, trash) = (t.path().join("root"), t.path().join("trash"));
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::create_dir_all(&trash).unwrap();
        let j = Journal::new(Arc::try_unwrap(dir(&trash)).unwrap());
        std::fs::write(root.join("a"), b"new").unwrap();
        std::fs::write(root.join("d/b"), b"old").unwrap();
        let (rk, rd) = (key(&root), dir(&root));
        let (dk, dd) = (key(&root.join("d")), dir(&root.join("d")));
        j.rename(
            rk,
            &rd,
            OsStr::new("a"),
            dk,
            &dd,
            OsStr::new("b"),
            RenameFlags::empty(),
        )
        .unwrap();
        assert_eq!(std::fs::read(root.join("d/b")).unwrap(), b"new");
        j.cut(None);
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"new");
        assert_eq!(std::fs::read(root.join("d/b")).unwrap(), b"old");
        // Made durable by an fsync of either directory.
        j.rename(
            rk,
            &rd,
            OsStr::new("a"),
            dk,
            &dd,
            OsStr::new("b"),
            RenameFlags::empty(),
        )
        .unwrap();
        j.sync_dir(dk);
        j.cut(None);
        assert!(!root.join("a").exists());
        assert_eq!(std::fs::read(root.join("d/b")).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0);
    }
}

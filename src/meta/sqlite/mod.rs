//! [`MetaStore`]: the namespace and block lists in one SQLite database.
//!
//! Every mutation is one transaction, so a kill -9 of the daemon leaves the
//! namespace at the last committed operation (WAL, `synchronous=NORMAL`:
//! survives a process crash, and a power cut loses at most the commits
//! since the last sync, never the order). What must survive a power cut is
//! made durable by an `fdatasync` of the WAL file ([`MetaStore::sync_wal`]):
//! every commit is a run of frames appended to it, so syncing the file
//! syncs every commit so far. (A commit with `synchronous=FULL` would do
//! the same only when it writes a frame: SQLite skips writes that change
//! nothing, so the former trick of rewriting a counter to its own value
//! committed nothing and synced nothing.) Checkpoints need no help: with
//! `synchronous=NORMAL` SQLite syncs the WAL before copying it into the
//! database, the database after, and the WAL's header when it reuses it.

use std::path::{Path, PathBuf};

mod dentries;
mod elections;
mod registry;
mod schema;
mod xattrs;

use rusqlite::{Connection, OptionalExtension, params};

use super::backend::{Change, Meta};
use super::types::*;
use crate::error::{FsError, FsResult};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};
use dentries::*;

pub struct MetaStore {
    conn: Mutex<Connection>,
    /// `meta.db-wal`, synced to make commits durable.
    wal: PathBuf,
    /// The directory of the database, whose filesystem `statfs` counts.
    dir: PathBuf,
    /// Commits made, and how many of them are known durable.
    commits: AtomicU64,
    synced: AtomicU64,
    /// Ranges of block ids and generation stamps reserved in the database,
    /// handed out without a commit each: (next, end) per counter.
    pool: Mutex<std::collections::HashMap<&'static str, (u64, u64)>>,
}

/// How many ids one reservation takes.
const ID_BATCH: u64 = 1024;

/// The columns of an inode, as `row_to_inode` reads them. A macro so that
/// the hottest query is one static string, not formatted on every call.
macro_rules! inode_cols {
    () => {
        "ino, kind, mode, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, block_size, last_epoch"
    };
}
const INODE_COLS: &str = inode_cols!();

fn row_to_inode(r: &rusqlite::Row<'_>) -> rusqlite::Result<Inode> {
    Ok(Inode {
        ino: r.get::<_, i64>(0)? as u64,
        kind: Kind::from_i64(r.get(1)?),
        mode: r.get::<_, i64>(2)? as u32,
        uid: r.get::<_, i64>(3)? as u32,
        gid: r.get::<_, i64>(4)? as u32,
        nlink: r.get::<_, i64>(5)? as u32,
        size: r.get::<_, i64>(6)? as u64,
        rdev: r.get::<_, i64>(7)? as u32,
        atime: r.get(8)?,
        mtime: r.get(9)?,
        ctime: r.get(10)?,
        crtime: r.get(11)?,
        block_size: r.get::<_, i64>(12)? as u64,
        last_epoch: r.get::<_, i64>(13)? as u64,
    })
}

const UC_COLS: &str = "ino, holder, pid, comm, epoch, mount_id, since_ms";

fn row_to_uc(r: &rusqlite::Row<'_>) -> rusqlite::Result<UnderConstruction> {
    Ok(UnderConstruction {
        ino: r.get::<_, i64>(0)? as u64,
        holder: r.get(1)?,
        pid: r.get::<_, i64>(2)? as u32,
        comm: r.get(3)?,
        epoch: r.get::<_, i64>(4)? as u64,
        mount_id: r.get(5)?,
        since_ms: r.get::<_, i64>(6)? as u64,
    })
}

fn row_to_block(r: &rusqlite::Row<'_>) -> rusqlite::Result<BlockRow> {
    let reps: String = r.get(6)?;
    Ok(BlockRow {
        ino: r.get::<_, i64>(0)? as u64,
        idx: r.get::<_, i64>(1)? as u64,
        block_id: r.get::<_, i64>(2)? as u64,
        gs: r.get::<_, i64>(3)? as u64,
        len: r.get::<_, i64>(4)? as u64,
        finalized: r.get::<_, i64>(5)? != 0,
        replicas: reps.split(',').filter_map(|s| s.parse().ok()).collect(),
    })
}

fn replicas_text(r: &[DnId]) -> String {
    r.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn get_inode(tx: &Connection, ino: u64) -> FsResult<Inode> {
    tx.prepare_cached(concat!(
        "SELECT ",
        inode_cols!(),
        " FROM inodes WHERE ino = ?1"
    ))?
    .query_row([ino as i64], row_to_inode)
    .optional()?
    .ok_or(FsError::NotFound)
}

/// Runs `f` in a transaction on `c`. BEGIN and COMMIT are cached
/// statements: a small-file create commits three times, and parsing them
/// anew each time (as `Connection::transaction` does) showed in profiles.
/// Anything but a commit (an error, a panic) rolls back.
fn in_tx<T>(c: &Connection, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
    struct Open<'a>(&'a Connection, bool);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = self.0.execute_batch("ROLLBACK");
            }
        }
    }
    c.prepare_cached("BEGIN")?.execute([])?;
    let mut open = Open(c, false);
    let v = f(c)?;
    c.prepare_cached("COMMIT")?.execute([])?;
    open.1 = true;
    Ok(v)
}

impl MetaStore {
    /// Opens (creating if needed) the database at `path`. The root directory
    /// is created owned by `uid:gid`.
    pub fn open(path: &Path, uid: u32, gid: u32) -> FsResult<MetaStore> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(schema::SCHEMA)?;
        schema::upgrade(&conn)?;
        registry::init(&conn)?;
        let now = now_ns();
        conn.execute(
            &format!(
                "INSERT OR IGNORE INTO inodes({INODE_COLS}) VALUES(1, 2, ?1, ?2, ?3, 2, 0, 0, ?4, ?4, ?4, ?4, 0, 0)"
            ),
            params![0o755i64, uid as i64, gid as i64, now],
        )?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        Ok(MetaStore {
            conn: Mutex::new(conn),
            wal: wal.into(),
            dir,
            commits: AtomicU64::new(1),
            synced: AtomicU64::new(0),
            pool: Mutex::new(Default::default()),
        })
    }

    fn with_tx<T>(&self, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
        let c = lock(&self.conn);
        let v = in_tx(&c, f)?;
        self.commits.fetch_add(1, Ordering::Release);
        Ok(v)
    }

    /// Runs `f` in a transaction whose commit is durable when this returns,
    /// with every earlier commit.
    fn durable<T>(&self, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
        let v = self.with_tx(f)?;
        self.sync_if_needed()?;
        Ok(v)
    }

    /// Makes every commit written so far durable: `fdatasync` of the WAL.
    /// Without a WAL file (none written yet, or removed after a complete
    /// checkpoint) everything is in the database file, which SQLite synced
    /// at that checkpoint.
    fn sync_wal(&self) -> FsResult<()> {
        match std::fs::File::open(&self.wal) {
            Ok(f) => f
                .sync_data()
                .map_err(|e| FsError::Io(format!("cannot sync {}: {e}", self.wal.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FsError::Io(format!(
                "cannot open {}: {e}",
                self.wal.display()
            ))),
        }
    }

    /// Records a file's length (and mtime/ctime when `touch` is given).
    fn set_size(tx: &Connection, ino: u64, size: u64, touch: Option<i64>) -> FsResult<()> {
        match touch {
            Some(t) => tx
                .prepare_cached(
                    "UPDATE inodes SET size = ?2, mtime = ?3, ctime = ?3 WHERE ino = ?1",
                )?
                .execute(params![ino as i64, size as i64, t])?,
            None => tx
                .prepare_cached("UPDATE inodes SET size = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, size as i64])?,
        };
        Ok(())
    }

    fn blocks_in(c: &Connection, ino: u64) -> FsResult<Vec<BlockRow>> {
        let mut st = c.prepare_cached(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks WHERE ino = ?1 ORDER BY idx",
        )?;
        let rows = st.query_map([ino as i64], row_to_block)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn put_block(tx: &Connection, b: &BlockRow) -> FsResult<()> {
        tx.prepare_cached("INSERT OR REPLACE INTO blocks VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)")?
            .execute(params![
                b.ino as i64,
                b.idx as i64,
                b.block_id as i64,
                b.gs as i64,
                b.len as i64,
                b.finalized as i64,
                replicas_text(&b.replicas)
            ])?;
        Ok(())
    }

    /// Removes blocks with index >= `from`; returns them so their replicas
    /// can be deleted.
    fn drop_blocks_from(tx: &Connection, ino: u64, from: u64) -> FsResult<Vec<BlockRow>> {
        let gone = Self::blocks_in(tx, ino)?
            .into_iter()
            .filter(|b| b.idx >= from)
            .collect();
        tx.prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx >= ?2")?
            .execute(params![ino as i64, from as i64])?;
        Ok(gone)
    }

    fn set_last_epoch(tx: &Connection, ino: u64, epoch: u64) -> FsResult<()> {
        tx.prepare_cached("UPDATE inodes SET last_epoch = ?2 WHERE ino = ?1 AND last_epoch < ?2")?
            .execute(params![ino as i64, epoch as i64])?;
        Ok(())
    }

    fn put_uc(tx: &Connection, uc: &UnderConstruction) -> FsResult<()> {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO under_construction VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            uc.ino as i64,
            uc.holder,
            uc.pid as i64,
            uc.comm,
            uc.epoch as i64,
            uc.mount_id,
            uc.since_ms as i64
        ])?;
        Self::set_last_epoch(tx, uc.ino, uc.epoch)
    }

    fn del_uc(tx: &Connection, ino: u64) -> FsResult<()> {
        tx.prepare_cached("DELETE FROM under_construction WHERE ino = ?1")?
            .execute([ino as i64])?;
        Ok(())
    }
}

impl Meta for MetaStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    /// Makes every commit so far durable, unless that is already so: an
    /// fsync that changed no metadata since the last one costs nothing here.
    fn sync_if_needed(&self) -> FsResult<()> {
        let seen = self.commits.load(Ordering::Acquire);
        if self.synced.load(Ordering::Acquire) >= seen {
            return Ok(());
        }
        self.sync_wal()?;
        self.synced.fetch_max(seen, Ordering::AcqRel);
        Ok(())
    }

    fn get(&self, ino: u64) -> FsResult<Inode> {
        get_inode(&lock(&self.conn), ino)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let c = lock(&self.conn);
        require_dir(&c, parent)?;
        let ino = lookup_in(&c, parent, name)?.ok_or(FsError::NotFound)?;
        get_inode(&c, ino)
    }

    /// The parent of a directory (`..`), found through its entry.
    fn parent_of(&self, dir: u64) -> FsResult<u64> {
        if dir == ROOT_INO {
            return Ok(ROOT_INO);
        }
        let c = lock(&self.conn);
        Ok(
            c.prepare_cached("SELECT parent FROM dentries WHERE ino = ?1 LIMIT 1")?
                .query_row([dir as i64], |r| r.get::<_, i64>(0))
                .optional()?
                .map(|v| v as u64)
                .unwrap_or(ROOT_INO),
        )
    }

    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode> {
        let now = now_ns();
        // From the reserved batch, as block ids: a failed create leaves a
        // gap, which costs nothing.
        let ino = self.alloc("next_ino")?;
        let cookie = self.alloc("next_cookie")?;
        self.with_tx(|tx| {
            require_dir(tx, parent)?;
            if lookup_in(tx, parent, name)?.is_some() {
                return Err(FsError::Exists);
            }
            let nlink = if n.kind == Kind::Dir { 2 } else { 1 };
            tx.prepare_cached(&format!(
                "INSERT INTO inodes({INODE_COLS}, target) VALUES(?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?8, ?8, ?8, ?9, 0, ?10)"
            ))?
            .execute(params![
                ino as i64,
                n.kind as i64,
                (n.mode & 0o7777) as i64,
                n.uid as i64,
                n.gid as i64,
                nlink,
                n.rdev as i64,
                now,
                n.block_size as i64,
                n.target
            ])?;
            put_entry(tx, parent, name, ino, cookie)?;
            for (k, v) in &n.xattrs {
                xattrs::put(tx, ino, k, v)?;
            }
            touch_dir(tx, parent, if n.kind == Kind::Dir { 1 } else { 0 }, now)?;
            get_inode(tx, ino)
        })
    }

    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let c = lock(&self.conn);
        let t: Option<Vec<u8>> = c
            .prepare_cached("SELECT target FROM inodes WHERE ino = ?1")?
            .query_row([ino as i64], |r| r.get(0))
            .optional()?
            .ok_or(FsError::NotFound)?;
        t.ok_or(FsError::Invalid("not a symlink".into()))
    }

    /// A hard link: another name for `ino`.
    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        let cookie = self.alloc("next_cookie")?;
        self.with_tx(|tx| {
            require_dir(tx, parent)?;
            let i = get_inode(tx, ino)?;
            if i.kind == Kind::Dir {
                return Err(FsError::NotPermitted("hard links to directories"));
            }
            if lookup_in(tx, parent, name)?.is_some() {
                return Err(FsError::Exists);
            }
            put_entry(tx, parent, name, ino, cookie)?;
            tx.prepare_cached("UPDATE inodes SET nlink = nlink + 1, ctime = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, now])?;
            touch_dir(tx, parent, 0, now)?;
            get_inode(tx, ino)
        })
    }

    /// Removes a non-directory entry; returns the inode after the change
    /// (nlink 0 means the last name is gone).
    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        self.with_tx(|tx| {
            require_dir(tx, parent)?;
            let ino = lookup_in(tx, parent, name)?.ok_or(FsError::NotFound)?;
            let i = get_inode(tx, ino)?;
            if i.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            tx.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
                .execute(params![parent as i64, name])?;
            tx.prepare_cached("UPDATE inodes SET nlink = nlink - 1, ctime = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, now])?;
            touch_dir(tx, parent, 0, now)?;
            get_inode(tx, ino)
        })
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64> {
        let now = now_ns();
        self.with_tx(|tx| {
            require_dir(tx, parent)?;
            let ino = lookup_in(tx, parent, name)?.ok_or(FsError::NotFound)?;
            let i = get_inode(tx, ino)?;
            if i.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            if !is_empty_dir(tx, ino)? {
                return Err(FsError::NotEmpty);
            }
            tx.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
                .execute(params![parent as i64, name])?;
            tx.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
                .execute([ino as i64])?;
            tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
                .execute([ino as i64])?;
            touch_dir(tx, parent, -1, now)?;
            Ok(ino)
        })
    }

    /// Renames; returns the replaced inode (after its nlink drop), if any.
    /// `exchange` swaps the two entries (RENAME_EXCHANGE).
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>> {
        let now = now_ns();
        self.with_tx(|tx| {
            require_dir(tx, parent)?;
            require_dir(tx, newparent)?;
            let (src, src_cookie) = entry_in(tx, parent, name)?.ok_or(FsError::NotFound)?;
            let src_i = get_inode(tx, src)?;
            let dst_entry = entry_in(tx, newparent, newname)?;
            let dst = dst_entry.map(|(ino, _)| ino);
            if dst == Some(src) {
                return Ok(None);
            }
            if src_i.kind == Kind::Dir && src != newparent {
                // A directory may not move below itself.
                let mut p = newparent;
                while p != ROOT_INO {
                    if p == src {
                        return Err(FsError::Invalid(
                            "cannot move a directory into itself".into(),
                        ));
                    }
                    p = tx
                        .prepare_cached("SELECT parent FROM dentries WHERE ino = ?1 LIMIT 1")?
                        .query_row([p as i64], |r| r.get::<_, i64>(0))
                        .optional()?
                        .map(|v| v as u64)
                        .unwrap_or(ROOT_INO);
                }
            } else if src == newparent {
                return Err(FsError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            let bump_ctime = |ino: u64| -> FsResult<()> {
                tx.prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")?
                    .execute(params![ino as i64, now])?;
                Ok(())
            };
            // Cookies move with their inodes, so that a listing meets each
            // renamed inode once in a directory, at its old place.
            if exchange {
                let (dst, dst_cookie) = dst_entry.ok_or(FsError::NotFound)?;
                let dst_i = get_inode(tx, dst)?;
                put_entry(tx, parent, name, dst, dst_cookie)?;
                put_entry(tx, newparent, newname, src, src_cookie)?;
                if parent != newparent {
                    let d_src = (src_i.kind == Kind::Dir) as i64;
                    let d_dst = (dst_i.kind == Kind::Dir) as i64;
                    touch_dir(tx, parent, d_dst - d_src, now)?;
                    touch_dir(tx, newparent, d_src - d_dst, now)?;
                } else {
                    touch_dir(tx, parent, 0, now)?;
                }
                bump_ctime(src)?;
                bump_ctime(dst)?;
                return Ok(None);
            }
            let mut replaced = None;
            if let Some(dst) = dst {
                if noreplace {
                    return Err(FsError::Exists);
                }
                let dst_i = get_inode(tx, dst)?;
                match (src_i.kind == Kind::Dir, dst_i.kind == Kind::Dir) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) => {
                        if !is_empty_dir(tx, dst)? {
                            return Err(FsError::NotEmpty);
                        }
                        tx.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
                            .execute([dst as i64])?;
                        tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
                            .execute([dst as i64])?;
                        touch_dir(tx, newparent, -1, now)?;
                    }
                    (false, false) => {
                        tx.prepare_cached(
                            "UPDATE inodes SET nlink = nlink - 1, ctime = ?2 WHERE ino = ?1",
                        )?
                        .execute(params![dst as i64, now])?;
                        replaced = Some(get_inode(tx, dst)?);
                    }
                }
            }
            tx.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
                .execute(params![parent as i64, name])?;
            put_entry(tx, newparent, newname, src, src_cookie)?;
            let dir_delta = (src_i.kind == Kind::Dir) as i64;
            if parent != newparent {
                touch_dir(tx, parent, -dir_delta, now)?;
                touch_dir(tx, newparent, dir_delta, now)?;
            } else {
                touch_dir(tx, parent, 0, now)?;
            }
            bump_ctime(src)?;
            Ok(replaced)
        })
    }

    /// A page of the directory through the `dentries_by_cookie` index.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>> {
        let c = lock(&self.conn);
        require_dir(&c, dir)?;
        let mut st = c.prepare_cached(READDIR_PAGE)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let rows = st.query_map(params![dir as i64, after, limit], |r| {
            Ok(DirEntry {
                name: r.get(0)?,
                ino: r.get::<_, i64>(1)? as u64,
                kind: Kind::from_i64(r.get(2)?),
                cookie: r.get::<_, i64>(3)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn set_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode> {
        self.with_tx(|tx| {
            let mut i = get_inode(tx, ino)?;
            ch.apply(&mut i, now_ns());
            tx.prepare_cached(
                "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, atime = ?5, mtime = ?6, ctime = ?7 WHERE ino = ?1",
            )?
            .execute(params![
                ino as i64,
                i.mode as i64,
                i.uid as i64,
                i.gid as i64,
                i.atime,
                i.mtime,
                i.ctime
            ])?;
            Ok(i)
        })
    }

    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        Self::blocks_in(&lock(&self.conn), ino)
    }

    fn all_blocks(&self) -> FsResult<Vec<BlockRow>> {
        let c = lock(&self.conn);
        let mut st = c.prepare(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks ORDER BY ino, idx",
        )?;
        let rows = st.query_map([], row_to_block)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>> {
        let c = lock(&self.conn);
        Ok(c.prepare_cached(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks WHERE block_id = ?1",
        )?
        .query_row([block_id as i64], row_to_block)
        .optional()?)
    }

    /// A fresh id of `counter` (`next_block`, `next_gs`): unique across
    /// restarts and power cuts, since whole ranges are reserved durably
    /// before use.
    fn alloc(&self, counter: &'static str) -> FsResult<u64> {
        let mut pool = lock(&self.pool);
        let (next, end) = pool.entry(counter).or_insert((0, 0));
        if *next >= *end {
            let first: i64 = self.durable(|tx| {
                Ok(tx.query_row(
                    "UPDATE counters SET value = value + ?2 WHERE name = ?1 RETURNING value - ?2",
                    params![counter, ID_BATCH as i64],
                    |r| r.get(0),
                )?)
            })?;
            *next = first as u64;
            *end = first as u64 + ID_BATCH;
        }
        let id = *next;
        *next += 1;
        Ok(id)
    }

    /// Reserves `n` epochs above the persisted high-water mark and returns
    /// the first; durable when it returns, so epochs stay strictly
    /// increasing across restarts and power cuts.
    fn reserve_epochs(&self, n: u64) -> FsResult<u64> {
        self.durable(|tx| {
            let v: i64 = tx.query_row(
                "UPDATE counters SET value = value + ?1 WHERE name = 'epoch_reserved' RETURNING value - ?1",
                [n as i64],
                |r| r.get(0),
            )?;
            Ok(v as u64 + 1)
        })
    }

    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>> {
        let c = lock(&self.conn);
        let mut st = c.prepare(&format!("SELECT {UC_COLS} FROM under_construction"))?;
        let rows = st.query_map([], row_to_uc)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>> {
        let c = lock(&self.conn);
        Ok(c.prepare_cached(&format!(
            "SELECT {UC_COLS} FROM under_construction WHERE ino = ?1"
        ))?
        .query_row([ino as i64], row_to_uc)
        .optional()?)
    }

    /// Deletes an inode whose last name and last open handle are gone;
    /// returns its blocks for replica deletion.
    fn delete_inode(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        self.with_tx(|tx| {
            let blocks = Self::drop_blocks_from(tx, ino, 0)?;
            tx.prepare_cached("DELETE FROM inodes WHERE ino = ?1 AND nlink <= 0")?
                .execute([ino as i64])?;
            tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
                .execute([ino as i64])?;
            Self::del_uc(tx, ino)?;
            Ok(blocks)
        })
    }

    /// Inodes with no name left (unlinked while open when the daemon died).
    fn orphans(&self) -> FsResult<Vec<u64>> {
        let c = lock(&self.conn);
        let mut st = c.prepare("SELECT ino FROM inodes WHERE nlink <= 0")?;
        let rows = st.query_map([], |r| Ok(r.get::<_, i64>(0)? as u64))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Path of an inode, for logs and listings (first name found).
    fn path_of(&self, mut ino: u64) -> String {
        let c = lock(&self.conn);
        let mut parts = Vec::new();
        while ino != ROOT_INO && parts.len() < 256 {
            let r: Option<(i64, Vec<u8>)> = c
                .prepare_cached("SELECT parent, name FROM dentries WHERE ino = ?1 LIMIT 1")
                .and_then(|mut s| {
                    s.query_row([ino as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .unwrap_or(None);
            match r {
                Some((p, n)) => {
                    parts.push(String::from_utf8_lossy(&n).into_owned());
                    ino = p as u64;
                }
                None => return format!("<ino {ino}>"),
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        xattrs::get(&lock(&self.conn), ino, name)?.ok_or(FsError::NoXattr)
    }

    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, bool)> {
        lock(&self.conn)
            .prepare_cached(concat!(
                "SELECT ",
                inode_cols!(),
                ", EXISTS(SELECT 1 FROM xattrs WHERE ino = ?1 AND name = ?2)",
                " FROM inodes WHERE ino = ?1"
            ))?
            .query_row(params![ino as i64, name], |r| {
                Ok((row_to_inode(r)?, r.get::<_, i64>(14)? != 0))
            })
            .optional()?
            .ok_or(FsError::NotFound)
    }

    fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        xattrs::list(&lock(&self.conn), ino)
    }

    fn update_xattrs(
        &self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode> {
        self.with_tx(|tx| xattrs::update(tx, ino, names, limits, decide))
    }

    fn filesystem_id(&self) -> FsResult<String> {
        registry::filesystem_id(&lock(&self.conn))
    }

    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>> {
        registry::records(&lock(&self.conn))
    }

    fn register_datanode(&self, storage_id: &str, path: &Path) -> FsResult<DnId> {
        self.durable(|tx| registry::register(tx, storage_id, path))
    }

    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String> {
        self.durable(|tx| registry::claim_legacy(tx, id, storage_id))
    }

    fn set_datanode_state(
        &self,
        id: DnId,
        from: &[AdminState],
        to: AdminState,
    ) -> FsResult<AdminState> {
        self.durable(|tx| registry::set_state(tx, id, from, to))
    }

    fn remove_datanode(&self, id: DnId) -> FsResult<()> {
        self.durable(|tx| registry::remove(tx, id))
    }

    fn set_replication(&self, replication: usize) -> FsResult<()> {
        self.with_tx(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO counters VALUES('replication', ?1)",
                [replication as i64],
            )?;
            Ok(())
        })
    }

    /// The replication factor of the last mount, if recorded.
    fn replication(&self) -> FsResult<Option<usize>> {
        let c = lock(&self.conn);
        Ok(c.query_row(
            "SELECT value FROM counters WHERE name = 'replication'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        .map(|v| v as usize))
    }

    /// Appends one election event (the audit table operators query).
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>> {
        self.durable(|tx| elections::audit(tx, e))
    }

    /// The events of one election, oldest first.
    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>> {
        elections::history(&lock(&self.conn), election, None)
    }

    fn put_fence(&self, f: &FenceRecord) -> FsResult<()> {
        self.durable(|tx| elections::put_fence(tx, f))
    }

    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()> {
        self.durable(|tx| elections::delete_fence(tx, owner, pgid))
    }

    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>> {
        elections::fences(&lock(&self.conn), owner)
    }

    fn space(&self) -> FsResult<Option<StoreSpace>> {
        let s = nix::sys::statvfs::statvfs(&self.dir)
            .map_err(|e| FsError::Io(format!("statvfs {}: {e}", self.dir.display())))?;
        let unit = s.fragment_size();
        Ok(Some(StoreSpace {
            total_bytes: s.blocks().saturating_mul(unit),
            avail_bytes: s.blocks_available().saturating_mul(unit),
        }))
    }

    /// Totals for statfs: (files, bytes).
    fn usage(&self) -> FsResult<(u64, u64)> {
        let c = lock(&self.conn);
        Ok(c.query_row(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inodes",
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?)
    }

    fn commit(&self, changes: &[Change], durable: bool) -> FsResult<Vec<BlockRow>> {
        let apply = |tx: &Connection| {
            let mut gone = Vec::new();
            for c in changes {
                match c {
                    Change::PutBlock(b) => Self::put_block(tx, b)?,
                    Change::PutBlockIf { expect, row } => registry::put_block_if(tx, expect, row)?,
                    Change::DropBlocksFrom { ino, from } => {
                        gone.extend(Self::drop_blocks_from(tx, *ino, *from)?)
                    }
                    Change::SetSize { ino, size, touch } => {
                        Self::set_size(tx, *ino, *size, *touch)?
                    }
                    Change::PutUc(uc) => Self::put_uc(tx, uc)?,
                    Change::DelUc(ino) => Self::del_uc(tx, *ino)?,
                    Change::SetLastEpoch { ino, epoch } => Self::set_last_epoch(tx, *ino, *epoch)?,
                }
            }
            Ok(gone)
        };
        if durable {
            self.durable(apply)
        } else {
            self.with_tx(apply)
        }
    }
}

#[cfg(test)]
mod tests;

//! [`MetaStore`]: every part of the metadata in one SQLite database
//! (`DATA/meta.db`), each narrow interface in a file of its own
//! (`namespace.rs` over the rules' [`tx::SqlTx`], `blocks.rs`,
//! `counters.rs`, `elections.rs`, `registry.rs`; the tables in
//! `schema.rs`).
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

/// The columns of an inode, as `row_to_inode` reads them. A macro so that
/// the hottest query is one static string, not formatted on every call.
macro_rules! inode_cols {
    () => {
        "ino, kind, mode, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, block_size, last_epoch"
    };
}

mod blocks;
mod counters;
mod elections;
mod group;
mod namespace;
mod registry;
mod schema;
mod tx;

pub use registry::LOCAL_COPY_NEEDS_ETCD;

use std::os::unix::fs::MetadataExt;

use rusqlite::{Connection, OptionalExtension, params};

use super::backend::Meta;
use super::blockmap::BlockMap;
use super::counters::IdPool;
use super::types::*;
use crate::error::{FsError, FsResult};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

pub struct MetaStore {
    /// A second connection for the reads a request makes on its own
    /// (`get`, `lookup`, `get_with_xattr`): in WAL mode it reads the last
    /// commit while `conn` writes, so a FUSE request thread no longer
    /// waits behind another file's commit and sync to learn an inode. On
    /// one ring's thread serving four writers those waits were most of
    /// its blocking (benches/PROFILE.md, "sixteenth look"). Every commit
    /// returns before the reply of the request that made it, so a later
    /// request reads it here. Declared before `conn`, so dropped first:
    /// the writing connection closes last, and its close copies the WAL
    /// into the database and removes it.
    reader: Mutex<Connection>,
    conn: Mutex<Connection>,
    /// `meta.db-wal`, synced to make commits durable.
    wal: PathBuf,
    /// The WAL held open from its first sync on: no path lookup per
    /// fsync, and every writeback error since then reported to us once
    /// (a descriptor opened later would not see an error another had).
    wal_fd: Mutex<Option<std::fs::File>>,
    /// The directory of the database, whose filesystem `statfs` counts.
    dir: PathBuf,
    /// The filesystem of the database and its WAL (`st_dev`): a `syncfs`
    /// of it makes the commits durable (`BlockMap::commits_on_fs`).
    dev: u64,
    /// Commits made, and how many of them are known durable.
    commits: AtomicU64,
    synced: AtomicU64,
    /// Ranges of ids reserved in the database, handed out without a
    /// commit each.
    pool: Mutex<IdPool>,
    /// The first failed sync of the WAL, given to every later one: the
    /// kernel reports a writeback error once, and a second `fdatasync`
    /// finds the pages it failed to write clean.
    sync_failed: Mutex<Option<FsError>>,
    /// Concurrent syncs of the WAL grouped into one.
    group: group::GroupSync,
    /// Files closed with nothing to record but the end of their time
    /// under construction ([`BlockMap::close_lazily`]): their entries go
    /// with the next commit, whatever it is, instead of one of their own.
    /// Changed only under `conn`, so that whoever holds the connection
    /// sees the entries and this list agree.
    lazy_closes: Mutex<Vec<u64>>,
    /// Unit tests: the errno every sync of the WAL fails with, how long
    /// each takes, and how many ran.
    #[cfg(test)]
    sync_fault: Mutex<Option<i32>>,
    #[cfg(test)]
    sync_delay: Mutex<std::time::Duration>,
    #[cfg(test)]
    syncs_run: AtomicU64,
}

const INODE_COLS: &str = inode_cols!();

/// The page size of a new database. A commit writes every page it
/// changed whole into the WAL, and a durable small file changes some
/// fourteen (the create's entry, its two indexes, the two inodes, the
/// block row, its index, the journal row), each for a row of a hundred
/// bytes or so: with SQLite's 4 KiB pages 45 KiB of WAL per file of 4 KiB
/// (`a_durable_small_file_writes_little_wal`), every byte of it copied,
/// checksummed and written back before the sync's flush; with 1 KiB pages
/// 16 KiB. One writer's durable small files went from 2,500 to 2,747
/// files/s, the daemon's CPU per file from 408 to 365 µs
/// (benches/PROFILE.md, "sixteenth look"). SQLite fixes the page size of
/// a WAL database when it is made: one made before keeps its 4 KiB pages.
const PAGE_SIZE: i64 = 1024;

/// Statements kept prepared (`prepare_cached`): room for every one the
/// store runs. rusqlite keeps 16 by default, fewer than the store's
/// statements, so whichever were least recently used when a 17th came
/// were evicted and parsed and planned anew at their next use
/// (`the_statement_cache_holds_every_cached_statement`).
const STATEMENT_CACHE: usize = 64;

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

fn find_inode(c: &Connection, ino: u64) -> FsResult<Option<Inode>> {
    Ok(c.prepare_cached(concat!(
        "SELECT ",
        inode_cols!(),
        " FROM inodes WHERE ino = ?1"
    ))?
    .query_row([ino as i64], row_to_inode)
    .optional()?)
}

fn get_inode(c: &Connection, ino: u64) -> FsResult<Inode> {
    find_inode(c, ino)?.ok_or(FsError::NotFound)
}

/// Runs `f` in a transaction on `c`. BEGIN and COMMIT are cached
/// statements: a small-file create commits three times, and parsing them
/// anew each time (as `Connection::transaction` does) showed in profiles.
/// Anything but a commit (an error, a panic) rolls back.
///
/// `IMMEDIATE`: the WAL's write lock is taken at the start, where SQLite
/// waits (the busy timeout) for whoever holds it for a moment. A deferred
/// transaction that read first and then wrote got `SQLITE_BUSY` at once
/// instead (SQLite never waits to upgrade a read transaction): another
/// connection that reads a header a commit is writing takes the write
/// lock for a moment to read it again: an operator's `sqlite3`, a test's
/// reader (`tests/dir_listing.rs` failed so, 3 runs in about 45, while a
/// second connection of the daemon made checkpoints).
fn in_tx<T>(c: &Connection, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
    struct Open<'a>(&'a Connection, bool);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = self.0.execute_batch("ROLLBACK");
            }
        }
    }
    c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let mut open = Open(c, false);
    let v = f(c)?;
    c.prepare_cached("COMMIT")?.execute([])?;
    open.1 = true;
    Ok(v)
}

/// A connection to the database at `path` as the store uses them.
fn connect(path: &Path) -> FsResult<Connection> {
    let c = Connection::open(path)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans that never depend on bound values: otherwise SQLite
    // prepares again, at the next run, every statement whose plan
    // might (a key's equality then `ORDER BY`, a `LIMIT ?`) once its
    // bindings are cleared, which the statement cache does at every
    // return; the fsync's block list was parsed and planned anew each
    // time (`cached_statements_are_never_prepared_again`).
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(c)
}

impl MetaStore {
    /// Opens (creating if needed) the database at `path`. The root directory
    /// is created owned by `uid:gid`.
    pub fn open(path: &Path, uid: u32, gid: u32) -> FsResult<MetaStore> {
        let conn = connect(path)?;
        // Before anything is written: only a new database takes it.
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
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
        let dev = std::fs::metadata(path)
            .map_err(|e| FsError::Io(format!("cannot stat {}: {e}", path.display())))?
            .dev();
        // Once the schema is there (and upgraded): it reads no other.
        let reader = connect(path)?;
        reader.pragma_update(None, "query_only", true)?;
        Ok(MetaStore {
            conn: Mutex::new(conn),
            reader: Mutex::new(reader),
            wal: wal.into(),
            wal_fd: Mutex::new(None),
            dir,
            dev,
            commits: AtomicU64::new(1),
            synced: AtomicU64::new(0),
            pool: Mutex::new(IdPool::default()),
            sync_failed: Mutex::new(None),
            group: group::GroupSync::default(),
            lazy_closes: Mutex::new(Vec::new()),
            #[cfg(test)]
            sync_fault: Mutex::new(None),
            #[cfg(test)]
            sync_delay: Mutex::new(std::time::Duration::ZERO),
            #[cfg(test)]
            syncs_run: AtomicU64::new(0),
        })
    }

    /// Unit tests: every sync of the WAL fails with `errno` (`None`: none
    /// does).
    #[cfg(test)]
    pub(crate) fn fail_syncs(&self, errno: Option<i32>) {
        *lock(&self.sync_fault) = errno;
    }

    /// Unit tests: syncs of the WAL run so far.
    #[cfg(test)]
    pub(crate) fn syncs_run(&self) -> u64 {
        self.syncs_run.load(Ordering::Acquire)
    }

    /// Every write transaction: the closes recorded lazily go first, in
    /// it (so a new writer's entry, made by a later commit, always follows
    /// the old one's removal); a transaction that fails keeps them for
    /// the next.
    fn with_tx<T>(&self, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
        let c = lock(&self.conn);
        let closed = std::mem::take(&mut *lock(&self.lazy_closes));
        let r = in_tx(&c, |tx| {
            for &ino in &closed {
                blocks::del_uc(tx, ino)?;
            }
            f(tx)
        });
        match r {
            Ok(v) => {
                self.commits.fetch_add(1, Ordering::Release);
                Ok(v)
            }
            Err(e) => {
                lock(&self.lazy_closes).extend(closed);
                Err(e)
            }
        }
    }

    /// Whether `ino`'s under-construction entry, though still in the
    /// table, is gone (closed lazily). With `conn` held.
    fn closed_lazily(&self, ino: u64) -> bool {
        lock(&self.lazy_closes).contains(&ino)
    }

    /// Runs `f` in a transaction whose commit is durable when this returns,
    /// with every earlier commit.
    fn durable<T>(&self, f: impl FnOnce(&Connection) -> FsResult<T>) -> FsResult<T> {
        let v = self.with_tx(f)?;
        self.sync_if_needed()?;
        Ok(v)
    }

    /// [`Self::sync_wal`], unless one failed before: then its error, for
    /// good (until the daemon restarts and SQLite reads what the disk
    /// holds).
    fn sync_wal_once(&self) -> FsResult<()> {
        if let Some(e) = &*lock(&self.sync_failed) {
            return Err(e.clone());
        }
        let r = self.sync_wal();
        if let Err(e) = &r {
            tracing::error!("the metadata store cannot be made durable, from now on: {e}");
            lock(&self.sync_failed).get_or_insert_with(|| e.clone());
        }
        r
    }

    /// Makes every commit written so far durable: `fdatasync` of the WAL.
    /// Without a WAL file (none written yet, or removed after a complete
    /// checkpoint) everything is in the database file, which SQLite synced
    /// at that checkpoint.
    fn sync_wal(&self) -> FsResult<()> {
        #[cfg(test)]
        {
            self.syncs_run.fetch_add(1, Ordering::AcqRel);
            std::thread::sleep(*lock(&self.sync_delay));
        }
        #[cfg(test)]
        if let Some(errno) = *lock(&self.sync_fault) {
            return Err(wal_sync_error(
                &self.wal,
                std::io::Error::from_raw_os_error(errno),
            ));
        }
        let mut held = lock(&self.wal_fd);
        // A WAL removed (the last connection closed) is not ours to sync:
        // the one at the path now is. Asked of its link count alone: a
        // `stat` would read its times, and every next write would dirty
        // its inode for this sync to write (see `crate::fsstat`).
        let current = held
            .take()
            .filter(|f| crate::fsstat::nlink(f).is_ok_and(|n| n > 0));
        let f = match current {
            Some(f) => f,
            None => match std::fs::File::open(&self.wal) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    return Err(FsError::Io(format!(
                        "cannot open {}: {e}",
                        self.wal.display()
                    )));
                }
            },
        };
        let r = f.sync_data().map_err(|e| wal_sync_error(&self.wal, e));
        *held = Some(f);
        r
    }
}

/// A failed sync of the WAL: `ENOSPC` (and `EDQUOT`) is a full store, as
/// for a commit; anything else an I/O error.
fn wal_sync_error(wal: &Path, e: std::io::Error) -> FsError {
    let msg = format!("cannot sync {}: {e}", wal.display());
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => FsError::Full(msg),
        _ => FsError::Io(msg),
    }
}

impl Meta for MetaStore {
    fn backend(&self) -> &'static str {
        "sqlite"
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
}

#[cfg(test)]
mod tests;

//! Tests of the SQLite store that need its internals: reopening, the
//! upgrade of old databases, the query plan of a listing page, the
//! counters' first values.

use super::namespace::READDIR_PAGE;
use super::*;
use crate::meta::{Counter, Counters, Namespace};

fn node(kind: Kind) -> NewNode<'static> {
    NewNode {
        kind,
        mode: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        target: None,
        block_size: 1 << 20,
        xattrs: Vec::new(),
    }
}

#[test]
fn namespace_survives_reopen() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    {
        let m = MetaStore::open(&p, 0, 0).unwrap();
        let dir = m.create(ROOT_INO, b"d", node(Kind::Dir)).unwrap();
        m.create(dir.ino, b"f", node(Kind::File)).unwrap();
    }
    let m = MetaStore::open(&p, 0, 0).unwrap();
    let dir = m.lookup(ROOT_INO, b"d").unwrap();
    assert_eq!(m.lookup(dir.ino, b"f").unwrap().kind, Kind::File);
    assert_eq!(m.get(ROOT_INO).unwrap().nlink, 3);
}

/// A database from before listing cookies: its entries get cookies in
/// name order (the old listing order) and new entries come after.
#[test]
fn entries_without_cookies_are_upgraded() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    {
        let m = MetaStore::open(&p, 0, 0).unwrap();
        for n in ["c", "a", "b"] {
            m.create(ROOT_INO, n.as_bytes(), node(Kind::File)).unwrap();
        }
    }
    let old = Connection::open(&p).unwrap();
    old.execute_batch(
        "DROP INDEX dentries_by_cookie;
         ALTER TABLE dentries DROP COLUMN cookie;
         DELETE FROM counters WHERE name = 'next_cookie';",
    )
    .unwrap();
    drop(old);
    let m = MetaStore::open(&p, 0, 0).unwrap();
    m.create(ROOT_INO, b"0", node(Kind::File)).unwrap();
    let listed: Vec<Vec<u8>> = crate::meta::list_all(&m, ROOT_INO)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(listed, [b"a", b"b", b"c", b"0"].map(|n| n.to_vec()));
}

/// A page of a listing is read through the cookie index, so its cost
/// does not grow with the directory.
#[test]
fn listing_pages_use_the_cookie_index() {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap();
    let c = lock(&m.conn);
    let plan: Vec<String> = c
        .prepare(&format!("EXPLAIN QUERY PLAN {READDIR_PAGE}"))
        .unwrap()
        .query_map(params![1, 2, 3], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter()
            .any(|l| l.contains("dentries_by_cookie (parent=? AND cookie>?)")),
        "{plan:?}"
    );
    assert!(!plan.iter().any(|l| l.contains("TEMP B-TREE")), "{plan:?}");
}

#[test]
fn epochs_reserved_monotonically() {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap();
    let a = m.reserve_epochs(100).unwrap();
    let b = m.reserve_epochs(100).unwrap();
    assert_eq!(b, a + 100);
}

/// The schema's first counter values are the ones a new etcd namespace
/// gets ([`Counter::first`]).
#[test]
fn counters_start_at_their_first_values() {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap();
    for c in Counter::ALL {
        assert_eq!(m.alloc(c).unwrap(), c.first(), "{}", c.key());
        assert_eq!(m.alloc(c).unwrap(), c.first() + 1, "{}", c.key());
    }
}

/// Durable commits of concurrent writers share one sync of the WAL: eight
/// threads that each committed ask at once, while each sync takes 50 ms;
/// one sync covers them all (before grouping: eight). A failed sync
/// covers nobody: every one of them gets the error.
#[test]
fn concurrent_syncs_of_the_wal_are_grouped_and_none_loses_an_error() {
    use crate::meta::BlockMap;
    use std::sync::{Arc, Barrier};
    let d = tempfile::tempdir().unwrap();
    let m = Arc::new(MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap());
    *lock(&m.sync_delay) = std::time::Duration::from_millis(50);
    // Returns the syncs run once every thread had committed (a create
    // may sync on its own, to reserve ids), and each thread's result.
    let round = |tag: &str| -> (u64, Vec<FsResult<()>>) {
        let (committed, go) = (Arc::new(Barrier::new(9)), Arc::new(Barrier::new(9)));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (m, committed, go) = (m.clone(), committed.clone(), go.clone());
                let name = format!("{tag}{i}");
                std::thread::spawn(move || {
                    m.create(ROOT_INO, name.as_bytes(), node(Kind::File))
                        .unwrap();
                    committed.wait();
                    go.wait();
                    m.sync_if_needed()
                })
            })
            .collect();
        committed.wait();
        let before = m.syncs_run.load(Ordering::Acquire);
        go.wait();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        (m.syncs_run.load(Ordering::Acquire) - before, results)
    };
    let (syncs, results) = round("a");
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(syncs, 1, "syncs of the WAL for eight waiting writers");
    m.fail_syncs(Some(libc::EIO));
    let (_, results) = round("b");
    assert!(results.iter().all(Result::is_err));
}

/// Every statement the store keeps prepared fits in the cache at once:
/// one more than it holds, and statements run in turn evict each other
/// and are parsed and planned again at every use.
#[test]
fn the_statement_cache_holds_every_cached_statement() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/meta/sqlite");
    let mut sites = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            sites += text.matches(concat!(".prepare", "_cached(")).count();
        }
    }
    assert!(sites > 16, "the count itself is wrong: {sites} call sites");
    assert!(
        sites <= STATEMENT_CACHE,
        "{sites} statements are prepared through the cache, which keeps {STATEMENT_CACHE}"
    );
}

/// A durable small file's statements, and the listings', each run
/// `rounds` times: create, lookup, the block list after a commit (as an
/// fsync reads it), xattrs, a directory page.
fn small_file_rounds(m: &MetaStore, rounds: usize) {
    use crate::meta::{BlockMap, Change};
    for i in 0..rounds {
        let name = format!("f{i}");
        let f = m
            .create(ROOT_INO, name.as_bytes(), node(Kind::File))
            .unwrap();
        m.lookup(ROOT_INO, name.as_bytes()).unwrap();
        let row = BlockRow {
            ino: f.ino,
            idx: 0,
            block_id: 100 + i as u64,
            gs: 1,
            len: 4096,
            finalized: true,
            replicas: vec![crate::storage::dnid::DnId(1)],
        };
        let size = Change::SetSize {
            ino: f.ino,
            size: 4096,
            touch: None,
        };
        m.commit(&[Change::PutBlock(row), size], false).unwrap();
        assert_eq!(m.blocks(f.ino).unwrap().len(), 1);
        assert!(m.listxattr(f.ino).unwrap().is_empty());
        assert!(m.getxattr(f.ino, b"user.x").is_err());
        assert!(!m.readdir(ROOT_INO, 0, 100).unwrap().is_empty());
    }
}

/// No statement is parsed and planned again once prepared. SQLite
/// re-prepares a statement whose plan may depend on a bound value (an
/// equality on a key followed by `ORDER BY`, a `LIMIT ?`) whenever its
/// bindings are cleared, and the statement cache clears them at every
/// return: so the block list an fsync reads was prepared anew every time
/// (4.4% of the daemon's CPU time with four writers, benches/PROFILE.md,
/// "tenth look"), until the store asked SQLite for stable plans (QPSG).
#[test]
fn cached_statements_are_never_prepared_again() {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap();
    small_file_rounds(&m, 6);
    let mut seen = 0;
    for c in [lock(&m.conn), lock(&m.reader)] {
        // SAFETY: the connection is locked, so no statement is finalized
        // while the list is walked; each pointer is used only until the next.
        unsafe {
            let db = c.handle();
            let mut st = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !st.is_null() {
                let again = rusqlite::ffi::sqlite3_stmt_status(
                    st,
                    rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE,
                    0,
                );
                let sql =
                    std::ffi::CStr::from_ptr(rusqlite::ffi::sqlite3_sql(st)).to_string_lossy();
                assert_eq!(again, 0, "prepared {again} times again: {sql}");
                seen += 1;
                st = rusqlite::ffi::sqlite3_next_stmt(db, st);
            }
        }
    }
    assert!(seen >= 8, "only {seen} statements were kept prepared");
}

fn uc(ino: u64) -> UnderConstruction {
    UnderConstruction {
        ino,
        holder: "writer".into(),
        pid: 1,
        comm: "test".into(),
        epoch: 1,
        mount_id: "m".into(),
        since_ms: 0,
    }
}

/// The under-construction entries the table holds, read as another
/// process (the `sqlite3` shell, a daemon after a crash) would.
fn entries_on_disk(p: &Path) -> Vec<u64> {
    let c = Connection::open(p).unwrap();
    let mut st = c
        .prepare("SELECT ino FROM under_construction ORDER BY ino")
        .unwrap();
    st.query_map([], |r| r.get::<_, i64>(0).map(|i| i as u64))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A fresh store at `m.db` in a temporary directory, with one file per
/// name, each under construction.
fn store_with_open_files(names: &[&str]) -> (tempfile::TempDir, PathBuf, MetaStore, Vec<u64>) {
    use crate::meta::{BlockMap, Change};
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    let m = MetaStore::open(&p, 0, 0).unwrap();
    let inos: Vec<u64> = names
        .iter()
        .map(|n| {
            m.create(ROOT_INO, n.as_bytes(), node(Kind::File))
                .unwrap()
                .ino
        })
        .collect();
    let entries: Vec<Change> = inos.iter().map(|&i| Change::PutUc(uc(i))).collect();
    m.commit(&entries, false).unwrap();
    (d, p, m, inos)
}

/// A close left for the next commit (a small file closed after its whole
/// fsync) is seen at once by every reader of the store, and committed by
/// the next commit, whatever it is; until then another reader of the
/// database, as the next mount after a crash, still finds the entry,
/// which its recovery closes.
#[test]
fn a_lazy_close_is_seen_at_once_and_committed_with_the_next_commit() {
    use crate::meta::BlockMap;
    let (_d, p, m, inos) = store_with_open_files(&["f", "g"]);
    let [f, g] = inos[..] else { unreachable!() };

    m.close_lazily(f).unwrap();
    assert!(m.uc(f).unwrap().is_none(), "the close is not seen");
    let listed: Vec<u64> = m.list_uc().unwrap().iter().map(|u| u.ino).collect();
    assert_eq!(listed, [g]);
    assert_eq!(entries_on_disk(&p), [f, g], "committed on its own");

    // Any commit carries it: here a namespace change.
    m.create(ROOT_INO, b"h", node(Kind::File)).unwrap();
    assert_eq!(entries_on_disk(&p), [g]);
    assert!(lock(&m.lazy_closes).is_empty());
}

/// The file written again after a lazy close: its new entry is made by a
/// later commit, after the old one's removal, and stays.
#[test]
fn an_entry_made_after_a_lazy_close_stays() {
    use crate::meta::{BlockMap, Change};
    let (_d, p, m, inos) = store_with_open_files(&["f"]);
    let f = inos[0];
    m.close_lazily(f).unwrap();
    let mut again = uc(f);
    again.epoch = 2;
    m.commit(&[Change::PutUc(again.clone())], false).unwrap();
    assert_eq!(m.uc(f).unwrap(), Some(again));
    assert_eq!(entries_on_disk(&p), [f]);
}

/// A commit that fails (rolled back) keeps the lazy closes for the next
/// one: a close is never lost to somebody else's error. They are also
/// committed on their own when asked (the lease monitor's tick, an
/// unmount), and at once once `LAZY_CLOSES_MAX` wait.
#[test]
fn lazy_closes_outlive_a_failed_commit_and_are_bounded() {
    use crate::meta::{BlockMap, Change};
    let (_d, p, m, inos) = store_with_open_files(&["f"]);
    let f = inos[0];
    m.close_lazily(f).unwrap();
    let stale = BlockRow {
        ino: f,
        idx: 0,
        block_id: 9,
        gs: 1,
        len: 1,
        finalized: true,
        replicas: Vec::new(),
    };
    let r = m.commit(
        &[Change::PutBlockIf {
            expect: stale.clone(),
            row: stale,
        }],
        false,
    );
    assert!(matches!(r, Err(FsError::Moved(_))), "{r:?}");
    assert!(m.uc(f).unwrap().is_none());
    assert_eq!(entries_on_disk(&p), [f], "rolled back with the commit");
    m.settle_closes().unwrap();
    assert!(entries_on_disk(&p).is_empty());

    let names: Vec<String> = (0..blocks::LAZY_CLOSES_MAX)
        .map(|i| format!("g{i}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_d, p, m, inos) = store_with_open_files(&names);
    let (last, rest) = inos.split_last().unwrap();
    for &i in rest {
        m.close_lazily(i).unwrap();
    }
    assert_eq!(entries_on_disk(&p).len(), blocks::LAZY_CLOSES_MAX);
    m.close_lazily(*last).unwrap();
    assert!(entries_on_disk(&p).is_empty(), "not committed at the bound");
}

/// A sync of the WAL reads none of its times. On a filesystem with
/// multigrain timestamps (Linux 6.13+) a `stat` there made the next
/// commit's write take a fine-grained time and dirty the WAL's inode,
/// which every `fdatasync` then wrote before its flush (benches/PROFILE.md,
/// "fifteenth look"). Counted as in `crate::fsstat`'s test: after a sync,
/// a commit's time is never later than the moment it began unless
/// something read the WAL's times. Where the kernel has no multigrain
/// timestamps there is nothing to check (said on stderr).
#[test]
fn a_sync_of_the_wal_leaves_the_next_commit_coarse() {
    use crate::meta::BlockMap;
    use std::time::SystemTime;
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap();
    let wal = d.path().join("m.db-wal");
    let mtime = || std::fs::metadata(&wal).unwrap().modified().unwrap();
    let rounds = 50;
    let fine_after = |tag: &str, between: &dyn Fn()| {
        let mut fine = 0;
        for i in 0..rounds {
            // Read, so that the first commit takes a fine-grained time.
            let _ = mtime();
            m.create(ROOT_INO, format!("{tag}a{i}").as_bytes(), node(Kind::File))
                .unwrap();
            between();
            let before = SystemTime::now();
            m.create(ROOT_INO, format!("{tag}b{i}").as_bytes(), node(Kind::File))
                .unwrap();
            if mtime() > before {
                fine += 1;
            }
        }
        fine
    };
    let stat = fine_after("s", &|| {
        let _ = mtime();
    });
    if stat < rounds * 3 / 4 {
        eprintln!("no multigrain timestamps here ({stat} of {rounds}): nothing to check");
        return;
    }
    let synced = fine_after("y", &|| m.sync_if_needed().unwrap());
    assert!(
        synced < rounds / 4,
        "the WAL's sync read its times: {synced} of {rounds} commits after it were fine-grained"
    );
}

/// A commit waits for another connection that holds the WAL's write lock
/// for a moment (an operator's `sqlite3`; a connection that read a
/// header as a commit wrote it takes the lock to read it again) instead
/// of failing with `SQLITE_BUSY`: a deferred transaction that had read
/// already got it at once (`in_tx`).
#[test]
fn a_commit_waits_for_another_connections_write_lock() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    let m = MetaStore::open(&p, 0, 0).unwrap();
    m.create(ROOT_INO, b"a", node(Kind::File)).unwrap();
    let other = rusqlite::Connection::open(&p).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        other.execute_batch("COMMIT").unwrap();
    });
    m.create(ROOT_INO, b"b", node(Kind::File)).unwrap();
    t.join().unwrap();
    assert!(m.lookup(ROOT_INO, b"b").is_ok());
}

/// The WAL a durable small file's commits write: its create, then its
/// block row, length and journaled bytes in one durable commit, as an
/// fsync records them. Every page a commit changes goes into the WAL
/// whole (see `PAGE_SIZE`): with 4 KiB pages this test saw 45 KiB per
/// file of 4 KiB, with 1 KiB pages 16 KiB.
#[test]
fn a_durable_small_file_writes_little_wal() {
    use crate::meta::{BlockMap, Change, JournalRow};
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    let m = MetaStore::open(&p, 0, 0).unwrap();
    // Checkpoints would reuse the WAL from its start.
    lock(&m.conn)
        .pragma_update(None, "wal_autocheckpoint", 0)
        .unwrap();
    let dir = m.create(ROOT_INO, b"d", node(Kind::Dir)).unwrap();
    let file = |i: u64| {
        let f = m
            .create(dir.ino, format!("file-{i:05}").as_bytes(), node(Kind::File))
            .unwrap();
        let row = BlockRow {
            ino: f.ino,
            idx: 0,
            block_id: 1000 + i,
            gs: 1,
            len: 4096,
            finalized: true,
            replicas: vec![crate::storage::dnid::DnId(1)],
        };
        let journal = JournalRow {
            block_id: row.block_id,
            gs: 1,
            data: vec![i as u8; 4096],
        };
        let size = Change::SetSize {
            ino: f.ino,
            size: 4096,
            touch: None,
        };
        m.commit(
            &[Change::PutBlock(row), size, Change::Journal(journal)],
            true,
        )
        .unwrap();
    };
    // Past the first files, which make the tables' first pages.
    for i in 0..50 {
        file(i);
    }
    let wal = p.with_extension("db-wal");
    let before = std::fs::metadata(&wal).unwrap().len();
    let n = 200;
    for i in 50..50 + n {
        file(i);
    }
    let per_file = (std::fs::metadata(&wal).unwrap().len() - before) / n;
    eprintln!("WAL bytes per durable small file: {per_file}");
    assert!(per_file <= 20 << 10, "{per_file} bytes of WAL per file");
}

/// A request's own reads (an inode, a name, an inode with one xattr) go
/// through the reader connection: they never wait for the writer's,
/// which another file's commit (and, for `durable`, its sync) holds.
#[test]
fn reads_do_not_wait_for_a_commit_under_way() {
    let d = tempfile::tempdir().unwrap();
    let m = std::sync::Arc::new(MetaStore::open(&d.path().join("m.db"), 0, 0).unwrap());
    let f = m.create(ROOT_INO, b"f", node(Kind::File)).unwrap();
    let held = lock(&m.conn);
    let (tx, rx) = std::sync::mpsc::channel();
    let m2 = m.clone();
    let t = std::thread::spawn(move || {
        let got = (
            m2.get(f.ino).map(|i| i.ino),
            m2.lookup(ROOT_INO, b"f").map(|i| i.ino),
            m2.get_with_xattr(f.ino, b"user.x").map(|(i, x)| (i.ino, x)),
        );
        let _ = tx.send(got);
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(10));
    drop(held);
    t.join().unwrap();
    let (a, b, c) = got.expect("reads waited for the writer's connection");
    assert_eq!(a.unwrap(), f.ino);
    assert_eq!(b.unwrap(), f.ino);
    assert_eq!(c.unwrap(), (f.ino, None));
}

/// A database made with 4 KiB pages (by an older leasefs) keeps them: in
/// WAL mode SQLite cannot change the page size, and the store does not
/// try (no rewrite of a large database at a mount).
#[test]
fn a_database_made_with_larger_pages_keeps_them() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    {
        let old = Connection::open(&p).unwrap();
        old.pragma_update(None, "page_size", 4096).unwrap();
        old.pragma_update(None, "journal_mode", "WAL").unwrap();
        old.execute_batch("CREATE TABLE t(x)").unwrap();
    }
    let page_size = |m: &MetaStore| -> i64 {
        lock(&m.conn)
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap()
    };
    let m = MetaStore::open(&p, 0, 0).unwrap();
    assert_eq!(page_size(&m), 4096);
    let f = m.create(ROOT_INO, b"f", node(Kind::File)).unwrap();
    drop(m);
    let m = MetaStore::open(&p, 0, 0).unwrap();
    assert_eq!(m.lookup(ROOT_INO, b"f").unwrap().ino, f.ino);
    let fresh = MetaStore::open(&d.path().join("new.db"), 0, 0).unwrap();
    assert_eq!(page_size(&fresh), PAGE_SIZE);
}

/// Closed, the store leaves no WAL: its last connection to close (the
/// writing one) copies everything into the database and removes the
/// WAL, as SQLite does at the last close.
#[test]
fn a_closed_store_leaves_everything_in_the_database() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.db");
    {
        let m = MetaStore::open(&p, 0, 0).unwrap();
        for i in 0..50 {
            m.create(ROOT_INO, format!("f{i}").as_bytes(), node(Kind::File))
                .unwrap();
        }
        m.get(ROOT_INO).unwrap();
    }
    assert!(!d.path().join("m.db-wal").exists(), "a WAL is left");
    let m = MetaStore::open(&p, 0, 0).unwrap();
    assert!(m.lookup(ROOT_INO, b"f49").is_ok());
}

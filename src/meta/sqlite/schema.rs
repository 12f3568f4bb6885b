//! The SQLite schema, and the upgrade of databases an older leasefs made.
//! Times are nanoseconds since the Unix epoch.

use rusqlite::Connection;

use crate::error::FsResult;

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inodes(
  ino INTEGER PRIMARY KEY,
  kind INTEGER NOT NULL,
  mode INTEGER NOT NULL,
  uid INTEGER NOT NULL,
  gid INTEGER NOT NULL,
  nlink INTEGER NOT NULL,
  size INTEGER NOT NULL DEFAULT 0,
  rdev INTEGER NOT NULL DEFAULT 0,
  atime INTEGER NOT NULL,
  mtime INTEGER NOT NULL,
  ctime INTEGER NOT NULL,
  crtime INTEGER NOT NULL,
  block_size INTEGER NOT NULL DEFAULT 0,
  last_epoch INTEGER NOT NULL DEFAULT 0,
  target BLOB
);
CREATE TABLE IF NOT EXISTS dentries(
  parent INTEGER NOT NULL,
  name BLOB NOT NULL,
  ino INTEGER NOT NULL,
  cookie INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(parent, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xattrs(
  ino INTEGER NOT NULL,
  name BLOB NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY(ino, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blocks(
  ino INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  block_id INTEGER NOT NULL,
  gs INTEGER NOT NULL,
  len INTEGER NOT NULL,
  finalized INTEGER NOT NULL,
  replicas TEXT NOT NULL,
  PRIMARY KEY(ino, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_by_id ON blocks(block_id);
CREATE TABLE IF NOT EXISTS block_journal(
  block_id INTEGER PRIMARY KEY,
  gs INTEGER NOT NULL,
  data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS under_construction(
  ino INTEGER PRIMARY KEY,
  holder TEXT NOT NULL,
  pid INTEGER NOT NULL,
  comm TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  mount_id TEXT NOT NULL,
  since_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS election_audit(
  id INTEGER PRIMARY KEY,
  election TEXT NOT NULL,
  event TEXT NOT NULL,
  who TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  at_ms INTEGER NOT NULL,
  why TEXT NOT NULL,
  uid INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS election_audit_by_election ON election_audit(election, id);
CREATE TABLE IF NOT EXISTS election_fences(
  owner TEXT NOT NULL,
  pgid INTEGER NOT NULL,
  start_ticks INTEGER NOT NULL,
  boot_id TEXT NOT NULL,
  cgroup TEXT,
  leader TEXT NOT NULL,
  ino INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  who TEXT NOT NULL,
  pid INTEGER NOT NULL,
  PRIMARY KEY(owner, pgid)
);
CREATE TABLE IF NOT EXISTS datanodes(
  id INTEGER PRIMARY KEY,
  storage_id TEXT UNIQUE,
  path TEXT NOT NULL,
  state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS datanode_claims(
  path TEXT PRIMARY KEY,
  storage_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings(
  name TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters(
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters VALUES('next_ino', 2), ('next_block', 1), ('next_gs', 1000), ('epoch_reserved', 0), ('next_cookie', 3);
";

/// The positional layout's `datanodes(idx, path)` table becomes the
/// registry: each row keeps its id (its old place in the `--datanode`
/// list, which block rows name) and awaits an identity file. One
/// transaction, so a crash leaves either table whole.
pub const UPGRADE_POSITIONAL_DATANODES: &str = "
BEGIN;
ALTER TABLE datanodes RENAME TO datanodes_positional;
CREATE TABLE datanodes(
  id INTEGER PRIMARY KEY,
  storage_id TEXT UNIQUE,
  path TEXT NOT NULL,
  state TEXT NOT NULL
);
INSERT INTO datanodes(id, storage_id, path, state)
  SELECT idx, NULL, path, 'upgrading' FROM datanodes_positional;
DROP TABLE datanodes_positional;
COMMIT;
";

/// Indexes on columns an upgrade may have to add first, and indexes
/// older databases lack (made at the next open). `dentries_by_ino`: a
/// file's path is found from its inode (`first_name`, `first_parent`);
/// without it each look-up scanned every entry, and the orphan sweep at
/// mount, which names the file of every block, took minutes with 200,000
/// entries on a cold cache.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS dentries_by_cookie ON dentries(parent, cookie);
CREATE INDEX IF NOT EXISTS dentries_by_ino ON dentries(ino);
CREATE INDEX IF NOT EXISTS election_audit_by_uid ON election_audit(uid, id);
";

/// Adds what older databases lack, in one transaction: directory entries
/// made before listing cookies existed get theirs (in name order, which
/// was the listing order then), and the cookie counter starts above them.
pub fn upgrade(c: &Connection) -> FsResult<()> {
    let has_cookie = c
        .prepare("SELECT 1 FROM pragma_table_info('dentries') WHERE name = 'cookie'")?
        .exists([])?;
    if !has_cookie {
        c.execute_batch(
            "BEGIN IMMEDIATE;
             ALTER TABLE dentries ADD COLUMN cookie INTEGER NOT NULL DEFAULT 0;
             CREATE TEMP TABLE numbered AS
               SELECT parent, name, 2 + row_number() OVER (ORDER BY parent, name) AS k
               FROM dentries;
             CREATE INDEX temp.numbered_by_name ON numbered(parent, name);
             UPDATE dentries SET cookie = (SELECT k FROM numbered n
               WHERE n.parent = dentries.parent AND n.name = dentries.name);
             UPDATE counters SET value = (SELECT COALESCE(MAX(k), 2) + 1 FROM numbered)
               WHERE name = 'next_cookie';
             DROP TABLE numbered;
             COMMIT;",
        )?;
    }
    // The user who recorded each election event (their events are
    // bounded); older events count as root's.
    let has_uid = c
        .prepare("SELECT 1 FROM pragma_table_info('election_audit') WHERE name = 'uid'")?
        .exists([])?;
    if !has_uid {
        c.execute_batch("ALTER TABLE election_audit ADD COLUMN uid INTEGER NOT NULL DEFAULT 0;")?;
    }
    c.execute_batch(INDEXES)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::meta::MetaStore;

    fn plan(db: &std::path::Path) -> String {
        let c = rusqlite::Connection::open(db).unwrap();
        let mut st = c
            .prepare("EXPLAIN QUERY PLAN SELECT parent, name FROM dentries WHERE ino = 7 LIMIT 1")
            .unwrap();
        st.query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .join("; ")
    }

    /// The path of an inode is an index look-up, in a new database and in
    /// one made before the index existed (added at its next open).
    #[test]
    fn an_inode_s_entry_is_found_through_an_index_in_new_and_older_databases() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        drop(MetaStore::open(&db, 0, 0).unwrap());
        assert!(plan(&db).contains("INDEX dentries_by_ino"), "{}", plan(&db));
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch("DROP INDEX dentries_by_ino")
            .unwrap();
        assert!(plan(&db).starts_with("SCAN"), "{}", plan(&db));
        drop(MetaStore::open(&db, 0, 0).unwrap());
        assert!(plan(&db).contains("INDEX dentries_by_ino"), "{}", plan(&db));
    }
}

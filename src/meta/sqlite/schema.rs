//! The SQLite schema. Times are nanoseconds since the Unix epoch.

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
  why TEXT NOT NULL
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
  idx INTEGER PRIMARY KEY,
  path TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters(
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters VALUES('next_ino', 2), ('next_block', 1), ('next_gs', 1000), ('epoch_reserved', 0);
";

//! [`DatanodeRegistry`] on SQLite: the registry (table `datanodes`), the
//! filesystem ID (table `settings`), the replication factor (a row of
//! `counters`), the upgrade of the positional layout's
//! `datanodes(idx, path)` table into the registry, and the removal of a
//! datanode from every block row.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

use super::{MetaStore, blocks, row_to_block, schema};
use crate::error::{FsError, FsResult};
use crate::meta::registry::DatanodeRegistry;
use crate::meta::types::{AdminState, BlockRow, DatanodeRecord, DnId};
use crate::sync::lock;

impl DatanodeRegistry for MetaStore {
    fn filesystem_id(&self) -> FsResult<String> {
        filesystem_id(&lock(&self.conn))
    }

    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>> {
        records(&lock(&self.conn))
    }

    /// Host-local copies are refused: they mean something only to
    /// daemons on several hosts, which share a namespace over etcd.
    fn register_datanode(
        &self,
        storage_id: &str,
        path: &Path,
        host: Option<&str>,
    ) -> FsResult<DnId> {
        if host.is_some() {
            return Err(FsError::Invalid(LOCAL_COPY_NEEDS_ETCD.into()));
        }
        self.durable(|tx| register(tx, storage_id, path))
    }

    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String> {
        self.durable(|tx| claim_legacy(tx, id, storage_id))
    }

    fn claim_storage_id(&self, path: &Path, storage_id: &str) -> FsResult<String> {
        self.durable(|tx| claim_new(tx, path, storage_id))
    }

    fn set_datanode_state(
        &self,
        id: DnId,
        from: &[AdminState],
        to: AdminState,
    ) -> FsResult<AdminState> {
        self.durable(|tx| set_state(tx, id, from, to))
    }

    fn remove_datanode(&self, id: DnId) -> FsResult<()> {
        self.durable(|tx| remove(tx, id))
    }

    /// A row of the `counters` table.
    fn set_replication(&self, replication: usize) -> FsResult<()> {
        self.with_tx(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO counters VALUES('replication', ?1)",
                [replication as i64],
            )?;
            Ok(())
        })
    }

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
}

/// At open: upgrades an earlier schema in place and creates the
/// filesystem ID if the database has none yet.
pub(super) fn init(c: &Connection) -> FsResult<()> {
    let positional = c
        .prepare("SELECT 1 FROM pragma_table_info('datanodes') WHERE name = 'idx'")?
        .exists([])?;
    if positional {
        c.execute_batch(schema::UPGRADE_POSITIONAL_DATANODES)
            .inspect_err(|_| {
                let _ = c.execute_batch("ROLLBACK");
            })?;
        tracing::info!("datanode registry created from the positional datanode list");
    }
    c.execute(
        "INSERT OR IGNORE INTO settings VALUES('filesystem_id', ?1)",
        [crate::storage::identity::new_filesystem_id()],
    )?;
    Ok(())
}

/// Why a SQLite store records no host-local copy.
pub const LOCAL_COPY_NEEDS_ETCD: &str = "host-local copies (-o local_copy) need a namespace shared over etcd (--meta etcd://...): a SQLite store serves one host";

fn row_to_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<DatanodeRecord> {
    let state: String = r.get(3)?;
    Ok(DatanodeRecord {
        id: DnId(r.get::<_, i64>(0)? as u32),
        storage_id: r.get(1)?,
        path: PathBuf::from(r.get::<_, String>(2)?),
        // An unknown state (a later release's) keeps the datanode out of
        // any upgrade.
        state: AdminState::parse(&state).unwrap_or(AdminState::Normal),
        host: None,
    })
}

fn filesystem_id(c: &Connection) -> FsResult<String> {
    Ok(c.query_row(
        "SELECT value FROM settings WHERE name = 'filesystem_id'",
        [],
        |r| r.get(0),
    )?)
}

fn records(c: &Connection) -> FsResult<Vec<DatanodeRecord>> {
    let mut st = c.prepare("SELECT id, storage_id, path, state FROM datanodes ORDER BY id")?;
    let rows = st.query_map([], row_to_record)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// [`DatanodeRegistry::register_datanode`], in transaction `tx`.
fn register(tx: &Connection, storage_id: &str, path: &Path) -> FsResult<DnId> {
    let path = path.to_string_lossy();
    let known: Option<i64> = tx
        .query_row(
            "SELECT id FROM datanodes WHERE storage_id = ?1",
            [storage_id],
            |r| r.get(0),
        )
        .optional()?;
    let id = match known {
        Some(id) => {
            tx.execute(
                "UPDATE datanodes SET path = ?2, state = CASE state WHEN 'upgrading' THEN 'normal' ELSE state END WHERE id = ?1",
                params![id, path],
            )?;
            id
        }
        None => tx.query_row(
            "INSERT INTO datanodes(id, storage_id, path, state)
               SELECT COALESCE(MAX(id) + 1, 0), ?1, ?2, 'normal' FROM datanodes
             RETURNING id",
            params![storage_id, path],
            |r| r.get(0),
        )?,
    };
    Ok(DnId(id as u32))
}

/// [`DatanodeRegistry::claim_legacy_datanode`], in transaction `tx`.
fn claim_legacy(tx: &Connection, id: DnId, storage_id: &str) -> FsResult<String> {
    tx.execute(
        "UPDATE datanodes SET storage_id = ?2 WHERE id = ?1 AND storage_id IS NULL",
        params![id.0 as i64, storage_id],
    )?;
    tx.query_row(
        "SELECT storage_id FROM datanodes WHERE id = ?1",
        [id.0 as i64],
        |r| r.get::<_, Option<String>>(0),
    )
    .optional()?
    .flatten()
    .ok_or_else(|| FsError::Meta(format!("datanode {id} is not recorded")))
}

/// [`DatanodeRegistry::claim_storage_id`], in transaction `tx` (table
/// `datanode_claims`).
fn claim_new(tx: &Connection, path: &Path, storage_id: &str) -> FsResult<String> {
    let path = path.to_string_lossy();
    let open: Option<String> = tx
        .query_row(
            "SELECT storage_id FROM datanode_claims c WHERE path = ?1
               AND NOT EXISTS (SELECT 1 FROM datanodes d WHERE d.storage_id = c.storage_id)",
            [&path],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(sid) = open {
        return Ok(sid);
    }
    tx.execute(
        "INSERT OR REPLACE INTO datanode_claims(path, storage_id) VALUES(?1, ?2)",
        params![path, storage_id],
    )?;
    Ok(storage_id.to_string())
}

/// [`DatanodeRegistry::set_datanode_state`], in transaction `tx`.
fn set_state(
    tx: &Connection,
    id: DnId,
    from: &[AdminState],
    to: AdminState,
) -> FsResult<AdminState> {
    let was: String = tx
        .query_row(
            "SELECT state FROM datanodes WHERE id = ?1",
            [id.0 as i64],
            |r| r.get(0),
        )
        .optional()?
        .ok_or(FsError::NotFound)?;
    let was = AdminState::parse(&was).unwrap_or(AdminState::Normal);
    if from.contains(&was) {
        tx.execute(
            "UPDATE datanodes SET state = ?2 WHERE id = ?1",
            params![id.0 as i64, to.as_str()],
        )?;
    }
    Ok(was)
}

/// [`DatanodeRegistry::remove_datanode`], in transaction `tx`: the
/// tombstone and every row rewritten at once.
fn remove(tx: &Connection, id: DnId) -> FsResult<()> {
    let n = tx.execute(
        "UPDATE datanodes SET state = 'removed' WHERE id = ?1",
        [id.0 as i64],
    )?;
    if n == 0 {
        return Err(FsError::NotFound);
    }
    let rows: Vec<BlockRow> = {
        let mut st = tx.prepare(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks
             WHERE ',' || replicas || ',' LIKE '%,' || ?1 || ',%'",
        )?;
        st.query_map([id.0 as i64], row_to_block)?
            .collect::<Result<_, _>>()?
    };
    for mut b in rows {
        b.replicas.retain(|d| *d != id);
        blocks::put_block(tx, &b)?;
    }
    Ok(())
}

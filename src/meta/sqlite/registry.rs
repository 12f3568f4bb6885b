//! The datanode registry in SQLite (table `datanodes`), the filesystem ID
//! (table `settings`), and the upgrade of the positional layout's
//! `datanodes(idx, path)` table into the registry.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

use super::schema;
use crate::error::{FsError, FsResult};
use crate::meta::types::{AdminState, DatanodeRecord, DnId};

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

fn row_to_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<DatanodeRecord> {
    let state: String = r.get(3)?;
    Ok(DatanodeRecord {
        id: DnId(r.get::<_, i64>(0)? as u32),
        storage_id: r.get(1)?,
        path: PathBuf::from(r.get::<_, String>(2)?),
        // An unknown state (a later release's) keeps the datanode out of
        // any upgrade.
        state: AdminState::parse(&state).unwrap_or(AdminState::Normal),
    })
}

pub(super) fn filesystem_id(c: &Connection) -> FsResult<String> {
    Ok(c.query_row(
        "SELECT value FROM settings WHERE name = 'filesystem_id'",
        [],
        |r| r.get(0),
    )?)
}

pub(super) fn records(c: &Connection) -> FsResult<Vec<DatanodeRecord>> {
    let mut st = c.prepare("SELECT id, storage_id, path, state FROM datanodes ORDER BY id")?;
    let rows = st.query_map([], row_to_record)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// [`crate::meta::Meta::register_datanode`], in transaction `tx`.
pub(super) fn register(tx: &Connection, storage_id: &str, path: &Path) -> FsResult<DnId> {
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

/// [`crate::meta::Meta::claim_legacy_datanode`], in transaction `tx`.
pub(super) fn claim_legacy(tx: &Connection, id: DnId, storage_id: &str) -> FsResult<String> {
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

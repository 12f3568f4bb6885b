//! [`DatanodeRegistry`] on etcd: records `dn/<id>`, the filesystem ID
//! `fsid`, the replication factor (counter `c/replication`), the upgrade
//! of the positional layout's `dn` record, and the removal of a datanode
//! from every block row.

use std::path::Path;

use super::EtcdMeta;
use super::records::*;
use super::stm::Stm;
use crate::error::{FsError, FsResult};
use crate::meta::blockmap::BlockMap;
use crate::meta::registry::DatanodeRegistry;
use crate::meta::types::*;

impl DatanodeRegistry for EtcdMeta {
    fn filesystem_id(&self) -> FsResult<String> {
        let v = self
            .run(|s| s.get(FILESYSTEM_ID))?
            .ok_or_else(|| FsError::Meta("the filesystem ID is missing in etcd".into()))?;
        String::from_utf8(v).map_err(|_| FsError::Meta("corrupt filesystem ID in etcd".into()))
    }

    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>> {
        self.run(|s| {
            Ok(s.scan_json::<DatanodeRecord>(DATANODES)?
                .into_iter()
                .map(|(_, r)| r)
                .collect())
        })
    }

    fn register_datanode(
        &self,
        storage_id: &str,
        path: &Path,
        host: Option<&str>,
    ) -> FsResult<DnId> {
        self.run(|s| register_datanode(s, storage_id, path, host))
    }

    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String> {
        self.run(|s| claim_legacy_datanode(s, id, storage_id))
    }

    fn claim_storage_id(&self, path: &Path, storage_id: &str) -> FsResult<String> {
        self.run(|s| claim_storage_id(s, path, storage_id))
    }

    fn set_datanode_state(
        &self,
        id: DnId,
        from: &[AdminState],
        to: AdminState,
    ) -> FsResult<AdminState> {
        self.run(|s| set_datanode_state(s, id, from, to))
    }

    /// The tombstone first (one transaction), then the rows that list the
    /// datanode, a page per transaction.
    fn remove_datanode(&self, id: DnId) -> FsResult<()> {
        self.run(|s| {
            set_datanode_state(
                s,
                id,
                &[
                    AdminState::Upgrading,
                    AdminState::Normal,
                    AdminState::Decommissioning,
                    AdminState::Decommissioned,
                    AdminState::Removed,
                ],
                AdminState::Removed,
            )
        })?;
        let keys: Vec<(u64, u64)> = self
            .all_blocks()?
            .into_iter()
            .filter(|b| b.replicas.contains(&id))
            .map(|b| (b.ino, b.idx))
            .collect();
        for page in keys.chunks(SCRUB_PAGE) {
            self.run(|s| scrub_rows(s, id, page))?;
        }
        Ok(())
    }

    fn set_replication(&self, replication: usize) -> FsResult<()> {
        self.run(|s| {
            s.set_counter(REPLICATION, replication as u64);
            Ok(())
        })
    }

    fn replication(&self) -> FsResult<Option<usize>> {
        Ok(self.run(|s| s.counter(REPLICATION))?.map(|r| r as usize))
    }
}

/// Turns the positional layout's datanode list into registry records:
/// each keeps its place as its id and awaits an identity file.
pub(super) fn upgrade_positional_datanodes(s: &mut Stm<'_>) -> FsResult<()> {
    let Some(old) = s.get_json::<PositionalDatanodes>(POSITIONAL_DATANODES)? else {
        return Ok(());
    };
    for (i, dir) in old.dirs.iter().enumerate() {
        let id = DnId(i as u32);
        if s.get(&datanode_key(id))?.is_none() {
            let rec = DatanodeRecord {
                id,
                storage_id: None,
                path: dir.into(),
                state: AdminState::Upgrading,
                host: None,
            };
            s.put_json(&datanode_key(id), &rec)?;
        }
    }
    if let Some(r) = old.replication
        && s.counter(REPLICATION)?.is_none()
    {
        s.set_counter(REPLICATION, r as u64);
    }
    s.delete(POSITIONAL_DATANODES);
    Ok(())
}

/// The counter holding the replication factor of the last mount.
const REPLICATION: &str = "replication";

/// [`DatanodeRegistry::register_datanode`] in one attempt.
fn register_datanode(
    s: &mut Stm<'_>,
    storage_id: &str,
    path: &Path,
    host: Option<&str>,
) -> FsResult<DnId> {
    let all: Vec<DatanodeRecord> = s
        .scan_json(DATANODES)?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let mut rec = match all
        .iter()
        .find(|r| r.storage_id.as_deref() == Some(storage_id))
    {
        Some(r) => r.clone(),
        None => DatanodeRecord {
            id: DnId(all.iter().map(|r| r.id.0 + 1).max().unwrap_or(0)),
            storage_id: Some(storage_id.to_string()),
            path: path.to_path_buf(),
            state: AdminState::Normal,
            host: None,
        },
    };
    rec.path = path.to_path_buf();
    rec.host = host.map(str::to_string);
    if rec.state == AdminState::Upgrading {
        rec.state = AdminState::Normal;
    }
    s.put_json(&datanode_key(rec.id), &rec)?;
    Ok(rec.id)
}

/// [`DatanodeRegistry::claim_legacy_datanode`] in one attempt.
fn claim_legacy_datanode(s: &mut Stm<'_>, id: DnId, storage_id: &str) -> FsResult<String> {
    let key = datanode_key(id);
    let mut rec: DatanodeRecord = s
        .get_json(&key)?
        .ok_or_else(|| FsError::Meta(format!("datanode {id} is not recorded")))?;
    if let Some(sid) = &rec.storage_id {
        return Ok(sid.clone());
    }
    rec.storage_id = Some(storage_id.to_string());
    s.put_json(&key, &rec)?;
    Ok(storage_id.to_string())
}

/// [`DatanodeRegistry::claim_storage_id`] in one attempt (key
/// `dnclaim/<path hex>`; the registry is read in the same transaction,
/// so a claim and a registration never cross).
fn claim_storage_id(s: &mut Stm<'_>, path: &Path, storage_id: &str) -> FsResult<String> {
    let key = claim_key(path);
    if let Some(v) = s.get(&key)? {
        let sid = String::from_utf8(v)
            .map_err(|_| FsError::Meta(format!("corrupt datanode claim {key}")))?;
        let taken = s
            .scan_json::<DatanodeRecord>(DATANODES)?
            .iter()
            .any(|(_, r)| r.storage_id.as_deref() == Some(&*sid));
        if !taken {
            return Ok(sid);
        }
    }
    s.put(&key, storage_id.as_bytes().to_vec());
    Ok(storage_id.to_string())
}

/// [`DatanodeRegistry::set_datanode_state`] in one attempt.
fn set_datanode_state(
    s: &mut Stm<'_>,
    id: DnId,
    from: &[AdminState],
    to: AdminState,
) -> FsResult<AdminState> {
    let key = datanode_key(id);
    let mut rec: DatanodeRecord = s.get_json(&key)?.ok_or(FsError::NotFound)?;
    let was = rec.state;
    if from.contains(&was) {
        rec.state = to;
        s.put_json(&key, &rec)?;
    }
    Ok(was)
}

/// Rows rewritten per transaction when a removed datanode leaves the
/// block rows: two keys read and written each, well within etcd's bound
/// on operations per transaction.
const SCRUB_PAGE: usize = 40;

/// Drops `id` from the rows `keys` that still list it, in one attempt.
fn scrub_rows(s: &mut Stm<'_>, id: DnId, keys: &[(u64, u64)]) -> FsResult<()> {
    for &(ino, idx) in keys {
        let Some(mut b) = s.get_json::<BlockRow>(&block_key(ino, idx))? else {
            continue;
        };
        if b.replicas.contains(&id) {
            b.replicas.retain(|d| *d != id);
            s.put_json(&block_key(ino, idx), &b)?;
        }
    }
    Ok(())
}

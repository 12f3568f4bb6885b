//! Listing, deletion, copies, quarantine and the heartbeat of an
//! object-store datanode. Nothing here deletes on a guess: the block's
//! own objects go only where the [`crate::storage::Storage`] method asks
//! for it (the metadata said no block needs them), as replica files do.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::api::Storage;
use super::super::checksum::{CHUNK_SIZE, chunk_crcs};
use super::super::error::StorageError;
use super::super::layout::{ReplicaInfo, ReplicaState};
use super::super::quarantine::Quarantined;
use super::ObjectDatanode;
use super::keys::{self, BlockObjects, FINAL, GEN, QUARANTINE, SliceName};
use super::writer::encode_slice;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ObjectDatanode {
    pub(super) fn info_of(
        &self,
        block: u64,
        objs: &BlockObjects,
    ) -> Result<Option<ReplicaInfo>, StorageError> {
        let Some((gs, g)) = objs.current() else {
            return Ok(None);
        };
        let ext = self.extents(block, gs, g)?;
        let path = self.bucket.path_of(&keys::gen_dir(block, gs));
        Ok(Some(ReplicaInfo {
            block,
            gs,
            state: g.state(),
            data_len: keys::len_of(&ext),
            data_path: path.clone(),
            meta_path: path,
        }))
    }

    /// Every replica: one listing of `blk/` (paged by the client).
    pub(super) fn list_all(&self) -> Result<Vec<ReplicaInfo>, StorageError> {
        let listed = self.bucket.list(keys::BLK)?;
        let mut out = Vec::new();
        for (block, l) in keys::group_by_block(listed) {
            let objs = BlockObjects::from_listing(block, &l);
            // A damaged replica is still listed (fsck reads and reports it).
            match self.info_of(block, &objs) {
                Ok(Some(i)) => out.push(i),
                Ok(None) => {}
                Err(_) => {
                    if let Some((gs, g)) = objs.current() {
                        let path = self.bucket.path_of(&keys::gen_dir(block, gs));
                        out.push(ReplicaInfo {
                            block,
                            gs,
                            state: g.state(),
                            data_len: 0,
                            data_path: path.clone(),
                            meta_path: path,
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Removes the replica recorded at `gs`, and older leftovers; a newer
    /// replica (a writer reopened the block since) is left alone.
    pub(super) fn delete_recorded_at(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        let objs = self.scan(block)?;
        if objs.gens.keys().any(|g| *g > gs) {
            for k in objs
                .gens
                .keys()
                .filter(|g| **g <= gs)
                .flat_map(|g| objs.keys_of(block, *g).cloned().collect::<Vec<_>>())
            {
                self.bucket.delete(&k)?;
            }
            return Ok(());
        }
        self.delete_all(&objs)
    }

    /// Copies `len` bytes of `src`'s replica `from` (verified while read)
    /// into replica `to` here, in `state`: one slice, then its markers;
    /// then what it replaces goes.
    pub(super) fn copy_in(
        &self,
        src: &dyn Storage,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        let (block, gs) = to;
        // Checked first: a newer replica here is never replaced.
        let objs = self.scan(block)?;
        if let Some(found) = objs.current().map(|(g, _)| g).filter(|f| *f > gs) {
            return Err(StorageError::NewerReplica {
                block,
                found,
                copying: gs,
            });
        }
        let reader = src.open_reader(from.0, from.1)?;
        let mut data = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        let mut off = 0usize;
        while off < data.len() {
            let end = (off + (1 << 20)).min(data.len());
            let n = reader.read(off as u64, &mut data[off..end])?;
            if n == 0 {
                return Err(StorageError::TooShort {
                    block: from.0,
                    replica: reader.data_path().to_path_buf(),
                    len: off as u64,
                    wanted: len,
                });
            }
            off += n;
        }
        let seq = objs
            .gens
            .get(&gs)
            .and_then(|g| g.slices.keys().next_back().map(|s| s + 1))
            .unwrap_or(0);
        let s = SliceName {
            seq,
            start: 0,
            end: len,
        };
        let mut crcs = Vec::with_capacity(data.len() / CHUNK_SIZE + 1);
        chunk_crcs(&data, &mut crcs);
        self.bucket.put(
            &keys::slice_key(block, gs, &s),
            encode_slice(&crcs, &[&data]),
        )?;
        self.io.wrote(len);
        self.bucket.put(&keys::marker(block, gs, GEN), Vec::new())?;
        match state {
            ReplicaState::Finalized => self
                .bucket
                .put(&keys::marker(block, gs, FINAL), Vec::new())?,
            ReplicaState::Rbw => self.bucket.delete(&keys::marker(block, gs, FINAL))?,
        }
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, gs)?;
        self.prune(&objs, block, gs, &g)
    }

    /// Copies the objects of `block` (generation `only`, or all) under
    /// `quarantine/<secs>-blk_<id>/`; returns that place.
    pub(super) fn copy_to_quarantine(
        &self,
        block: u64,
        only: Option<u64>,
    ) -> Result<(PathBuf, BlockObjects), StorageError> {
        let objs = self.scan(block)?;
        let dir = format!("{QUARANTINE}/{}-blk_{block}", now_secs());
        let from = format!("{}/", keys::block_dir(block));
        let gen_dir = only.map(|gs| format!("{}/", keys::gen_dir(block, gs)));
        for k in &objs.keys {
            if gen_dir.as_ref().is_some_and(|d| !k.starts_with(d)) {
                continue;
            }
            if let Some(rest) = k.strip_prefix(&from) {
                self.bucket.copy(k, &format!("{dir}/{rest}"))?;
            }
        }
        Ok((self.bucket.path_of(&dir), objs))
    }

    pub(super) fn quarantine_block(&self, block: u64) -> Result<PathBuf, StorageError> {
        let (to, objs) = self.copy_to_quarantine(block, None)?;
        self.delete_all(&objs)?;
        Ok(to)
    }

    /// Quarantine entries (`<secs>-blk_<id>`), oldest first, with their keys.
    fn quarantine_entries(&self) -> Result<Vec<(Quarantined, Vec<String>)>, StorageError> {
        let mut m: std::collections::BTreeMap<(u64, u64), Vec<String>> = Default::default();
        for l in self.bucket.list(QUARANTINE)? {
            let entry = l
                .rel
                .strip_prefix(QUARANTINE)
                .and_then(|r| r.strip_prefix('/'))
                .and_then(|r| r.split('/').next())
                .and_then(|e| e.split_once("-blk_"))
                .and_then(|(s, b)| Some((s.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
            if let Some(e) = entry {
                m.entry(e).or_default().push(l.rel);
            }
        }
        Ok(m.into_iter()
            .map(|((since, block), keys)| {
                let path = self
                    .bucket
                    .path_of(&format!("{QUARANTINE}/{since}-blk_{block}"));
                (Quarantined { path, block, since }, keys)
            })
            .collect())
    }

    pub(super) fn quarantine_list(&self) -> Result<Vec<Quarantined>, StorageError> {
        Ok(self
            .quarantine_entries()?
            .into_iter()
            .map(|(q, _)| q)
            .collect())
    }

    pub(super) fn quarantine_expire(&self, keep: Duration) -> Result<usize, StorageError> {
        let cutoff = now_secs().saturating_sub(keep.as_secs());
        let mut n = 0;
        for (q, keys) in self.quarantine_entries()? {
            if q.since < cutoff {
                for k in keys {
                    self.bucket.delete(&k)?;
                }
                n += 1;
            }
        }
        Ok(n)
    }
}

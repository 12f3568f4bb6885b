//! Object-store datanodes: a bucket and prefix of an S3-compatible store
//! (`--datanode s3://BUCKET/PREFIX`) holding replicas, so that daemons on
//! several hosts share data through the store alone. [`ObjectDatanode`]
//! implements [`Storage`] on it; the layout is in [`keys`] and, with its
//! costs in requests, in docs/SEMANTICS.md ("Object-store datanodes").
//!
//! | module | owns |
//! |---|---|
//! | [`settings`] | the URL, endpoint, region and credentials |
//! | [`bucket`] | the client, its runtime, synchronous requests |
//! | [`keys`] | key names; a block's objects and the bytes they make |
//! | [`writer`], [`reader`] | a replica's appends (a slice per packet); verified reads |
//! | `ops` | the replica lifecycle |
//! | `maint` | listing, deletion, copies, quarantine |

pub mod bucket;
pub mod keys;
mod maint;
mod ops;
pub mod reader;
pub mod settings;
pub mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::{Capacity, ReplicaWrite, Storage};
use super::error::StorageError;
use super::identity::Identity;
use super::layout::{DnId, ReplicaInfo, ReplicaStat, ReplicaState};
use super::quarantine::Quarantined;
use super::reader::ReplicaReader;
use crate::metrics::IoCounters;
use crate::sync::Arc;
use bucket::Bucket;
pub use settings::{S3Options, S3Url, is_s3, parse_url};

/// What the heartbeat reports as free: an object store has no size a
/// client can ask (1 PiB, so that placement never takes it for full).
pub const FREE_BYTES: u64 = 1 << 50;

/// A datanode on a bucket and prefix.
#[derive(Debug)]
pub struct ObjectDatanode {
    id: DnId,
    /// `s3://bucket/prefix`, what the registry records as its path.
    root: PathBuf,
    bucket: Arc<Bucket>,
    identity: Option<Identity>,
    io: Arc<IoCounters>,
    /// A number of its own for [`Storage::fs_id`] (no device is shared
    /// with a directory's).
    fs_id: u64,
    /// `-o s3_capacity=` of the mount that opened it (`None`: unbounded).
    quota: Option<u64>,
}

/// Opens the bucket of `url` with `opts` (no request yet).
pub fn connect(url: &S3Url, opts: &S3Options) -> Result<Arc<Bucket>, StorageError> {
    let store = settings::build_store(url, opts)?;
    let retry = opts
        .retry_timeout
        .unwrap_or(settings::DEFAULT_RETRY_TIMEOUT);
    Ok(Arc::new(
        Bucket::new(store, url.to_url(), url.prefix.clone())?.retrying_for(retry),
    ))
}

/// The most bytes of queued packets one slice PUT carries (the in-flight
/// bound, 80 packets of 64 KiB by default, is below it).
const MERGE_WRITES: usize = 8 << 20;

/// The identity object of the prefix, if any.
pub fn read_identity(b: &Bucket) -> Result<Option<Identity>, StorageError> {
    match b.get(keys::VERSION)? {
        None => Ok(None),
        Some(bytes) => {
            let path = b.path_of(keys::VERSION);
            let text = String::from_utf8(bytes).map_err(|_| StorageError::BadIdentity {
                path: path.clone(),
                reason: "not UTF-8".into(),
            })?;
            Identity::decode(&path, &text).map(Some)
        }
    }
}

/// Writes the identity object unless one is there, and returns the one
/// that is there after (read back after the write). The PUT is
/// conditional: on a store that honours `If-None-Match` only the first
/// writer creates it. Garage 2.5.0 ignores the header (the last PUT wins),
/// so there two daemons that attach a new prefix at once agree only
/// because they write the same `id`: the daemons of one filesystem take
/// it from the namespace's claim (`DatanodeRegistry::claim_storage_id`)
/// before calling this (docs/SEMANTICS.md, "Object-store datanodes",
/// *Identity*).
pub fn create_identity(b: &Bucket, id: &Identity) -> Result<Identity, StorageError> {
    if let Some(found) = read_identity(b)? {
        return Ok(found);
    }
    b.put_new(keys::VERSION, id.encode().into_bytes())?;
    read_identity(b)?.ok_or_else(|| StorageError::BadIdentity {
        path: b.path_of(keys::VERSION),
        reason: "written, then not found".into(),
    })
}

/// Whether the prefix holds replica objects (a prefix without an identity
/// object that holds some is never taken for a new datanode).
pub fn holds_objects(b: &Bucket) -> Result<bool, StorageError> {
    Ok(!b.list(keys::BLK)?.is_empty())
}

impl ObjectDatanode {
    /// The datanode `id` on `bucket`, whose identity object says `identity`.
    pub fn open(id: DnId, bucket: Arc<Bucket>, identity: Option<Identity>) -> ObjectDatanode {
        let root = PathBuf::from(bucket.url());
        let fs_id = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bucket.url().hash(&mut h);
            h.finish() | (1 << 63)
        };
        ObjectDatanode {
            id,
            root,
            bucket,
            identity,
            io: Arc::default(),
            fs_id,
            quota: settings::installed().capacity,
        }
    }

    /// Opens `url` (`s3://…`) with the mount's options.
    pub fn open_url(
        id: DnId,
        url: &Path,
        identity: Option<Identity>,
    ) -> Result<ObjectDatanode, StorageError> {
        let s = url.to_str().unwrap_or_default();
        let u = parse_url(s).map_err(|why| StorageError::BadIdentity {
            path: url.to_path_buf(),
            reason: why,
        })?;
        Ok(Self::open(
            id,
            connect(&u, &settings::installed())?,
            identity,
        ))
    }

    pub fn bucket(&self) -> &Arc<Bucket> {
        &self.bucket
    }
}

impl Storage for ObjectDatanode {
    fn id(&self) -> DnId {
        self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn storage_id(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.storage_id.as_str())
    }

    fn io(&self) -> &Arc<IoCounters> {
        &self.io
    }

    fn create_rbw(&self, block: u64, gs: u64) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        Ok(Box::new(self.create(block, gs)?))
    }

    fn reopen_rbw(
        &self,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<Box<dyn ReplicaWrite>, StorageError> {
        Ok(Box::new(self.reopen(block, gs, len)?))
    }

    fn bump_gs(&self, block: u64, old_gs: u64, new_gs: u64) -> Result<(), StorageError> {
        self.restamp(block, old_gs, new_gs)
    }

    fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        ops_finalize(self, block, gs, len)
    }

    fn finalize_written(
        &self,
        w: Box<dyn ReplicaWrite>,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        w.finish()?;
        ops_finalize(self, block, gs, len)
    }

    fn write_finalized(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        let r = ObjectDatanode::write_finalized(self, block, gs, data, crcs);
        match &r {
            Ok(()) => self.io.wrote(data.len() as u64),
            Err(_) => self.io.error(),
        }
        r
    }

    fn truncate(&self, block: u64, gs: u64, new_gs: u64, len: u64) -> Result<(), StorageError> {
        ObjectDatanode::truncate(self, block, gs, new_gs, len)
    }

    fn open_reader(&self, block: u64, gs: u64) -> Result<ReplicaReader, StorageError> {
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, gs)?;
        Ok(ReplicaReader::from(self.reader_of(block, gs, &g)?))
    }

    fn lookup(&self, block: u64) -> Result<Option<ReplicaInfo>, StorageError> {
        let objs = self.scan(block)?;
        self.info_of(block, &objs)
    }

    fn stat_replica(&self, block: u64, gs: u64) -> Result<ReplicaStat, StorageError> {
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, gs)?;
        let ext = self.extents(block, gs, &g)?;
        Ok(ReplicaStat {
            state: g.state(),
            data_len: keys::len_of(&ext),
        })
    }

    fn list(&self) -> Result<Vec<ReplicaInfo>, StorageError> {
        self.list_all()
    }

    /// Since its newest object was written (another host's writer may be
    /// about to record it). Unknown (the store did not answer) counts as
    /// new: nothing is moved aside on a guess.
    fn replica_age(&self, info: &ReplicaInfo) -> Option<Duration> {
        let newest = self
            .bucket
            .list(&keys::gen_dir(info.block, info.gs))
            .ok()
            .and_then(|l| l.into_iter().filter_map(|o| o.modified).max());
        Some(newest.map_or(Duration::ZERO, |t| {
            std::time::SystemTime::now()
                .duration_since(t)
                .unwrap_or(Duration::ZERO)
        }))
    }

    fn delete(&self, block: u64) -> Result<(), StorageError> {
        let objs = self.scan(block)?;
        self.delete_all(&objs)
    }

    fn delete_recorded(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        self.delete_recorded_at(block, gs)
    }

    fn copy_replica_from(
        &self,
        src: &dyn Storage,
        block: u64,
        gs: u64,
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.copy_in(src, (block, gs), (block, gs), len, state)
    }

    fn copy_replica_as(
        &self,
        src: &dyn Storage,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        self.copy_in(src, from, to, len, state)
    }

    /// Copies assemble nothing outside their replica's keys: nothing to clean.
    fn clean_tmp(&self) -> Result<usize, StorageError> {
        Ok(0)
    }

    fn quarantine(&self, block: u64) -> Result<PathBuf, StorageError> {
        self.quarantine_block(block)
    }

    fn keep_copy(&self, block: u64, gs: u64) -> Result<PathBuf, StorageError> {
        self.copy_to_quarantine(block, Some(gs)).map(|(p, _)| p)
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, StorageError> {
        self.quarantine_list()
    }

    fn expire_quarantine(&self, keep: Duration) -> Result<usize, StorageError> {
        self.quarantine_expire(keep)
    }

    /// Every object was acknowledged by the store when written.
    fn sync_replica(&self, _block: u64, _gs: u64) -> Result<(), StorageError> {
        Ok(())
    }

    /// Nothing is cached to flush (see [`Self::sync_replica`]).
    fn sync_fs(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn fs_id(&self) -> u64 {
        self.fs_id
    }

    fn syncfs_is_barrier(&self) -> bool {
        false
    }

    /// Every object was whole when the store acknowledged it.
    fn may_tear(&self) -> bool {
        false
    }

    fn flushed_mark(&self) -> Result<Option<u64>, StorageError> {
        Ok(None)
    }

    fn set_flushed_mark(&self, _gs: u64) -> Result<(), StorageError> {
        Ok(())
    }

    fn sync_for_mark(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn ranged_sync(&self) -> bool {
        false
    }

    /// Queued packets go as one slice: a PUT costs a round trip (about
    /// 50 ms on a store nearby) whatever its size up to megabytes.
    fn merge_writes(&self) -> usize {
        MERGE_WRITES
    }

    fn capacity(&self) -> Capacity {
        Capacity::Store { quota: self.quota }
    }

    /// Reads the identity object back (still this datanode) and writes a
    /// probe object (writable).
    fn heartbeat(&self) -> Result<u64, StorageError> {
        if let Some(want) = &self.identity {
            let found = read_identity(&self.bucket)?;
            match found {
                Some(f)
                    if f.storage_id == want.storage_id && f.filesystem_id == want.filesystem_id => {
                }
                Some(f) => {
                    return Err(StorageError::OtherIdentity {
                        path: self.root.clone(),
                        found: f.storage_id,
                        wanted: want.storage_id.clone(),
                    });
                }
                None => {
                    create_identity(&self.bucket, want)?;
                }
            }
        }
        let who = self
            .identity
            .as_ref()
            .map_or_else(|| "unidentified".to_string(), |i| i.storage_id.clone());
        self.bucket.put(
            &format!("{}/{who}.{}", keys::PROBE, std::process::id()),
            b"leasefs heartbeat\n".to_vec(),
        )?;
        Ok(FREE_BYTES)
    }
}

fn ops_finalize(n: &ObjectDatanode, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
    ObjectDatanode::finalize(n, block, gs, len)
}

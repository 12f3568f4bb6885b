//! What every output stream of a mount shares ([`StreamCtx`]: the
//! metadata store, for block lists and fresh ids; the datanodes; the write
//! buffer; the statistics), what each stream's streamer knows of its file
//! ([`StreamFile`]), and the completion callback type of deferred stream
//! operations.

use super::budget::Budget;
use super::datanodes::Datanodes;
use super::ledger::SyncLedger;
use super::outcome::FileLog;
use super::reader::BadReplicas;
use crate::error::FsResult;
use crate::meta::Meta;
use crate::metrics::Metrics;
use crate::sync::Arc;

/// Completion of a deferred operation.
pub type Done = Box<dyn FnOnce(FsResult<()>) + Send>;

/// What every stream of a mount shares.
pub struct StreamCtx {
    pub meta: Arc<dyn Meta>,
    pub dns: Arc<Datanodes>,
    pub rt: tokio::runtime::Handle,
    pub packet_size: usize,
    pub max_in_flight: usize,
    /// Record the visible length in the store at every flush and fsync,
    /// for readers on other daemons sharing the namespace.
    pub publish_lengths: bool,
    /// One `syncfs` per filesystem at fsync (`replica_sync=fs`).
    pub sync_by_fs: bool,
    /// Replicas found bad (reads, syncs), for housekeeping to repair.
    pub bad: Arc<BadReplicas>,
    /// What fsyncs made durable, and which replicas failed their sync.
    pub ledger: SyncLedger,
    /// The mount's write buffer, shared by every stream.
    pub budget: Arc<Budget>,
    /// The mount's statistics (`leasefs stats`).
    pub metrics: Arc<Metrics>,
    /// Small blocks whose bytes an fsync or close kept in the metadata
    /// store's WAL, their replicas not yet synced.
    pub journal: Arc<super::journal::set::Journal>,
    /// Replicas finalized unsynced, which the flush marks may not pass
    /// yet (`fs::unflushed`).
    pub floor: super::flush_floor::FlushFloor,
}

/// The file a stream writes, and where what its streamer does to it is
/// recorded.
pub(crate) struct StreamFile {
    pub ino: u64,
    /// Fixed per file when it is created.
    pub block_size: u64,
    pub ctx: Arc<StreamCtx>,
    pub log: Arc<dyn FileLog>,
}

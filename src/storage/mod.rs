//! Block storage: datanode directories holding block replicas, each a data
//! file with a checksum file of CRC32C per 512-byte chunk.
//!
//! [`Storage`] is what the rest of the daemon needs of a datanode;
//! [`Datanode`] implements it on a local directory. The modules, from the
//! bottom up:
//!
//! | module | owns |
//! |---|---|
//! | [`dnid`] | [`DnId`], a datanode's compact id |
//! | [`error`] | [`StorageError`] |
//! | [`checksum`] | CRC32C per chunk, the meta file header, the packet CRC accumulator |
//! | [`trust`] | which directories may hold the daemon's files (no other user can change them) |
//! | [`at`] | a datanode's directories held open; every file operation relative to them, no link followed |
//! | [`layout`] | names and paths of a datanode directory, replica states; its directories as [`at`] holds them |
//! | [`fsops`] | positional reads that fill their buffer |
//! | [`identity`] | the identity file `DN/VERSION` |
//! | [`flushed`] | the flush mark `DN/FLUSHED`: the stamp below which every replica is on the disk |
//! | [`locate`] | finding (and removing) a block's files |
//! | [`writer`], [`reader`] | the open files of one replica: appends; verified reads |
//! | [`replica`] | a replica's lifecycle: create, reopen, restamp, cut, finalize |
//! | [`deferred`] | replicas the block journal keeps durable, held in memory until needed on disk |
//! | [`maintenance`] | listing, deletion, copies, `tmp/` cleanup, the heartbeat probe |
//! | [`quarantine`] | unknown replicas kept instead of deleted, for a retention period |
//! | [`api`] | the [`Storage`] and [`ReplicaWrite`] traits |
//! | [`datanode`] | [`Datanode`]: open, identity, sync; the real [`Storage`] |

pub mod api;
pub(crate) mod at;
pub mod checksum;
pub mod datanode;
pub mod deferred;
pub mod direct;
pub mod dnid;
pub mod error;
#[cfg(test)]
pub mod faulty;
pub mod flushed;
pub mod fsops;
pub mod identity;
pub mod layout;
pub mod locate;
pub mod maintenance;
mod note;
pub mod quarantine;
pub mod reader;
pub mod replica;
pub mod s3;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
pub mod trust;
pub mod writer;

pub use api::{Capacity, ReplicaWrite, Storage, SyncPlan, SyncStep, SyncTask};
pub use checksum::ChunkAccumulator;
pub use datanode::Datanode;
pub use error::StorageError;
pub use layout::{DnId, ReplicaInfo, ReplicaStat, ReplicaState};
pub use maintenance::{block_ids_in, check_dirs, holds_files};
pub use reader::ReplicaReader;
pub use writer::ReplicaWriter;

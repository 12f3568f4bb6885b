//! The write pipeline (HDFS `DFSOutputStream` + `DataStreamer`): packets
//! are filled by `write()`, streamed to every replica of the current block
//! by a background worker, and acknowledged once all replicas wrote them;
//! plus the read path and lease (block) recovery that share its view of
//! replicas, and the mount's datanodes.
//!
//! | module | owns |
//! |---|---|
//! | [`state`] | a stream's bookkeeping: packets, data and ack queues, backpressure (no I/O) |
//! | [`stream`] | [`OutputStream`]: the state behind a lock, and the worker that drains it |
//! | [`streamer`] | the worker's I/O: packets, block boundaries, fsync, close, truncate |
//! | [`block`], [`pipe`] | opening and finalising a block; its replicas and pipeline recovery |
//! | [`outcome`] | what the worker reports about the file ([`FileLog`], implemented by the filesystem) |
//! | [`durable`], [`ledger`] | making a file durable; what is known durable |
//! | [`flush_floor`] | how far the datanodes' flush marks may move while writers run |
//! | [`journal`] | small blocks made durable by the metadata store's WAL; their checkpoint and replay |
//! | [`budget`] | the mount's write buffer |
//! | [`ctx`] | what every stream shares |
//! | [`helping`] | jobs run in parallel by a pool thread that never waits for one not started |
//! | [`datanodes`], [`placement`], [`attach`] | the mount's datanodes, where replicas go, which directory is which |
//! | [`copies`] | host-local copies (`-o local_copy`): which datanodes are shared, which a host's |
//! | [`in_flight`] | blocks written or copied but not yet recorded (no sweep deletes them) |
//! | [`reader`], [`recovery`] | the read path; lease recovery |

pub mod attach;
pub mod block;
pub mod budget;
pub mod copies;
pub mod ctx;
pub mod datanodes;
pub mod durable;
pub mod flush_floor;
pub mod fs_sync;
mod helping;
pub mod in_flight;
pub mod journal;
pub mod ledger;
pub mod outcome;
pub mod pipe;
pub mod placement;
pub mod reader;
pub mod recovery;
pub mod state;
pub mod stream;
mod streamer;
#[cfg(test)]
mod tests;

pub use budget::Budget;
pub use ctx::{Done, StreamCtx};
pub use datanodes::{Datanodes, Health};
pub use outcome::{FileLog, FileOutcome};
pub use stream::{OutputStream, StreamStats};

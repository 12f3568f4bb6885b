//! The write pipeline (HDFS `DFSOutputStream` + `DataStreamer`): packets
//! are filled by `write()`, streamed to every replica of the current block
//! by a background worker, and acknowledged once all replicas wrote them;
//! plus the read path and lease (block) recovery that share its view of
//! replicas.

pub mod attach;
pub mod budget;
pub mod datanodes;
pub mod durable;
pub mod placement;
pub mod reader;
pub mod recovery;
pub mod stream;
mod streamer;

pub use budget::Budget;
pub use datanodes::{Datanodes, Health};
pub use stream::{Done, OutputStream, StreamCtx};

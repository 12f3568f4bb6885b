//! leasefs: a FUSE filesystem with HDFS write semantics.
//!
//! Layout mirrors the architecture (see docs/SEMANTICS.md and README "Design"):
//! - [`fs::adapter`] translates fuser requests into calls of [`fs::core`],
//!   which holds the filesystem semantics and never sees fuser types;
//! - [`meta`] persists the namespace, blocks and files under construction in
//!   SQLite;
//! - [`lease`] is the per-file lease manager (injected clock, no FUSE types);
//! - [`storage`] holds datanode directories, replica files and checksums, and
//!   the write pipeline (packets, streamer, acks);
//! - [`dnadmin`] is datanode administration (list, add, decommission,
//!   remove, balance) on a running daemon;
//! - [`cli`] is the command line.

pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dnadmin;
pub mod elect;
pub mod error;
pub mod etcd;
pub mod fault;
pub mod fs;
pub mod fsck;
pub mod fsstat;
pub mod housekeeping;
pub mod lease;
pub mod meta;
pub mod metrics;
pub mod pipeline;
pub mod proc_tree;
pub mod spout;
pub mod storage;
pub mod sync;
pub mod sync_cpus;

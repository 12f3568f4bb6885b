//! Per-file write leases (HDFS `LeaseManager`): who may write which file,
//! for how long, and what happens when a holder stops renewing.

pub mod cluster;
mod deferred;
mod index;
pub mod manager;
mod record;
mod table;
pub mod types;

#[cfg(test)]
mod tests;

pub use manager::*;
pub use types::*;

//! The filesystem: [`core::Core`] holds the semantics and is driven by unit
//! tests and by [`adapter`], which only translates fuser requests.

pub mod acl;
pub mod adapter;
pub mod attr;
pub mod cache;
mod closing;
mod clustered;
pub mod core;
mod deletions;
mod durability;
mod epochs;
#[cfg(test)]
pub(crate) mod fake_cluster;
mod fencing;
mod file_record;
mod handles;
mod leasing;
mod maintenance;
pub mod namespace;
mod opening;
mod privs;
pub mod proc_info;
mod reads;
pub mod request;
mod stats;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
mod truncate;
mod unflushed;
mod waits;
mod writes;
pub mod xattrs;

pub use self::core::Core;
pub use self::fencing::{MAX_HOST, MAX_WHO, TermRegistration};

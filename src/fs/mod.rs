//! The filesystem: [`core::Core`] holds the semantics and is driven by unit
//! tests and by [`adapter`], which only translates fuser requests.

pub mod acl;
pub mod adapter;
pub mod attr;
pub mod cache;
mod clustered;
pub mod contained;
pub mod control;
pub mod core;
pub mod daemon;
mod durability;
mod epochs;
mod fencing;
mod file_record;
mod handles;
mod leasing;
mod maintenance;
pub mod namespace;
mod privs;
pub mod proc_info;
mod stats;
pub mod xattrs;

pub use self::core::Core;
pub use self::fencing::TermRegistration;

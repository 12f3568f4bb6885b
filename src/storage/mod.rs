//! Block storage: datanode directories holding replica files with CRC32C
//! checksums, and the write pipeline that streams packets into them.

pub mod checksum;
pub mod datanode;
pub mod identity;
pub mod replica;

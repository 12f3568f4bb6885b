//! [`DnId`], a datanode's compact id: in its own module because errors
//! name it and the layout (which holds directories open) reports errors.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A datanode's compact id: what block rows record for each replica. The
/// registry in the metadata assigns it to a storage ID once and for all.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct DnId(pub u32);

impl fmt::Display for DnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for DnId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(DnId)
    }
}

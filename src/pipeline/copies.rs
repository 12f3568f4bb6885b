//! Host-local copies (`-o local_copy`): on hosts that share nothing but
//! etcd and an object store, a mount's directories hold one more replica
//! of each new block for this host's own reads. Such a copy counts toward
//! nothing (the replication factor counts replicas on shared datanodes
//! only), is attached and swept by its own host alone, and is shown by
//! every other host as that host's (`elsewhere`), never as dead. Which
//! host a datanode belongs to is recorded in the registry
//! ([`crate::meta::DatanodeRecord::host`]); the rules are in
//! docs/SEMANTICS.md, "Host-local copies".

use std::path::Path;

/// Where a host's id is read when `-o host_id=` does not name one: the
/// systemd/D-Bus machine id, stable across reboots and unique per host.
pub const MACHINE_ID: &str = "/etc/machine-id";

/// This daemon's host and whether its directories hold copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostCopies {
    /// This host's id (`-o host_id=`, else [`MACHINE_ID`]); `None` when
    /// neither gives one (then every recorded copy is another host's).
    pub host: Option<String>,
    /// `-o local_copy`: this mount's directory datanodes are copies.
    pub local_copy: bool,
}

/// What a recorded datanode is to this daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Counted toward the replication factor; any daemon may attach it.
    Shared,
    /// A copy of this host: attached here, read first, counted nowhere.
    Here,
    /// A copy of another host: never attached here, neither counted nor
    /// repaired nor reported missing by this daemon.
    Elsewhere,
}

impl HostCopies {
    /// The role of a datanode recorded with `host`.
    pub fn role(&self, host: Option<&str>) -> Role {
        match host {
            None => Role::Shared,
            Some(h) if self.host.as_deref() == Some(h) => Role::Here,
            Some(_) => Role::Elsewhere,
        }
    }

    /// The host a datanode attached at `dir` by this mount is recorded
    /// with: this host's for a directory of a `local_copy` mount, none for
    /// an object store (shared by every host) or without the option.
    pub fn tag_for(&self, dir: &Path) -> Option<&str> {
        if self.local_copy && !crate::storage::s3::is_s3(dir) {
            self.host.as_deref()
        } else {
            None
        }
    }
}

/// Why this host's id could not be found.
#[derive(Debug, thiserror::Error)]
#[error(
    "-o local_copy needs this host's id: {MACHINE_ID} cannot be read ({why}); name it with -o host_id=NAME"
)]
pub struct NoHostId {
    why: String,
}

/// This daemon's [`HostCopies`]: the id `-o host_id=` gave, else the
/// machine id. Without `local_copy` a missing machine id is no error (the
/// mount then simply has no copies of its own).
pub fn resolve(host_id: Option<&str>, local_copy: bool) -> Result<HostCopies, NoHostId> {
    let host = match host_id {
        Some(h) => Some(h.to_string()),
        None => match std::fs::read_to_string(MACHINE_ID) {
            Ok(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Ok(_) if local_copy => {
                return Err(NoHostId {
                    why: "it is empty".into(),
                });
            }
            Err(e) if local_copy => return Err(NoHostId { why: e.to_string() }),
            _ => None,
        },
    };
    Ok(HostCopies { host, local_copy })
}

/// Checks a `-o host_id=` value: a name of 1 to 64 letters, digits, `.`,
/// `_` or `-` (it is stored in every copy's registry record and shown by
/// `datanode list`).
pub fn check_host_id(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 64 {
        return Err("expected a name of 1 to 64 characters".into());
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only letters, digits, '.', '_' and '-' are allowed".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_here_only_on_its_own_host_and_only_directories_are_copies() {
        let a = HostCopies {
            host: Some("a".into()),
            local_copy: true,
        };
        assert_eq!(a.role(None), Role::Shared);
        assert_eq!(a.role(Some("a")), Role::Here);
        assert_eq!(a.role(Some("b")), Role::Elsewhere);
        // No id of its own: every copy is another host's.
        assert_eq!(HostCopies::default().role(Some("a")), Role::Elsewhere);
        assert_eq!(a.tag_for(Path::new("/local/dn")), Some("a"));
        assert_eq!(a.tag_for(Path::new("s3://bucket/p")), None);
        let plain = HostCopies {
            local_copy: false,
            ..a
        };
        assert_eq!(plain.tag_for(Path::new("/local/dn")), None);
    }

    #[test]
    fn host_ids_are_short_plain_names() {
        assert!(check_host_id("host-a.example_1").is_ok());
        for bad in ["", "a b", "a,b", "a/b", &"x".repeat(65)] {
            assert!(check_host_id(bad).is_err(), "{bad:?}");
        }
        let r = resolve(Some("h1"), true).expect("given id");
        assert_eq!(r.host.as_deref(), Some("h1"));
        assert!(r.local_copy);
    }
}

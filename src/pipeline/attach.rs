//! Which directory is which datanode. At mount each `--datanode` directory
//! is recognised by its identity file ([`crate::storage::identity`]),
//! whatever its place in the list, and the metadata's datanode registry
//! gives its storage ID the compact id block rows record. A directory of
//! another filesystem, or of a datanode the operator removed, is refused; a
//! new, empty one is registered; one of the positional layout (no identity
//! file) is upgraded in place; one that cannot be read (a failed disk) is
//! left out. Recorded datanodes left out of the list are dead for this
//! mount. `leasefs datanode add` attaches one more directory the same way
//! while the daemon runs ([`attach_one`]). A mount with `-o local_copy`
//! records its directories as its host's copies; a datanode recorded as
//! another host's copies is never attached ([`super::copies`]). The rules
//! are in docs/SEMANTICS.md, "Replication and faults", "Datanode
//! administration" and "Host-local copies".

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::copies::{HostCopies, Role};
use super::datanodes::{Absent, Attached, Datanodes, elsewhere_why};
use crate::error::FsError;
use crate::meta::{AdminState, DatanodeRecord, DnId, Meta};
use crate::storage::identity::{self, Identity};
use crate::storage::{Datanode, Storage, StorageError, block_ids_in, check_dirs, holds_files, s3};
use crate::sync::Arc;

/// Why a `--datanode` directory cannot be attached: the mount is refused.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "datanode {} belongs to another leasefs filesystem ({theirs}; this one is {ours})",
        .path.display()
    )]
    Foreign {
        path: PathBuf,
        theirs: String,
        ours: String,
    },
    #[error(
        "datanodes {} and {} carry the same storage ID {storage_id}: is one a copy of the other?",
        .first.display(), .second.display()
    )]
    Duplicate {
        first: PathBuf,
        second: PathBuf,
        storage_id: String,
    },
    #[error(
        "datanode {} holds replica files but no identity file ({}), and they are not those of a datanode this filesystem recorded",
        .path.display(), identity::FILE_NAME
    )]
    Unidentified { path: PathBuf },
    /// A directory another user could change (see storage::trust).
    #[error("datanode {0}")]
    Untrusted(#[source] StorageError),
    #[error("datanode {}: {source}", .path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: StorageError,
    },
    #[error(
        "datanode {} ({storage_id}) was removed from this filesystem (leasefs datanode remove); its replicas are not needed: empty the directory to use it again",
        .path.display()
    )]
    Removed { path: PathBuf, storage_id: String },
    #[error("datanode {} is already attached (id {id})", .path.display())]
    AlreadyAttached { path: PathBuf, id: DnId },
    #[error(transparent)]
    Meta(#[from] FsError),
}

impl From<AttachError> for FsError {
    fn from(e: AttachError) -> Self {
        match e {
            AttachError::Meta(e) => e,
            e => FsError::Datanode(e.to_string()),
        }
    }
}

fn storage(path: &Path) -> impl FnOnce(StorageError) -> AttachError + '_ {
    move |source| match source {
        // Names its path already.
        e @ StorageError::Untrusted { .. } => AttachError::Untrusted(e),
        source => AttachError::Storage {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// A directory that cannot be used (a failed disk), and why.
struct Unusable {
    dir: PathBuf,
    why: String,
}

impl Unusable {
    fn new(dir: PathBuf, e: impl std::fmt::Display) -> Unusable {
        Unusable {
            dir,
            why: e.to_string(),
        }
    }
}

/// A directory with the identity file it holds.
struct WithIdentity {
    dir: PathBuf,
    identity: Identity,
}

/// A directory without an identity file and the positional-layout record
/// of the datanode it is.
struct Pair<'r> {
    dir: PathBuf,
    rec: &'r DatanodeRecord,
}

/// Directories paired with the records they are, and those left over.
struct Matched<'r> {
    pairs: Vec<Pair<'r>>,
    rest: Vec<PathBuf>,
}

/// A directory recognised as datanode `id`, to be opened.
struct Identified {
    id: DnId,
    root: PathBuf,
    identity: Identity,
}

/// Attaches the mount's `--datanode` directories (see the module doc) and
/// returns every datanode the filesystem records, those not in `dirs` as
/// dead (or, another host's copies, as elsewhere), seen from host `here`.
pub fn attach(
    meta: &dyn Meta,
    dirs: &[PathBuf],
    replication: usize,
    here: &HostCopies,
) -> Result<Datanodes, AttachError> {
    let fsid = meta.filesystem_id()?;
    let records = meta.datanode_records()?;
    // First look, changing nothing, so that a refused mount leaves every
    // directory and the registry as they were.
    let mut identified = Vec::new();
    let mut unidentified = Vec::new();
    // Directories that cannot be read (a failed disk): left out of this
    // mount, with the reason, rather than refusing it.
    let mut unusable: Vec<Unusable> = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for dir in dirs {
        // Its directories are checked first, changing nothing.
        let id = match read_identity(dir) {
            Ok(Some(id)) => id,
            Ok(None) => {
                unidentified.push(dir.clone());
                continue;
            }
            // Refused, not left out: the mount is not started with a
            // directory another user could redirect (see storage::trust).
            Err(e @ StorageError::Untrusted { .. }) => return Err(AttachError::Untrusted(e)),
            Err(e) => {
                unusable.push(Unusable::new(dir.clone(), e));
                continue;
            }
        };
        if let Some(r) = records.iter().find(|r| {
            r.state == AdminState::Removed && r.storage_id.as_deref() == Some(&*id.storage_id)
        }) {
            return Err(AttachError::Removed {
                path: dir.clone(),
                storage_id: r.storage_id.clone().unwrap_or_default(),
            });
        }
        if id.filesystem_id != fsid {
            return Err(AttachError::Foreign {
                path: dir.clone(),
                theirs: id.filesystem_id,
                ours: fsid,
            });
        }
        if let Some(first) = seen.insert(id.storage_id.clone(), dir.clone()) {
            return Err(AttachError::Duplicate {
                first,
                second: dir.clone(),
                storage_id: id.storage_id,
            });
        }
        identified.push(WithIdentity {
            dir: dir.clone(),
            identity: id,
        });
    }
    let legacy: Vec<&DatanodeRecord> = records
        .iter()
        .filter(|r| r.state == AdminState::Upgrading)
        .filter(|r| r.storage_id.as_ref().is_none_or(|s| !seen.contains_key(s)))
        .collect();
    // Object-store datanodes never had the positional layout.
    let (s3_fresh, unidentified): (Vec<PathBuf>, Vec<PathBuf>) =
        unidentified.into_iter().partition(|d| s3::is_s3(d));
    let mut matched = match_positional(meta, &legacy, unidentified)?;
    matched.rest.extend(s3_fresh);
    let mut fresh = Vec::new();
    for dir in matched.rest {
        match holds_replicas(&dir) {
            Ok(true) => return Err(AttachError::Unidentified { path: dir }),
            Ok(false) => fresh.push(dir),
            Err(e @ StorageError::Untrusted { .. }) => return Err(AttachError::Untrusted(e)),
            Err(e) => unusable.push(Unusable::new(dir, e)),
        }
    }
    let mut attached: Vec<Identified> = Vec::new();
    for WithIdentity { dir, identity: id } in identified {
        let id = upgrade_layout(&dir, id)?;
        // Known: its id (an interrupted upgrade is finished here). Unknown:
        // its file was written but the mount stopped before registering it.
        // Its host is this mount's to say: a directory found here is here.
        let dn = meta.register_datanode(&id.storage_id, &dir, here.tag_for(&dir))?;
        attached.push(Identified {
            id: dn,
            root: dir,
            identity: id,
        });
    }
    for Pair { dir, rec } in matched.pairs {
        attached.push(upgrade(meta, &fsid, &dir, rec, here.tag_for(&dir))?);
    }
    for dir in fresh {
        let id = create_identity(meta, &dir, &fsid)?;
        if id.filesystem_id != fsid {
            return Err(AttachError::Foreign {
                path: dir,
                theirs: id.filesystem_id,
                ours: fsid,
            });
        }
        let dn = meta.register_datanode(&id.storage_id, &dir, here.tag_for(&dir))?;
        tracing::info!(datanode = %dn, storage = %id.storage_id, path = %dir.display(), "new datanode registered");
        attached.push(Identified {
            id: dn,
            root: dir,
            identity: id,
        });
    }
    // Registrations above changed the records: read them again.
    let records = meta.datanode_records()?;
    let record = |id: DnId| records.iter().find(|r| r.id == id);
    let mut ids: HashSet<DnId> = HashSet::new();
    let mut nodes = Vec::new();
    for a in attached {
        match open_node(a.id, &a.root, Some(a.identity)) {
            Ok(node) => {
                ids.insert(a.id);
                nodes.push(Attached {
                    node,
                    admin: record(a.id).map_or(AdminState::Normal, |r| r.state),
                    host: record(a.id).and_then(|r| r.host.clone()),
                });
            }
            Err(e) => unusable.push(Unusable::new(a.root, e)),
        }
    }
    for u in &unusable {
        tracing::warn!(path = %u.dir.display(), "datanode directory cannot be read: left out of this mount: {}", u.why);
    }
    let absent = records
        .into_iter()
        .filter(|r| !ids.contains(&r.id) && r.state != AdminState::Removed)
        .map(|record| {
            if here.role(record.host.as_deref()) == Role::Elsewhere {
                let why = elsewhere_why(record.host.as_deref());
                tracing::info!(datanode = %record.id, path = %record.path.display(), "recorded datanode not attached: {why}");
                return Absent { record, why };
            }
            let why = match unusable.iter().find(|u| u.dir == record.path) {
                Some(u) => format!("cannot be read at mount: {}", u.why),
                None if dirs.contains(&record.path) => {
                    "its directory holds another datanode now (replaced)".into()
                }
                None => "not in the --datanode list".into(),
            };
            tracing::warn!(
                datanode = %record.id,
                path = %record.path.display(),
                "recorded datanode dead for this mount: {why}"
            );
            Absent { record, why }
        })
        .collect();
    Ok(Datanodes::new(nodes, absent, replication).on_host(here.clone()))
}

/// Attaches `dir` to the running daemon's datanodes `dns` (`leasefs
/// datanode add`) by the rules of a mount: a directory of this filesystem
/// with its identity file comes back under its id (a decommissioning or
/// decommissioned one returns to service), an empty one becomes a new
/// datanode; another filesystem's, a removed one's, one already attached
/// or one holding replica files of unknown origin is refused, changing
/// nothing. Returns its id.
pub fn attach_one(meta: &dyn Meta, dns: &Datanodes, dir: &Path) -> Result<DnId, AttachError> {
    let fsid = meta.filesystem_id()?;
    let records = meta.datanode_records()?;
    // Checked before anything is written there (see storage::trust).
    let id = match read_identity(dir).map_err(storage(dir))? {
        Some(id) => id,
        None => {
            if holds_replicas(dir).map_err(storage(dir))? {
                return Err(AttachError::Unidentified {
                    path: dir.to_path_buf(),
                });
            }
            create_identity(meta, dir, &fsid)?
        }
    };
    if id.filesystem_id != fsid {
        return Err(AttachError::Foreign {
            path: dir.to_path_buf(),
            theirs: id.filesystem_id,
            ours: fsid,
        });
    }
    let known = records
        .iter()
        .find(|r| r.storage_id.as_deref() == Some(&*id.storage_id));
    if let Some(r) = known {
        if r.state == AdminState::Removed {
            return Err(AttachError::Removed {
                path: dir.to_path_buf(),
                storage_id: id.storage_id,
            });
        }
        if dns.get(r.id).is_some() {
            return Err(AttachError::AlreadyAttached {
                path: dir.to_path_buf(),
                id: r.id,
            });
        }
    }
    if let Some(other) = dns.attached().iter().find(|n| n.root() == dir) {
        return Err(AttachError::AlreadyAttached {
            path: dir.to_path_buf(),
            id: other.id(),
        });
    }
    let id = upgrade_layout(dir, id)?;
    let host = dns.host().tag_for(dir);
    let dn = meta.register_datanode(&id.storage_id, dir, host)?;
    let node = open_node(dn, dir, Some(id.clone())).map_err(storage(dir))?;
    // Added back: in service again (a decommission is cancelled).
    meta.set_datanode_state(
        dn,
        &[AdminState::Decommissioning, AdminState::Decommissioned],
        AdminState::Normal,
    )?;
    tracing::info!(datanode = %dn, storage = %id.storage_id, path = %dir.display(), "datanode added");
    dns.insert(node, AdminState::Normal, host.map(str::to_string));
    Ok(dn)
}

/// Opens the datanode of `rec` at its recorded path, if the directory
/// there carries its identity file: how a daemon attaches a datanode
/// another daemon added while both run.
pub fn open_recorded(fsid: &str, rec: &DatanodeRecord) -> Result<Arc<dyn Storage>, String> {
    let found = if s3::is_s3(&rec.path) {
        read_identity(&rec.path)
    } else {
        identity::read(&rec.path)
    }
    .map_err(|e| e.to_string())?;
    match (found, &rec.storage_id) {
        (Some(id), Some(sid)) if id.storage_id == *sid && id.filesystem_id == fsid => {
            open_node(rec.id, &rec.path, Some(id)).map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "{} does not hold its identity file here",
            rec.path.display()
        )),
    }
}

/// The identity a `--datanode` holds: a directory's identity file (its
/// directories checked first, changing nothing), or an object-store
/// datanode's identity object.
fn read_identity(dir: &Path) -> Result<Option<Identity>, StorageError> {
    if s3::is_s3(dir) {
        return s3::read_identity(&*s3_bucket(dir)?);
    }
    check_dirs(dir).and_then(|()| identity::read(dir))
}

/// Writes a new datanode's identity (file or object) of filesystem
/// `fsid`; returns what is there after. A directory's file is linked into
/// place, which only one daemon can do. An object store's PUT cannot be
/// made conditional on every store, so its storage ID is claimed in the
/// namespace first: daemons sharing it that attach one new prefix at once
/// all write the same identity, whichever PUT the store keeps.
pub fn create_identity(meta: &dyn Meta, dir: &Path, fsid: &str) -> Result<Identity, AttachError> {
    if s3::is_s3(dir) {
        let b = s3_bucket(dir).map_err(storage(dir))?;
        let sid = meta.claim_storage_id(dir, &identity::new_storage_id())?;
        // Read again after the claim: an object written before it (by a
        // daemon that had registered the claimed ID, so this claim is a
        // new one) wins; this claim is then left for the next new prefix
        // at this URL.
        return s3::create_identity(&b, &Identity::of(sid, fsid)).map_err(storage(dir));
    }
    identity::create(dir, &Identity::new(fsid)).map_err(storage(dir))
}

/// Whether a datanode without an identity holds replicas already.
fn holds_replicas(dir: &Path) -> Result<bool, StorageError> {
    if s3::is_s3(dir) {
        return s3::holds_objects(&*s3_bucket(dir)?);
    }
    holds_files(dir)
}

/// The bucket of an `s3://` datanode, with the mount's S3 options.
fn s3_bucket(dir: &Path) -> Result<Arc<s3::bucket::Bucket>, StorageError> {
    let url = s3::parse_url(dir.to_str().unwrap_or_default()).map_err(|why| StorageError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
    })?;
    s3::connect(&url, &s3::settings::installed())
}

/// Opens the datanode `id` at `dir`: a directory or an object store.
fn open_node(
    id: DnId,
    dir: &Path,
    identity: Option<Identity>,
) -> Result<Arc<dyn Storage>, StorageError> {
    if s3::is_s3(dir) {
        return Ok(Arc::new(s3::ObjectDatanode::open(
            id,
            s3_bucket(dir)?,
            identity,
        )));
    }
    Ok(Arc::new(Datanode::open(id, dir, identity)?))
}

/// Pairs directories without an identity file with the positional
/// layout's records that await one: by recorded path first, then, for
/// directories that moved, by the replicas they hold (the block rows say
/// which blocks each old place held). Returns the pairs and the
/// directories left over.
fn match_positional<'r>(
    meta: &dyn Meta,
    legacy: &[&'r DatanodeRecord],
    dirs: Vec<PathBuf>,
) -> Result<Matched<'r>, AttachError> {
    let mut pairs = Vec::new();
    let mut left_dirs = Vec::new();
    let mut left: Vec<&DatanodeRecord> = legacy.to_vec();
    for dir in dirs {
        match left.iter().position(|r| r.path == dir) {
            Some(k) => pairs.push(Pair {
                dir,
                rec: left.remove(k),
            }),
            None => left_dirs.push(dir),
        }
    }
    if left.is_empty() || left_dirs.is_empty() {
        return Ok(Matched {
            pairs,
            rest: left_dirs,
        });
    }
    let mut held: HashMap<DnId, HashSet<u64>> = HashMap::new();
    for b in meta.all_blocks()? {
        for dn in b.replicas {
            held.entry(dn).or_default().insert(b.block_id);
        }
    }
    // Every (directory, record) pair with the replicas they share, best
    // first; the greedy choice takes a directory's true place before any
    // place that holds only some of its blocks.
    let mut scored = Vec::new();
    for (d, dir) in left_dirs.iter().enumerate() {
        if !holds_files(dir).map_err(storage(dir))? {
            continue;
        }
        let found = block_ids_in(dir).map_err(storage(dir))?;
        for (k, rec) in left.iter().enumerate() {
            let set = held.get(&rec.id);
            let n = found
                .iter()
                .filter(|b| set.is_some_and(|s| s.contains(b)))
                .count();
            if n > 0 {
                scored.push(Score {
                    shared: n,
                    dir: d,
                    rec: k,
                });
            }
        }
    }
    scored.sort_by(|a, b| {
        b.shared
            .cmp(&a.shared)
            .then(a.dir.cmp(&b.dir))
            .then(a.rec.cmp(&b.rec))
    });
    let (mut dir_used, mut rec_used) = (HashSet::new(), HashSet::new());
    for Score { dir: d, rec: k, .. } in scored {
        if dir_used.contains(&d) || rec_used.contains(&k) {
            continue;
        }
        dir_used.insert(d);
        rec_used.insert(k);
        pairs.push(Pair {
            dir: left_dirs[d].clone(),
            rec: left[k],
        });
    }
    let rest = left_dirs
        .into_iter()
        .enumerate()
        .filter(|(d, _)| !dir_used.contains(d))
        .map(|(_, dir)| dir)
        .collect();
    Ok(Matched { pairs, rest })
}

/// How many replicas directory `dir` and record `rec` (indexes) share.
struct Score {
    shared: usize,
    dir: usize,
    rec: usize,
}

/// Upgrades the positional-layout datanode `rec` at `dir` in place: its
/// storage ID is recorded first (durably), then its identity file is
/// written, then it is registered as normal. Interrupted anywhere, the
/// next mount finds the same storage ID and finishes; no replica moves.
/// A datanode of an older layout version is brought to this release's in
/// place (see `storage::identity`): only its identity file changes.
fn upgrade_layout(dir: &Path, id: Identity) -> Result<Identity, AttachError> {
    if id.layout_version >= identity::LAYOUT_VERSION || s3::is_s3(dir) {
        return Ok(id);
    }
    let new = identity::upgrade(dir, &id).map_err(storage(dir))?;
    tracing::info!(
        path = %dir.display(),
        storage = %new.storage_id,
        "datanode layout {} upgraded in place to {}",
        id.layout_version,
        new.layout_version
    );
    Ok(new)
}

fn upgrade(
    meta: &dyn Meta,
    fsid: &str,
    dir: &Path,
    rec: &DatanodeRecord,
    host: Option<&str>,
) -> Result<Identified, AttachError> {
    let sid = meta.claim_legacy_datanode(rec.id, &identity::new_storage_id())?;
    let id = identity::create(dir, &Identity::of(sid.clone(), fsid)).map_err(storage(dir))?;
    if id.filesystem_id != fsid {
        return Err(AttachError::Foreign {
            path: dir.to_path_buf(),
            theirs: id.filesystem_id,
            ours: fsid.to_string(),
        });
    }
    if id.storage_id != sid {
        return Err(AttachError::Storage {
            path: dir.to_path_buf(),
            source: StorageError::OtherIdentity {
                path: dir.to_path_buf(),
                found: id.storage_id,
                wanted: sid,
            },
        });
    }
    let dn = meta.register_datanode(&sid, dir, host)?;
    tracing::info!(
        datanode = %dn,
        storage = %sid,
        path = %dir.display(),
        was = %rec.path.display(),
        "datanode of the positional layout upgraded in place"
    );
    Ok(Identified {
        id: dn,
        root: dir.to_path_buf(),
        identity: id,
    })
}

/// The recorded datanodes at their last paths, for tools that run without
/// a mount (`fsck --data`): a directory whose identity file is not the
/// recorded one is dead; one of the positional layout not yet upgraded is
/// taken at its recorded path, as that layout did.
pub fn recorded(meta: &dyn Meta, replication: usize) -> Result<Datanodes, AttachError> {
    let fsid = meta.filesystem_id()?;
    let mut nodes = Vec::new();
    let mut absent = Vec::new();
    for rec in meta.datanode_records()? {
        if rec.state == AdminState::Removed {
            continue;
        }
        let state = rec.state;
        let path = rec.path.clone();
        // An object store is reached with the options installed (`fsck
        // --data`: those the last mount recorded, and its own `-o`) over
        // the environment.
        let missing = || "its directory is missing, or holds another identity file".to_string();
        let opened: Result<Arc<dyn Storage>, String> = if s3::is_s3(&path) {
            open_recorded(&fsid, &rec)
        } else {
            let found = identity::read(&path);
            match (found, &rec.storage_id, rec.state) {
                _ if !path.is_dir() => Err(missing()),
                (Ok(None), _, AdminState::Upgrading) => {
                    open_node(rec.id, &path, None).map_err(|e| e.to_string())
                }
                (Ok(Some(id)), Some(sid), _)
                    if id.storage_id == *sid && id.filesystem_id == fsid =>
                {
                    open_node(rec.id, &path, Some(id)).map_err(|e| e.to_string())
                }
                _ => Err(missing()),
            }
        };
        match opened {
            Ok(node) => nodes.push(Attached {
                node,
                admin: state,
                host: None,
            }),
            // An object store says why (out of reach, another identity).
            Err(why) => absent.push(Absent { record: rec, why }),
        }
    }
    Ok(Datanodes::new(nodes, absent, replication))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{DatanodeRegistry, MetaStore};

    /// A database of the positional layout recording `dirs` in that order.
    fn positional_db(at: &Path, dirs: &[&Path]) -> MetaStore {
        let db = at.join("meta.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("CREATE TABLE datanodes(idx INTEGER PRIMARY KEY, path TEXT NOT NULL);")
            .unwrap();
        for (i, d) in dirs.iter().enumerate() {
            c.execute(
                "INSERT INTO datanodes VALUES(?1, ?2)",
                rusqlite::params![i as i64, d.to_string_lossy()],
            )
            .unwrap();
        }
        drop(c);
        MetaStore::open(&db, 0, 0).unwrap()
    }

    fn mkdirs(t: &tempfile::TempDir, names: &[&str]) -> Vec<PathBuf> {
        names
            .iter()
            .map(|n| {
                let d = t.path().join(n);
                std::fs::create_dir_all(&d).unwrap();
                d
            })
            .collect()
    }

    #[test]
    fn an_interrupted_upgrade_finishes_with_the_storage_id_it_recorded() {
        let t = tempfile::tempdir().unwrap();
        let d = mkdirs(&t, &["a", "b"]);
        let m = positional_db(t.path(), &[&d[0], &d[1]]);
        let fsid = m.filesystem_id().unwrap();
        // a: stopped after its storage ID was recorded, before its file.
        m.claim_legacy_datanode(DnId(0), "DS-a").unwrap();
        // b: stopped after its file, before it was registered.
        m.claim_legacy_datanode(DnId(1), "DS-b").unwrap();
        identity::create(&d[1], &Identity::of("DS-b".into(), &fsid)).unwrap();
        for _ in 0..2 {
            let dns = attach(&m, &[d[1].clone(), d[0].clone()], 2, &HostCopies::default()).unwrap();
            assert_eq!(dns.get(DnId(0)).unwrap().root(), d[0]);
            assert_eq!(dns.get(DnId(1)).unwrap().root(), d[1]);
            let sids: Vec<String> = d
                .iter()
                .map(|d| identity::read(d).unwrap().unwrap().storage_id)
                .collect();
            assert_eq!(sids, ["DS-a", "DS-b"]);
            let recs = m.datanode_records().unwrap();
            assert!(
                recs.iter().all(|r| r.state == AdminState::Normal),
                "{recs:?}"
            );
            assert_eq!(recs.len(), 2);
        }
    }

    #[test]
    fn fresh_directories_are_registered_foreign_and_copied_ones_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = mkdirs(&t, &["a", "b", "foreign", "copy", "new"]);
        let m = MetaStore::open(&t.path().join("meta.db"), 0, 0).unwrap();
        let dns = attach(&m, &d[..2], 2, &HostCopies::default()).unwrap();
        assert_eq!(dns.get(DnId(1)).unwrap().root(), d[1]);
        // Reversed: the same ids.
        let dns = attach(&m, &[d[1].clone(), d[0].clone()], 2, &HostCopies::default()).unwrap();
        assert_eq!(dns.get(DnId(0)).unwrap().root(), d[0]);
        // One left out is recorded, and dead.
        let dns = attach(&m, &d[1..2], 1, &HostCopies::default()).unwrap();
        assert_eq!((dns.len(), dns.is_alive(DnId(0))), (2, false));

        identity::create(&d[2], &Identity::new("FS-other")).unwrap();
        let e = attach(
            &m,
            &[d[4].clone(), d[0].clone(), d[2].clone()],
            2,
            &HostCopies::default(),
        )
        .unwrap_err();
        assert!(matches!(e, AttachError::Foreign { .. }), "{e}");
        // A refused mount changed nothing: the new directory is untouched.
        assert_eq!(std::fs::read_dir(&d[4]).unwrap().count(), 0);
        std::fs::copy(
            d[0].join(identity::FILE_NAME),
            d[3].join(identity::FILE_NAME),
        )
        .unwrap();
        let e = attach(&m, &[d[0].clone(), d[3].clone()], 2, &HostCopies::default()).unwrap_err();
        assert!(matches!(e, AttachError::Duplicate { .. }), "{e}");
        assert_eq!(m.datanode_records().unwrap().len(), 2, "nothing registered");
    }
}

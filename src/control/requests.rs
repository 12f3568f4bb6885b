//! The control requests, each behind its own authorization rule
//! (docs/SEMANTICS.md, "The control socket"): who may ask is decided
//! here from the peer's credentials before anything is done; what a
//! request does is the filesystem's business ([`Core`]).
//!
//! | request | who may |
//! |---|---|
//! | `leases`, `history`, `fsck` with `deep: false` | everybody; a holder's pid and process name only to its own user and root; `leases` and `fsck` name only files the peer could find by listing directories ([`Sight`]) and count the others |
//! | `fsck` (deep: every replica's checksums read) | root or the user who mounted |
//! | `stats` | everybody (counters of the whole mount, naming no file or process) |
//! | `recover` | search permission on every directory of the path and write permission on the file (root always) |
//! | `audit` | a participant of that election (has the election file open for writing) or root |
//! | `fence` | the holder of the election file's lease at that epoch, for itself and a command it leads or its child leads, or root |
//! | `unfence` | a participant of the group's election or root |
//! | `fsck` with `repair` | root or the user who mounted |
//! | `datanode_list`, `datanode_progress`, `datanode_balance_status` | everybody (they name datanodes, not files) |
//! | `datanode_add`, `datanode_decommission`, `datanode_remove`, `datanode_balance` | root or the user who mounted |
//!
//! Every request that changes something (`recover`, `audit`, `fence`,
//! `unfence`, `fsck` with `repair`, the datanode changes) is also
//! refused, root's too, to a process of the command of an election term
//! that is over, as every change through the mount is (docs/SEMANTICS.md,
//! "Fencing").

use std::path::Path;

use serde_json::{Value, json};

use super::peer::{Peer, SEARCH, WRITE};
use super::sight::Sight;
use crate::dnadmin::Admin;
use crate::fs::TermRegistration;
use crate::fs::core::{Caller, Core};
use crate::meta::{AuditEvent, ROOT_INO};
use crate::sync::Arc;

/// Why a request got no answer but an error.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("permission denied: {0}")]
    Denied(String),
    #[error("bad request: {0}")]
    Bad(String),
    #[error("{0}")]
    Failed(String),
}

type Answer = Result<Value, Refusal>;

/// Answers one request of `peer`; `gone` tells whether the client has
/// hung up meanwhile (a long request then stops early).
pub fn answer(
    core: &Arc<Core>,
    admin: &Admin,
    mnt: &Path,
    peer: &Peer,
    req: &Value,
    gone: &dyn Fn() -> bool,
) -> Value {
    let op = req["op"].as_str().unwrap_or("");
    let changes = match op {
        "recover" | "audit" | "fence" | "unfence" => true,
        "fsck" => req["repair"].as_bool().unwrap_or(false),
        op => crate::dnadmin::control::changes(op),
    };
    if changes && let Err(e) = not_fenced(core, peer) {
        return json!({ "error": e.to_string() });
    }
    let r = match op {
        op if op.starts_with("datanode_") => {
            return crate::dnadmin::control::answer(admin, op, req, may_administer(peer));
        }
        "leases" => leases(core, mnt, peer),
        "stats" => Ok(json!({ "stats": core.stats() })),
        "recover" => str_field(req, "path").and_then(|p| recover(core, peer, p)),
        "audit" => audit(core, peer, &req["event"]),
        "history" => str_field(req, "election").and_then(|e| history(core, e, req)),
        "fence" => fence(core, peer, req),
        "unfence" => u32_field(req, "pgid").and_then(|p| unfence(core, peer, p)),
        "fsck" => fsck(core, peer, req, gone),
        other => Err(Refusal::Bad(format!("unknown op '{other}'"))),
    };
    r.unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

fn str_field<'a>(req: &'a Value, name: &str) -> Result<&'a str, Refusal> {
    req[name]
        .as_str()
        .ok_or_else(|| Refusal::Bad(format!("'{name}' is missing")))
}

fn u32_field(req: &Value, name: &str) -> Result<u32, Refusal> {
    req[name]
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| Refusal::Bad(format!("'{name}' is missing")))
}

// ---- who may: one rule per request kind ---------------------------------

/// A process of the command of an election term that is over changes
/// nothing, here as through the mount.
fn not_fenced(core: &Core, peer: &Peer) -> Result<(), Refusal> {
    let caller = Caller {
        pid: peer.pid,
        uid: peer.uid,
        gid: peer.gid,
    };
    core.may_change(caller)
        .map_err(|e| Refusal::Denied(e.to_string()))
}

/// The holder's pid and process name are the holder's user's business
/// (the same rule as `user.leasefs.lease`'s).
fn may_see_holder(peer: &Peer, holder_uid: Option<u32>) -> bool {
    crate::fs::xattrs::holder_shown(peer.uid, holder_uid)
}

/// HDFS's recoverLease needs write permission on the file: resolves
/// `rel` as the peer could (search permission on each directory) and
/// checks write permission on the file.
fn may_recover(core: &Core, peer: &Peer, rel: &str) -> Result<u64, Refusal> {
    let ino = resolve(core, peer, rel)?;
    if !peer.may_ino(&**core.meta(), ino, WRITE) {
        return Err(Refusal::Denied(format!(
            "recover-lease of {rel} needs write permission on it"
        )));
    }
    Ok(ino)
}

/// A participant of the election whose file is `leader`: the peer's
/// process has that file open for writing, holding its lease now or
/// having held it (an elector whose term was taken records `lost` and
/// drops its fence through its fenced descriptor).
fn is_participant(core: &Core, peer: &Peer, leader: u64) -> bool {
    peer.is_root() || participation(core, peer, leader).is_some()
}

/// The peer's write descriptor of the election file `leader`: the epoch
/// it was granted, and whether it holds the lease at that epoch still.
fn participation(core: &Core, peer: &Peer, leader: u64) -> Option<(u64, bool)> {
    let h = core
        .handles()
        .find(|h| h.write && h.ino == leader && h.tgid == peer.pid)?;
    Some((h.epoch, core.leases.check(leader, h.fh, h.epoch).is_ok()))
}

/// The longest reason an audit event may give, and the longest event kind.
const MAX_WHY: usize = 1024;

/// What an election event may say, beyond who may record it: fields no
/// longer than the daemon keeps, a known kind, and the recorder's real
/// term. An event of the peer's own term (the epoch its descriptor was
/// granted) names the peer itself on this host; an event of an earlier
/// term is a successor's account of its predecessor (`elected` when the
/// start was missing, `expired`, `preempted`), only while the peer holds
/// the lease, and must match that term as its elector registered it
/// here, when it did. Root's events are only checked for size.
fn check_event(core: &Core, peer: &Peer, leader: u64, e: &AuditEvent) -> Result<(), Refusal> {
    use crate::fs::{MAX_HOST, MAX_WHO};
    let bad = |why: String| Err(Refusal::Bad(why));
    if e.who.len() > MAX_WHO || e.host.len() > MAX_HOST || e.why.len() > MAX_WHY {
        return bad(format!(
            "an audit event's who, host and why are at most {MAX_WHO}, {MAX_HOST} and {MAX_WHY} bytes"
        ));
    }
    const KINDS: [&str; 5] = ["elected", "lost", "resigned", "expired", "preempted"];
    if !KINDS.contains(&e.event.as_str()) {
        return bad(format!("unknown audit event '{}'", e.event));
    }
    if peer.is_root() {
        return Ok(());
    }
    let Some((mine, holds)) = participation(core, peer, leader) else {
        return Err(Refusal::Denied(format!(
            "only a participant of the election {} may record its events",
            e.election
        )));
    };
    let denied = |why: String| Err(Refusal::Denied(why));
    if e.epoch == mine {
        if e.pid != peer.pid || *e.host != *core.host {
            return denied(format!(
                "an event of the caller's own term names the caller ({}:{})",
                core.host, peer.pid
            ));
        }
        return Ok(());
    }
    if e.epoch == 0 || e.epoch > mine {
        return denied(format!(
            "epoch {} is not the caller's ({mine}) nor an earlier one",
            e.epoch
        ));
    }
    if !holds || !matches!(e.event.as_str(), "elected" | "expired" | "preempted") {
        return denied(format!(
            "only the leader records a predecessor's {} (it is not)",
            e.event
        ));
    }
    if let Some(t) = core.fences().term_of(leader).filter(|t| t.epoch == e.epoch)
        && (t.who != e.who || t.host != e.host || t.pid != e.pid)
    {
        return denied(format!(
            "term {} was led by {} ({}:{}), not {} ({}:{})",
            t.epoch, t.who, t.host, t.pid, e.who, e.host, e.pid
        ));
    }
    Ok(())
}

/// Registering a term: the peer holds the election file's lease at that
/// very epoch, registers itself as the elector, and the command's tree
/// (if any) is led by the peer or by a child of it (the elector forks its
/// command into a session of its own).
fn may_fence(core: &Core, peer: &Peer, leader: u64, reg: &TermRegistration) -> Result<(), Refusal> {
    if peer.is_root() {
        return Ok(());
    }
    let (epoch, pgid) = (reg.epoch, reg.pgid);
    if reg.pid != peer.pid {
        return Err(Refusal::Denied(format!(
            "a term names its elector: {} is not the caller ({})",
            reg.pid, peer.pid
        )));
    }
    let holds = core
        .handles()
        .find(|h| {
            h.write
                && h.ino == leader
                && h.tgid == peer.pid
                && h.epoch == epoch
                && core.leases.check(leader, h.fh, epoch).is_ok()
        })
        .is_some();
    if !holds {
        return Err(Refusal::Denied(format!(
            "only the holder of the election's lease at epoch {epoch} may fence under it"
        )));
    }
    if pgid != 0 && pgid != peer.pid && parent_of(pgid) != Some(peer.pid) {
        return Err(Refusal::Denied(format!(
            "process group {pgid} is not led by the caller or a child of it"
        )));
    }
    Ok(())
}

/// Repair changes replicas and closes files: the user who mounted, or root.
/// A deep fsck reads R times the whole filesystem as root, and a user
/// may run a few at once: it is the mount owner's tool, as repair is.
fn may_deep_check(peer: &Peer) -> bool {
    may_administer(peer)
}

fn may_repair(peer: &Peer) -> bool {
    may_administer(peer)
}

/// Changes of the mount's datanodes (add, decommission, remove, balance)
/// are the operator's: the user who mounted, or root.
fn may_administer(peer: &Peer) -> bool {
    peer.is_root() || peer.uid == nix::unistd::geteuid().as_raw()
}

/// `PPid` of a process, from `/proc/<pid>/status`.
fn parent_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Resolves a path inside the mount, checking that the peer may search
/// every directory on the way.
fn resolve(core: &Core, peer: &Peer, rel: &str) -> Result<u64, Refusal> {
    let mut ino = ROOT_INO;
    for part in rel.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if !peer.may_ino(&**core.meta(), ino, SEARCH) {
            return Err(Refusal::Denied(format!(
                "{rel}: no search permission on a directory of the path"
            )));
        }
        ino = core
            .meta()
            .lookup(ino, part.as_bytes())
            .map_err(|e| Refusal::Failed(format!("{rel}: {e}")))?
            .ino;
    }
    Ok(ino)
}

/// The election file of an election directory.
fn leader_of(core: &Core, peer: &Peer, election: &str) -> Result<u64, Refusal> {
    resolve(
        core,
        peer,
        &format!("{}/LEADER", election.trim_end_matches('/')),
    )
}

// ---- the requests ---------------------------------------------------------

/// Every held or recovering lease whose path the peer may see ([`Sight`]);
/// `hidden` counts the others (absent when none).
fn leases(core: &Arc<Core>, mnt: &Path, peer: &Peer) -> Answer {
    let local = core.leases.list();
    let mut sight = Sight::new(core, peer);
    let mut hidden = 0u64;
    let remote = remote_leases(core, mnt, peer, &local, &mut sight, &mut hidden);
    let mut list: Vec<Value> = local
        .into_iter()
        .filter_map(|mut l| {
            let rel = core.meta().path_of(l.file);
            if !sight.shows(&rel) {
                hidden += 1;
                return None;
            }
            // Over etcd the store's epoch, as every daemon reads it.
            if core.cluster.is_some()
                && let Ok(e) = core.last_epoch(l.file)
            {
                l.epoch = e;
            }
            let holder_uid = l
                .handle
                .and_then(|fh| core.handles().get(fh).ok().map(|h| h.uid));
            let shown = may_see_holder(peer, holder_uid);
            let mut v = serde_json::to_value(&l).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.insert("path".into(), json!(format!("{}{}", mnt.display(), rel)));
                if !shown {
                    o.insert("holder".into(), Value::Null);
                    o.insert("comm".into(), Value::Null);
                }
            }
            Some(v)
        })
        .collect();
    list.extend(remote);
    let mut answer = json!({ "leases": list });
    if hidden > 0 {
        answer["hidden"] = json!(hidden);
    }
    Ok(answer)
}

/// Over etcd: the files other daemons hold (their claims), as their own
/// listing shows them, so that `leasefs leases` reads the same on every
/// daemon. A remote holder's user is not known here: only root sees who.
fn remote_leases(
    core: &Arc<Core>,
    mnt: &Path,
    peer: &Peer,
    local: &[crate::lease::LeaseInfo],
    sight: &mut Sight<'_>,
    hidden: &mut u64,
) -> Vec<Value> {
    let Some(cl) = &core.cluster else {
        return Vec::new();
    };
    let claims = match cl.claims() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot list the claims of other daemons: {e}");
            return Vec::new();
        }
    };
    let shown = may_see_holder(peer, None);
    claims
        .into_iter()
        .filter(|(file, c)| c.mount_id != core.mount_id && !local.iter().any(|l| l.file == *file))
        .filter_map(|(file, c)| {
            let rel = core.meta().path_of(file);
            if !sight.shows(&rel) {
                *hidden += 1;
                return None;
            }
            Some(json!({
                "file": file,
                "path": format!("{}{}", mnt.display(), rel),
                "state": "held",
                "holder": shown.then(|| format!("{}:{}", c.host, c.pid)),
                "comm": shown.then_some(c.comm),
                "handle": null,
                "epoch": core.last_epoch(file).unwrap_or(0),
                "mode": null,
                "renewed_ms_ago": null,
                "opened_wall_ms": c.since_ms,
                "waiters": 0,
                "daemon": c.mount_id,
            }))
        })
        .collect()
}

fn recover(core: &Arc<Core>, peer: &Peer, rel: &str) -> Answer {
    let ino = may_recover(core, peer, rel)?;
    tracing::info!(path = rel, uid = peer.uid, pid = peer.pid, "recover-lease");
    match core.recover_now(ino) {
        Ok(closed) => Ok(json!({ "closed": closed })),
        Err(e) => Err(Refusal::Failed(e.to_string())),
    }
}

fn audit(core: &Arc<Core>, peer: &Peer, event: &Value) -> Answer {
    let e: AuditEvent = serde_json::from_value(event.clone())
        .map_err(|e| Refusal::Bad(format!("bad audit event: {e}")))?;
    let leader = leader_of(core, peer, &e.election)?;
    check_event(core, peer, leader, &e)?;
    match core.meta().audit(&e, peer.uid) {
        Ok(id) => Ok(json!({ "id": id })),
        Err(e) => Err(Refusal::Failed(e.to_string())),
    }
}

/// Events of an election answered at once unless the request asks for
/// fewer (`limit`), and at most.
pub const HISTORY_PAGE: usize = 100;
pub const HISTORY_MAX_PAGE: usize = 1000;

/// The newest events of an election (`limit` of them, default
/// [`HISTORY_PAGE`], at most [`HISTORY_MAX_PAGE`]), below the sequence
/// number `before` if given, oldest first; `before` in the answer is what
/// to ask for the page before this one (absent at the first event).
fn history(core: &Arc<Core>, election: &str, req: &Value) -> Answer {
    let limit = req["limit"]
        .as_u64()
        .map_or(HISTORY_PAGE, |l| l as usize)
        .clamp(1, HISTORY_MAX_PAGE);
    let before = req["before"].as_i64();
    let rows = core
        .meta()
        .audit_page(election, before, limit + 1)
        .map_err(|e| Refusal::Failed(e.to_string()))?;
    let more = rows.len() > limit;
    let rows = &rows[rows.len().saturating_sub(limit)..];
    let mut answer = json!({ "events": rows.iter().map(|(_, e)| e).collect::<Vec<_>>() });
    if more && let Some((first, _)) = rows.first() {
        answer["before"] = json!(first);
    }
    Ok(answer)
}

fn fence(core: &Arc<Core>, peer: &Peer, req: &Value) -> Answer {
    let reg: TermRegistration = serde_json::from_value(req.clone())
        .map_err(|e| Refusal::Bad(format!("bad fence request: {e}")))?;
    let leader = resolve(core, peer, &reg.path)?;
    may_fence(core, peer, leader, &reg)?;
    core.fences()
        .register(leader, &reg, peer.uid)
        .map_err(Refusal::Failed)?;
    Ok(json!({ "ok": true }))
}

fn unfence(core: &Arc<Core>, peer: &Peer, pgid: u32) -> Answer {
    // A tree with no fence: nothing to drop, whoever asks.
    let Some(leader) = core.fences().election_of(pgid) else {
        return Ok(json!({ "ok": true }));
    };
    if !is_participant(core, peer, leader) {
        return Err(Refusal::Denied(format!(
            "only a participant of its election may drop the fence of process group {pgid}"
        )));
    }
    core.fences().unregister(pgid);
    Ok(json!({ "ok": true }))
}

/// `repair` and `deep` (the default: every replica's checksums read, R
/// times the data, at root's expense) are for root and the mounter; any
/// user may ask for the shallow check (`deep: false`).
fn fsck(core: &Arc<Core>, peer: &Peer, req: &Value, gone: &dyn Fn() -> bool) -> Answer {
    let repair = req["repair"].as_bool().unwrap_or(false);
    let deep = req["deep"].as_bool().unwrap_or(true);
    if repair && !may_repair(peer) {
        return Err(Refusal::Denied(
            "fsck --repair is for root and the user who mounted".into(),
        ));
    }
    if deep && !may_deep_check(peer) {
        return Err(Refusal::Denied(
            "a deep fsck (every replica's checksums read) is for root and the user who mounted; use fsck --shallow".into(),
        ));
    }
    let mut report = core.fsck(repair, deep, gone).map_err(Refusal::Failed)?;
    let mut sight = Sight::new(core, peer);
    report.hide(&mut |rel| sight.shows(rel));
    for f in &mut report.open_for_write {
        let pid = f
            .holder
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u32>().ok());
        let uid = pid.and_then(|pid| {
            core.handles()
                .find(|h| h.write && h.tgid == pid)
                .map(|h| h.uid)
        });
        if !may_see_holder(peer, uid) {
            if let Some((host, _)) = f.holder.split_once(':') {
                f.holder = format!("{host}:-");
            }
            f.comm = "-".into();
        }
    }
    Ok(json!({ "report": report }))
}

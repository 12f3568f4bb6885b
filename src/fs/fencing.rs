//! Fencing of election terms (docs/SEMANTICS.md, "Fencing"): which process
//! trees run the commands of which election terms; refusing every request
//! that changes the filesystem when it comes from the tree of a term that
//! is over; stopping what is left of such a tree; and the durable copy of
//! the table, so that a daemon restarted on the same data directory goes on
//! refusing (and stops) the commands of terms that ended with it.
//!
//! A term is over once the lease of its election file is no longer held
//! here at the term's epoch (taken over, released, recovered), and always
//! for a fence inherited from a previous daemon: every lease died with it.

use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::Deserialize;

use super::proc_info::{self, Ident};
use crate::error::{FsError, FsResult};
use crate::lease::{LeaseManager, LeaseState, RecoveryReason, RecoveryTicket};
use crate::meta::{AuditEvent, FenceRecord, Meta};
use crate::proc_tree::{self, Tree};
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering, lock};

/// The longest elector id (`who`) and host name a term may name: what the
/// daemon keeps of a term, in memory and in its metadata, is bounded by
/// these (an id is a name on a command line, a host name at most 64 bytes
/// on Linux).
pub const MAX_WHO: usize = 256;
pub const MAX_HOST: usize = 255;
/// The longest cgroup path and election file path a term may name.
pub const MAX_PATH: usize = 4096;
/// Election terms one user (root apart) may lead at once through this
/// daemon, and command trees they may have fenced at once.
pub const MAX_TERMS_PER_USER: usize = 64;
pub const MAX_FENCES_PER_USER: usize = 64;

/// How long the daemon leaves a live, running elector to stop the command
/// of its ended term (with its own SIGTERM and grace) before it kills the
/// tree itself. A gone or stopped elector gets no grace.
const ELECTOR_GRACE: Duration = Duration::from_secs(2);

/// One fenced process tree.
struct Fence {
    rec: FenceRecord,
    /// The user who registered it (`None`: inherited from a previous
    /// daemon, which did not record it).
    uid: Option<u32>,
    /// Inherited from a previous daemon: its term ended with that daemon.
    inherited: bool,
    /// When this daemon first saw the term over.
    over_since: Mutex<Option<Instant>>,
}

impl Fence {
    fn tree(&self) -> Tree {
        Tree {
            leader: self.rec.pgid,
            start_ticks: self.rec.start_ticks,
            cgroup: self.rec.cgroup.clone(),
        }
    }
}

/// The term an election file is led under, for the audit of a preemption
/// and to check what its elector records. Forgotten once the file's lease
/// leaves the term.
#[derive(Debug, Clone)]
pub struct Term {
    pub election: String,
    pub epoch: u64,
    pub who: String,
    pub host: String,
    pub pid: u32,
    /// The elector's user.
    pub uid: u32,
}

/// The fence table of a daemon, with what deciding needs: the lease
/// manager (a term is over once its lease is), the metadata store (the
/// durable copy of the table, the audit of preemptions) and the pool
/// sweeps run on.
pub struct Fences {
    leases: Arc<LeaseManager>,
    meta: Arc<dyn Meta>,
    rt: tokio::runtime::Handle,
    /// This daemon's lineage (`host:DATA`): durable fences are kept by it.
    owner: String,
    boot_id: String,
    /// By the command's pid (its process group and session).
    table: DashMap<u32, Fence>,
    /// How many fences name a cgroup: only then is a caller's cgroup read.
    with_cgroup: AtomicUsize,
    /// The current term of each election file (by inode).
    terms: DashMap<u64, Term>,
}

impl Fences {
    pub fn new(
        owner: String,
        leases: Arc<LeaseManager>,
        meta: Arc<dyn Meta>,
        rt: tokio::runtime::Handle,
    ) -> Fences {
        Fences {
            leases,
            meta,
            rt,
            owner,
            boot_id: proc_tree::boot_id(),
            table: DashMap::new(),
            with_cgroup: AtomicUsize::new(0),
            terms: DashMap::new(),
        }
    }

    fn insert(&self, f: Fence) {
        let cg = f.rec.cgroup.is_some();
        if let Some(old) = self.table.insert(f.rec.pgid, f)
            && old.rec.cgroup.is_some()
        {
            self.with_cgroup.fetch_sub(1, Ordering::Relaxed);
        }
        if cg {
            self.with_cgroup.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn remove(&self, pgid: u32) {
        if let Some((_, old)) = self.table.remove(&pgid)
            && old.rec.cgroup.is_some()
        {
            self.with_cgroup.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The lineage durable fences are kept under.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// No fence is registered.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// What an elector registers at the start of a term (the control socket's
/// `fence` request): the term, and the command's tree if it has one.
#[derive(Debug, Clone, Deserialize)]
pub struct TermRegistration {
    /// The election file, as a path inside the mount.
    pub path: String,
    pub epoch: u64,
    /// The elector: its id, host and pid.
    #[serde(default)]
    pub who: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    /// The command's pid (its process group and session); 0: no command.
    #[serde(default)]
    pub pgid: u32,
    /// The command's cgroup, if it has one.
    #[serde(default)]
    pub cgroup: Option<String>,
}

impl TermRegistration {
    /// Refuses fields longer than what the daemon keeps of a term.
    fn check_sizes(&self) -> Result<(), String> {
        let long = |what: &str, len: usize, max: usize| {
            Err(format!("{what} of {len} bytes is longer than {max}"))
        };
        if self.who.len() > MAX_WHO {
            return long("an elector id", self.who.len(), MAX_WHO);
        }
        if self.host.len() > MAX_HOST {
            return long("a host name", self.host.len(), MAX_HOST);
        }
        if self.path.len() > MAX_PATH {
            return long("an election path", self.path.len(), MAX_PATH);
        }
        match &self.cgroup {
            Some(c) if c.len() > MAX_PATH => long("a cgroup", c.len(), MAX_PATH),
            _ => Ok(()),
        }
    }
}

impl Fences {
    /// The term election file `ino` is led under, as its elector
    /// registered it here (while its lease is in that term).
    pub fn term_of(&self, ino: u64) -> Option<Term> {
        self.terms.get(&ino).map(|t| t.clone())
    }

    /// Forgets the terms whose election file's lease is no longer held (or
    /// being recovered) at their epoch.
    fn prune_terms(&self) {
        self.terms.retain(|ino, t| {
            let i = self.leases.info(*ino);
            i.epoch == t.epoch && matches!(i.state, LeaseState::Held | LeaseState::Recovering)
        });
    }

    /// The fence (its key) of the process behind thread `tid`, if any:
    /// its process group or session is a fenced command's, or it is in a
    /// fenced command's cgroup. `who`: its identity, when already read.
    pub fn of(&self, tid: u32, who: Option<&Ident>) -> Option<u32> {
        let t = &self.table;
        if t.is_empty() {
            return None;
        }
        let read;
        let id = match who {
            Some(w) => w,
            None => {
                read = proc_info::identity(tid);
                &read
            }
        };
        if let Some(k) = [id.pgid, id.sid]
            .into_iter()
            .find(|k| *k != 0 && t.contains_key(k))
        {
            return Some(k);
        }
        if self.with_cgroup.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let cg = proc_tree::cgroup_of(tid)?;
        t.iter()
            .find(|f| {
                f.rec.cgroup.as_deref().is_some_and(|c| {
                    cg == c || cg.strip_prefix(c).is_some_and(|r| r.starts_with('/'))
                })
            })
            .map(|f| *f.key())
    }

    /// Whether the term of a fence is over.
    fn term_over(&self, f: &Fence) -> bool {
        if f.inherited {
            return true;
        }
        let info = self.leases.info(f.rec.ino);
        !(info.state == LeaseState::Held && info.epoch == f.rec.epoch)
    }

    /// EIO when `fence` (a caller's, or a handle's, of user `uid`) belongs
    /// to a term that is over; what is left of that term's tree is then
    /// stopped.
    pub fn check(&self, fence: Option<u32>, uid: u32) -> FsResult<()> {
        let Some(key) = fence else {
            return Ok(());
        };
        let Some(f) = self.table.get(&key) else {
            return Ok(());
        };
        if !self.term_over(&f) {
            return Ok(());
        }
        let epoch = f.rec.epoch;
        tracing::warn!(
            pgid = key,
            uid,
            epoch,
            election = %f.rec.leader,
            "refused: the election term of this process is over"
        );
        Err(FsError::TermOver { epoch })
    }

    /// Registers a term (`fence` on the control socket): the election
    /// file's current term, for the audit, and, when it has a command, the
    /// command's tree, durably, before the command runs.
    /// `uid` is the registering user's: each user's terms and fences are
    /// bounded ([`MAX_TERMS_PER_USER`], [`MAX_FENCES_PER_USER`]; root's
    /// are not), and so is every field kept.
    pub fn register(&self, ino: u64, reg: &TermRegistration, uid: u32) -> Result<(), String> {
        reg.check_sizes()?;
        if uid != 0 {
            let terms = self
                .terms
                .iter()
                .filter(|t| *t.key() != ino && t.uid == uid)
                .count();
            if terms >= MAX_TERMS_PER_USER {
                return Err(format!(
                    "too many election terms of uid {uid} at once (at most {MAX_TERMS_PER_USER})"
                ));
            }
            let fences = self
                .table
                .iter()
                .filter(|f| *f.key() != reg.pgid && f.uid == Some(uid))
                .count();
            if reg.pgid != 0 && fences >= MAX_FENCES_PER_USER {
                return Err(format!(
                    "too many fenced commands of uid {uid} at once (at most {MAX_FENCES_PER_USER})"
                ));
            }
        }
        let election = reg
            .path
            .rsplit_once('/')
            .map(|(dir, _)| if dir.is_empty() { "/" } else { dir })
            .unwrap_or("/")
            .to_string();
        self.terms.insert(
            ino,
            Term {
                election,
                epoch: reg.epoch,
                who: reg.who.clone(),
                host: reg.host.clone(),
                pid: reg.pid,
                uid,
            },
        );
        if reg.pgid == 0 {
            return Ok(());
        }
        let st = proc_tree::stat(reg.pgid)
            .filter(|s| !s.zombie)
            .ok_or_else(|| format!("no process {}", reg.pgid))?;
        if st.sid != reg.pgid {
            return Err(format!(
                "process {} does not lead its own session (session {})",
                reg.pgid, st.sid
            ));
        }
        if let Some(cg) = &reg.cgroup {
            if !proc_tree::is_command_cgroup(cg) {
                return Err(format!("{cg} is not a cgroup made for a command"));
            }
            if proc_tree::cgroup_of(reg.pgid).as_deref() != Some(cg.as_str()) {
                return Err(format!("process {} is not in cgroup {cg}", reg.pgid));
            }
        }
        let rec = FenceRecord {
            owner: self.owner.clone(),
            pgid: reg.pgid,
            start_ticks: st.start_ticks,
            boot_id: self.boot_id.clone(),
            cgroup: reg.cgroup.clone(),
            leader: reg.path.clone(),
            ino,
            epoch: reg.epoch,
            who: reg.who.clone(),
            pid: reg.pid,
        };
        self.meta.put_fence(&rec).map_err(|e| e.to_string())?;
        tracing::info!(pgid = reg.pgid, ino, epoch = reg.epoch, cgroup = ?reg.cgroup, "command of an election term fenced");
        self.insert(Fence {
            rec,
            uid: Some(uid),
            inherited: false,
            over_since: Mutex::new(None),
        });
        Ok(())
    }

    /// The election file (inode) whose term fenced the tree of `pgid`.
    pub fn election_of(&self, pgid: u32) -> Option<u64> {
        self.table.get(&pgid).map(|f| f.rec.ino)
    }

    /// Forgets the fence of `pgid` (its elector stopped the whole tree).
    pub fn unregister(&self, pgid: u32) {
        self.drop_fence(pgid);
    }

    fn drop_fence(&self, pgid: u32) {
        self.remove(pgid);
        if let Err(e) = self.meta.delete_fence(&self.owner, pgid) {
            tracing::warn!(pgid, "cannot forget the fence of a finished command: {e}");
        }
    }

    /// At mount: the fences a previous daemon of this data directory left.
    /// Their terms are over (their leases died with that daemon); those
    /// whose tree is gone, or of another boot, are forgotten, the others
    /// are refused everything and stopped by the first sweep.
    pub fn load(&self) -> FsResult<usize> {
        let mut n = 0;
        for rec in self.meta.fences(&self.owner)? {
            let f = Fence {
                rec,
                uid: None,
                inherited: true,
                over_since: Mutex::new(None),
            };
            let live = f.rec.boot_id == self.boot_id && !f.tree().gone();
            if !live {
                f.tree().remove_cgroup();
                self.meta.delete_fence(&self.owner, f.rec.pgid)?;
                continue;
            }
            tracing::warn!(
                pgid = f.rec.pgid,
                epoch = f.rec.epoch,
                election = %f.rec.leader,
                "the command of a term that ended with the previous daemon still runs: fenced, and stopped"
            );
            self.insert(f);
            n += 1;
        }
        Ok(n)
    }

    /// Stops what is left of the trees of terms that are over (at once if
    /// their elector is gone or stopped, else after [`ELECTOR_GRACE`]), and
    /// forgets the fences of trees that are gone.
    pub fn sweep(&self) {
        if !self.terms.is_empty() {
            self.prune_terms();
        }
        if self.table.is_empty() {
            return;
        }
        let over: Vec<(u32, Tree, bool)> = self
            .table
            .iter()
            .filter(|f| self.term_over(f))
            .map(|f| {
                let since = *lock(&f.over_since).get_or_insert_with(Instant::now);
                let elector_idle =
                    f.inherited || proc_tree::stat(f.rec.pid).is_none_or(|s| s.zombie || s.stopped);
                (
                    *f.key(),
                    f.tree(),
                    elector_idle || since.elapsed() >= ELECTOR_GRACE,
                )
            })
            .collect();
        for (pgid, tree, stop_now) in over {
            if !tree.gone() {
                if !stop_now {
                    continue;
                }
                tracing::warn!(
                    pgid,
                    "killing what is left of the command of an election term that is over"
                );
                tree.kill();
            }
            if tree.gone() {
                tree.remove_cgroup();
                self.drop_fence(pgid);
            }
        }
    }

    /// The daemon stops: every lease ends with it, and so does every term
    /// it fenced; what is left of their trees is killed and the fences
    /// forgotten.
    pub fn end_all(&self) {
        let all: Vec<(u32, Tree)> = self.table.iter().map(|f| (*f.key(), f.tree())).collect();
        for (pgid, tree) in all {
            if !tree.gone() {
                tracing::warn!(
                    pgid,
                    "the daemon stops: killing the command of an election term"
                );
                tree.kill();
            }
            if tree.gone() {
                tree.remove_cgroup();
                self.drop_fence(pgid);
            }
        }
    }

    /// The lease of `ino` may just have left its term (released,
    /// recovered, lost): sweep now rather than at the next monitor tick.
    pub fn lease_left_term(self: &Arc<Self>, ino: u64) {
        if self.table.iter().any(|f| f.rec.ino == ino) {
            let me = self.clone();
            self.rt.spawn_blocking(move || me.sweep());
        }
    }

    /// Records `preempted` for the term of an election file whose lease a
    /// recovery takes from its holder after the soft limit, before the
    /// lease can go to anyone else: the daemon that preempts is the one
    /// that knows (the successor may be on another daemon).
    /// `soft_limit` and `mount_id` (this daemon) go into the record.
    pub fn audit_preemption(&self, t: &RecoveryTicket, soft_limit: Duration, mount_id: &str) {
        if t.reason != RecoveryReason::SoftLimit {
            return;
        }
        let Some(term) = self.terms.get(&t.file).map(|e| e.clone()) else {
            return;
        };
        if term.epoch != t.stale.epoch {
            return;
        }
        let e = AuditEvent {
            election: term.election,
            event: "preempted".into(),
            who: term.who,
            host: term.host,
            pid: term.pid,
            epoch: term.epoch,
            at_ms: crate::clock::wall_ms(),
            why: format!(
                "lease not renewed for {} ms (soft limit {} ms): recovered by the daemon ({}) for another writer; the leader is fenced",
                t.stale.renewed_ms_ago.unwrap_or(0),
                soft_limit.as_millis(),
                mount_id
            ),
        };
        if let Err(err) = self.meta.audit(&e, term.uid) {
            tracing::warn!(
                epoch = e.epoch,
                "cannot record the preemption of a term: {err}"
            );
        }
    }
}

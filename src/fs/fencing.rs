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

use super::core::{Caller, Core};
use super::proc_info::{self, Ident};
use crate::error::{FsError, FsResult};
use crate::lease::{LeaseState, RecoveryReason, RecoveryTicket};
use crate::meta::{AuditEvent, FenceRecord};
use crate::proc_tree::{self, Tree};
use crate::sync::{AtomicUsize, Mutex, Ordering, lock};

/// How long the daemon leaves a live, running elector to stop the command
/// of its ended term (with its own SIGTERM and grace) before it kills the
/// tree itself. A gone or stopped elector gets no grace.
const ELECTOR_GRACE: Duration = Duration::from_secs(2);

/// One fenced process tree.
struct Fence {
    rec: FenceRecord,
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

/// The term an election file is led under, for the audit of a preemption.
#[derive(Debug, Clone)]
struct Term {
    election: String,
    epoch: u64,
    who: String,
    host: String,
    pid: u32,
}

/// The fence table of a daemon.
pub struct Fences {
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
    pub fn new(owner: String) -> Fences {
        Fences {
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

impl Core {
    /// The fence (its key) of the process behind thread `tid`, if any:
    /// its process group or session is a fenced command's, or it is in a
    /// fenced command's cgroup. `who`: its identity, when already read.
    pub(super) fn fence_of(&self, tid: u32, who: Option<&Ident>) -> Option<u32> {
        let t = &self.fences.table;
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
        if self.fences.with_cgroup.load(Ordering::Relaxed) == 0 {
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

    /// EIO when `fence` (a caller's, or a handle's) belongs to a term that
    /// is over; what is left of that term's tree is then stopped.
    pub(super) fn check_fenced(&self, fence: Option<u32>) -> FsResult<()> {
        let Some(key) = fence else {
            return Ok(());
        };
        let Some(f) = self.fences.table.get(&key) else {
            return Ok(());
        };
        if !self.term_over(&f) {
            return Ok(());
        }
        let epoch = f.rec.epoch;
        tracing::warn!(
            pgid = key,
            epoch,
            election = %f.rec.leader,
            "refused: the election term of this process is over"
        );
        Err(FsError::TermOver { epoch })
    }

    /// The one check of every request that changes the filesystem (create,
    /// remove, rename, link, attributes, xattrs, truncate, open for
    /// writing): refused with EIO when the caller belongs to the command
    /// of an election term that is over.
    pub fn may_change(&self, caller: Caller) -> FsResult<()> {
        self.check_fenced(self.fence_of(caller.pid, None))
    }

    /// Registers a term (`fence` on the control socket): the election
    /// file's current term, for the audit, and, when it has a command, the
    /// command's tree, durably, before the command runs.
    pub fn register_term(&self, ino: u64, reg: &TermRegistration) -> Result<(), String> {
        let election = reg
            .path
            .rsplit_once('/')
            .map(|(dir, _)| if dir.is_empty() { "/" } else { dir })
            .unwrap_or("/")
            .to_string();
        self.fences.terms.insert(
            ino,
            Term {
                election,
                epoch: reg.epoch,
                who: reg.who.clone(),
                host: reg.host.clone(),
                pid: reg.pid,
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
            owner: self.fences.owner.clone(),
            pgid: reg.pgid,
            start_ticks: st.start_ticks,
            boot_id: self.fences.boot_id.clone(),
            cgroup: reg.cgroup.clone(),
            leader: reg.path.clone(),
            ino,
            epoch: reg.epoch,
            who: reg.who.clone(),
            pid: reg.pid,
        };
        self.meta.put_fence(&rec).map_err(|e| e.to_string())?;
        tracing::info!(pgid = reg.pgid, ino, epoch = reg.epoch, cgroup = ?reg.cgroup, "command of an election term fenced");
        self.fences.insert(Fence {
            rec,
            inherited: false,
            over_since: Mutex::new(None),
        });
        Ok(())
    }

    /// The election file (inode) whose term fenced the tree of `pgid`.
    pub fn fenced_election(&self, pgid: u32) -> Option<u64> {
        self.fences.table.get(&pgid).map(|f| f.rec.ino)
    }

    /// Forgets the fence of `pgid` (its elector stopped the whole tree).
    pub fn unregister_fence(&self, pgid: u32) {
        self.drop_fence(pgid);
    }

    fn drop_fence(&self, pgid: u32) {
        self.fences.remove(pgid);
        if let Err(e) = self.meta.delete_fence(&self.fences.owner, pgid) {
            tracing::warn!(pgid, "cannot forget the fence of a finished command: {e}");
        }
    }

    /// At mount: the fences a previous daemon of this data directory left.
    /// Their terms are over (their leases died with that daemon); those
    /// whose tree is gone, or of another boot, are forgotten, the others
    /// are refused everything and stopped by the first sweep.
    pub fn load_fences(&self) -> FsResult<usize> {
        let mut n = 0;
        for rec in self.meta.fences(&self.fences.owner)? {
            let f = Fence {
                rec,
                inherited: true,
                over_since: Mutex::new(None),
            };
            let live = f.rec.boot_id == self.fences.boot_id && !f.tree().gone();
            if !live {
                f.tree().remove_cgroup();
                self.meta.delete_fence(&self.fences.owner, f.rec.pgid)?;
                continue;
            }
            tracing::warn!(
                pgid = f.rec.pgid,
                epoch = f.rec.epoch,
                election = %f.rec.leader,
                "the command of a term that ended with the previous daemon still runs: fenced, and stopped"
            );
            self.fences.insert(f);
            n += 1;
        }
        Ok(n)
    }

    /// Stops what is left of the trees of terms that are over (at once if
    /// their elector is gone or stopped, else after [`ELECTOR_GRACE`]), and
    /// forgets the fences of trees that are gone.
    pub fn sweep_fences(&self) {
        if self.fences.table.is_empty() {
            return;
        }
        let over: Vec<(u32, Tree, bool)> = self
            .fences
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
    pub fn end_all_terms(&self) {
        let all: Vec<(u32, Tree)> = self
            .fences
            .table
            .iter()
            .map(|f| (*f.key(), f.tree()))
            .collect();
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
    pub(super) fn lease_left_term(self: &crate::sync::Arc<Self>, ino: u64) {
        if self.fences.table.iter().any(|f| f.rec.ino == ino) {
            let me = self.clone();
            self.ctx.rt.spawn_blocking(move || me.sweep_fences());
        }
    }

    /// Records `preempted` for the term of an election file whose lease a
    /// recovery takes from its holder after the soft limit, before the
    /// lease can go to anyone else: the daemon that preempts is the one
    /// that knows (the successor may be on another daemon).
    pub(super) fn audit_preemption(&self, t: &RecoveryTicket) {
        if t.reason != RecoveryReason::SoftLimit {
            return;
        }
        let Some(term) = self.fences.terms.get(&t.file).map(|e| e.clone()) else {
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
                self.opts.soft_limit.as_millis(),
                self.mount_id
            ),
        };
        if let Err(err) = self.meta.audit(&e) {
            tracing::warn!(
                epoch = e.epoch,
                "cannot record the preemption of a term: {err}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    //! The fence table driven in process: a real core over a SQLite store
    //! and one datanode, and a real process in a session of its own as the
    //! term's command (fencing goes by what /proc says about a caller).

    use std::process::{Child, Command};
    use std::sync::mpsc;

    use super::*;
    use crate::config::MountOptions;
    use crate::fs::core::{Instance, Opened, Reply};
    use crate::fs::namespace::Node;
    use crate::meta::{AttrChange, Kind, Meta, MetaStore, ROOT_INO};
    use crate::pipeline::Datanodes;
    use crate::sync::Arc;

    struct Setup {
        dir: tempfile::TempDir,
        meta: Arc<dyn Meta>,
        _rt: tokio::runtime::Runtime,
        handle: tokio::runtime::Handle,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta: Arc<dyn Meta> =
            Arc::new(MetaStore::open(&dir.path().join("meta.db"), 0, 0).expect("store"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime");
        let handle = rt.handle().clone();
        Setup {
            dir,
            meta,
            _rt: rt,
            handle,
        }
    }

    /// A daemon's core on the setup's data directory.
    fn core(s: &Setup) -> Arc<Core> {
        let dns = Datanodes::unregistered(&[s.dir.path().join("dn1")], 1).expect("datanode");
        Core::with_system_clock(
            s.meta.clone(),
            Arc::new(dns),
            MountOptions::default(),
            s.handle.clone(),
            s.dir.path().join("data"),
            Instance::new(),
        )
    }

    fn wait<T: Send + 'static>(f: impl FnOnce(Reply<T>)) -> FsResult<T> {
        let (tx, rx) = mpsc::channel();
        f(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        rx.recv_timeout(Duration::from_secs(10)).expect("reply")
    }

    fn open(c: &Arc<Core>, ino: u64, flags: i32, who: Caller) -> FsResult<u64> {
        wait(|r: Reply<Opened>| c.open(ino, flags, who, r)).map(|o| o.fh)
    }

    fn caller(pid: u32) -> Caller {
        Caller {
            pid,
            uid: 0,
            gid: 0,
        }
    }

    fn file(kind: Kind) -> Node {
        Node {
            kind,
            mode: 0o644,
            rdev: 0,
            target: None,
            umask: 0,
        }
    }

    /// A command: `sleep` as the leader of a session of its own.
    fn command() -> Child {
        let c = Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .expect("setsid sleep");
        let pid = c.id();
        let end = Instant::now() + Duration::from_secs(5);
        while proc_tree::stat(pid).is_none_or(|s| s.sid != pid) {
            assert!(Instant::now() < end, "no session of its own");
            std::thread::sleep(Duration::from_millis(5));
        }
        c
    }

    fn term(pgid: u32, epoch: u64) -> TermRegistration {
        TermRegistration {
            path: "/LEADER".into(),
            epoch,
            who: "a".into(),
            host: "h".into(),
            // No elector process: the daemon stops the tree at once.
            pid: u32::MAX,
            pgid,
            cgroup: None,
        }
    }

    fn is_term_over<T: std::fmt::Debug>(r: FsResult<T>) -> bool {
        matches!(r, Err(FsError::TermOver { .. }))
    }

    /// Whether a control request of process `who` (as root) was refused
    /// because its term is over.
    fn control(c: &Arc<Core>, who: Caller, req: serde_json::Value) -> bool {
        let peer = crate::fs::control::Peer {
            pid: who.pid,
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        };
        let a = crate::fs::control::requests::answer(c, std::path::Path::new("/mnt"), &peer, &req);
        a["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("permission denied: the election term"))
    }

    #[test]
    fn every_change_by_an_ended_terms_tree_is_refused_and_the_tree_stopped() {
        let s = setup();
        let c = core(&s);
        let me = caller(std::process::id());
        let leader = c
            .mknode(ROOT_INO, b"LEADER", file(Kind::File), me)
            .expect("LEADER");
        let f = c.mknode(ROOT_INO, b"f", file(Kind::File), me).expect("f");
        let lfh = open(&c, leader.ino, libc::O_WRONLY, me).expect("lead");
        let epoch = c.last_epoch(leader.ino).expect("epoch");
        let mut cmd = command();
        let pgid = cmd.id();
        c.register_term(leader.ino, &term(pgid, epoch))
            .expect("fence");
        let it = caller(pgid);

        // During the term the command may do anything.
        let ffh = open(&c, f.ino, libc::O_WRONLY | libc::O_APPEND, it).expect("open f");
        assert_eq!(
            wait(|r| c.write(ffh, 0, b"a\n", (it, false), r)).expect("write"),
            2
        );
        c.mknode(ROOT_INO, b"d", file(Kind::Dir), it)
            .expect("mkdir");

        // The term ends: the election file's lease is released.
        wait(|r| c.release(lfh, r)).expect("release");
        let refused = [
            (
                "mkdir",
                is_term_over(c.mknode(ROOT_INO, b"d2", file(Kind::Dir), it)),
            ),
            ("unlink", is_term_over(c.unlink(ROOT_INO, b"f", it))),
            ("rmdir", is_term_over(c.rmdir(ROOT_INO, b"d", it))),
            (
                "rename",
                is_term_over(c.rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, it)),
            ),
            ("link", is_term_over(c.link(f.ino, ROOT_INO, b"h", it))),
            (
                "setxattr",
                is_term_over(c.setxattr(f.ino, b"user.x", b"1", 0, it)),
            ),
            (
                "removexattr",
                is_term_over(c.removexattr(f.ino, b"user.x", it)),
            ),
            (
                "chmod",
                is_term_over(c.set_attrs(
                    f.ino,
                    AttrChange {
                        mode: Some(0o600),
                        ..Default::default()
                    },
                    it,
                )),
            ),
            (
                "truncate",
                is_term_over(wait(|r| c.set_size(f.ino, 0, None, it, r))),
            ),
            ("open", is_term_over(open(&c, f.ino, libc::O_WRONLY, it))),
            (
                "write",
                is_term_over(wait(|r| c.write(ffh, 2, b"b\n", (it, false), r))),
            ),
            (
                "ioctl",
                is_term_over(c.ioctl(ffh, crate::fs::core::IOC_RENEW)),
            ),
            // The control socket's changes, root's included: above all,
            // the tree may not drop its own fence.
            (
                "control unfence",
                control(&c, it, serde_json::json!({"op": "unfence", "pgid": pgid})),
            ),
            (
                "control recover",
                control(&c, it, serde_json::json!({"op": "recover", "path": "/f"})),
            ),
            (
                "control fsck repair",
                control(&c, it, serde_json::json!({"op": "fsck", "repair": true})),
            ),
        ];
        let let_through: Vec<&str> = refused.iter().filter(|r| !r.1).map(|r| r.0).collect();
        assert!(let_through.is_empty(), "not refused: {let_through:?}");
        assert!(c.fenced_election(pgid).is_some(), "the fence was dropped");
        // Anyone else is not fenced; reading is never refused.
        c.mknode(ROOT_INO, b"mine", file(Kind::File), me)
            .expect("others may");
        assert!(c.lookup(ROOT_INO, b"f").is_ok());

        // The sweep kills what is left of the tree, then forgets it.
        c.sweep_fences();
        let st = cmd.wait().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL)
        );
        c.sweep_fences();
        assert!(s.meta.fences(&c.fences.owner).expect("fences").is_empty());
        assert!(c.fences.table.is_empty());
    }

    #[test]
    fn a_restarted_daemon_inherits_the_fences_and_pid_reuse_is_not_fenced() {
        let s = setup();
        let mut cmd = command();
        let pgid = cmd.id();
        {
            let c = core(&s);
            let me = caller(std::process::id());
            let leader = c
                .mknode(ROOT_INO, b"LEADER", file(Kind::File), me)
                .expect("LEADER");
            let _lfh = open(&c, leader.ino, libc::O_WRONLY, me).expect("lead");
            let epoch = c.last_epoch(leader.ino).expect("epoch");
            c.register_term(leader.ino, &term(pgid, epoch))
                .expect("fence");
            c.mknode(ROOT_INO, b"during", file(Kind::Dir), caller(pgid))
                .expect("during the term");
            // A record of a tree that is gone (its number may be anyone's
            // now), and one from another boot.
            for (pg, boot) in [(pgid + 1_000_000, "this"), (std::process::id(), "other")] {
                let mut rec = s.meta.fences(&c.fences.owner).expect("fences")[0].clone();
                rec.pgid = pg;
                if boot == "other" {
                    rec.boot_id = "another boot".into();
                }
                s.meta.put_fence(&rec).expect("put");
            }
            // The daemon dies with the lease held: no release, no sweep.
        }
        let c = core(&s);
        assert_eq!(c.load_fences().expect("load"), 1);
        assert!(is_term_over(c.mknode(
            ROOT_INO,
            b"after",
            file(Kind::Dir),
            caller(pgid)
        )));
        // This process's own number was in the other boot's record: not fenced.
        let me = caller(std::process::id());
        c.mknode(ROOT_INO, b"mine", file(Kind::Dir), me)
            .expect("not fenced");
        c.sweep_fences();
        let st = cmd.wait().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL)
        );
        c.sweep_fences();
        assert!(s.meta.fences(&c.fences.owner).expect("fences").is_empty());
    }
}

//! The candidate / leader loop of one elector.
//!
//! Follower: every `retry` (with a little jitter, so that candidates do not
//! march in step) read the election file's lease for the log, then try to
//! open the file for writing. `EBUSY` means someone leads. An open that
//! succeeds after the leader's lease went unrenewed past the soft limit made
//! the daemon recover that lease first: that is the clean-up of an expired
//! leader, and the successor records it (`preempted` or `expired`).
//!
//! Leader (takeLeadership): client renewal at once, the grant's epoch is the
//! term's, `elected` goes to the audit table, the command starts fenced
//! under that epoch, the term's record is appended to the election file.
//! Then renew every `renew_interval` and watch the command.
//!
//! The term ends (loseLeadership) when a renewal is refused (`EIO`: the
//! lease was taken over), when no renewal succeeded within the renew
//! deadline (also the first thing a leader woken from `SIGSTOP` sees), when
//! the command exits (the leader resigns) or when the elector is told to
//! stop. Always in the same order: the command's process group is stopped,
//! the event is recorded, the fence is dropped, and only then the election
//! file is closed, which hands the lease on at once. So the successor finds
//! the event of its predecessor's end in the table, unless the predecessor
//! died; then the successor records `expired` for it.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::time::Duration;

use tracing::{info, warn};

use super::command::{self, Exit, Running, SpawnError};
use super::control::{self, Control, EventKind};
use super::guard::{Renewer, Watchdog};
use super::leader_file::{LeaderFile, LeaderRecord, LeaseView, OpenError, last_record};
use super::timing::{RenewTracker, Timing};
use super::verdict::judge_predecessor;
use super::{ElectError, LEADER_FILE};
use crate::clock::{BootClock, Clock};
use crate::meta::AuditEvent;
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock};

/// One candidate of one election.
pub struct Elector {
    /// The election directory (created if missing); the lease is on its
    /// `LEADER` file.
    pub dir: PathBuf,
    /// `dir` as a path inside the mount (`/jobs/elect`): the key of the
    /// audit table and the base of the fenced path.
    pub dir_in_mount: String,
    /// This candidate's name in records and events.
    pub id: String,
    /// The leader's command and its arguments; empty: lead without one.
    pub command: Vec<OsString>,
    pub timing: Timing,
    /// End after the first term instead of competing again.
    pub once: bool,
    pub host: String,
    clock: Arc<dyn Clock>,
    /// Audit events not recorded yet (the daemon did not answer), oldest
    /// first: written before anything newer, retried on every round.
    pending: Mutex<VecDeque<AuditEvent>>,
}

/// How a term ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermEnd {
    /// The command exited (with this exit), or there was none to wait for.
    Resigned(Option<Exit>),
    /// Leadership was lost; why.
    Lost(String),
    /// The elector was asked to stop and resigned.
    Stopped,
}

/// How [`Elector::run`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Asked to stop (after resigning, if it led).
    Stopped,
    /// `once`: the first term ended like this.
    Once(TermEnd),
}

impl Elector {
    pub fn new(
        dir: PathBuf,
        dir_in_mount: String,
        id: String,
        command: Vec<OsString>,
        timing: Timing,
    ) -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into());
        Elector {
            dir,
            dir_in_mount,
            id,
            command,
            timing,
            once: false,
            host,
            clock: Arc::new(BootClock),
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// The election file inside the mount, as the daemon's fence names it.
    fn leader_in_mount(&self) -> String {
        format!("{}/{LEADER_FILE}", self.dir_in_mount.trim_end_matches('/'))
    }

    /// Competes, leads and follows until `stop` is set (by a signal
    /// handler, say), or until the first term ends with `once`.
    pub fn run(&self, ctl: &dyn Control, stop: &AtomicBool) -> Result<Outcome, ElectError> {
        let r = self.compete(ctl, stop);
        self.flush_audit_before_exit(ctl);
        r
    }

    fn compete(&self, ctl: &dyn Control, stop: &AtomicBool) -> Result<Outcome, ElectError> {
        self.timing.validate()?;
        crate::proc_tree::remove_stale_cgroups();
        std::fs::create_dir_all(&self.dir).map_err(|source| ElectError::Dir {
            path: self.dir.clone(),
            source,
        })?;
        let path = self.dir.join(LEADER_FILE);
        let mut watch = Watch::default();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(Outcome::Stopped);
            }
            self.flush_audit(ctl);
            let seen = LeaseView::read(&path).map(|v| (v, self.clock.now()));
            self.observe(&mut watch, seen.as_ref().map(|(v, _)| v));
            match LeaderFile::open(&path) {
                Ok(file) => {
                    match self.lead(file, seen, ctl, stop)? {
                        Some(TermEnd::Stopped) => return Ok(Outcome::Stopped),
                        Some(end) if self.once => return Ok(Outcome::Once(end)),
                        _ => {}
                    }
                    watch = Watch::default();
                }
                Err(OpenError::Busy) => {}
                Err(OpenError::Transient(e)) => {
                    warn!("cannot open {} for now: {e}; retrying", path.display())
                }
                Err(OpenError::Fatal(source)) => return Err(ElectError::Open { path, source }),
            }
            self.sleep(jitter(self.timing.retry), stop);
        }
    }

    /// Logs who leads, and when the leader's lease looks expired.
    fn observe(&self, w: &mut Watch, seen: Option<&LeaseView>) {
        let Some(v) = seen.filter(|v| v.is_held()) else {
            return;
        };
        if v.epoch != w.epoch {
            w.epoch = v.epoch;
            w.expiry_noted = false;
            let who = last_record(&self.dir.join(LEADER_FILE))
                .ok()
                .flatten()
                .filter(|r| r.epoch == v.epoch)
                .map(|r| r.id)
                .unwrap_or_else(|| v.holder.clone().unwrap_or_else(|| "?".into()));
            info!(
                epoch = v.epoch,
                holder = v.holder.as_deref().unwrap_or("-"),
                "following leader {who}"
            );
        }
        let lease_ms = self.timing.lease.as_millis() as u64;
        if !w.expiry_noted && v.looks_expired(lease_ms, 0) {
            w.expiry_noted = true;
            info!(
                epoch = v.epoch,
                renewed_ms_ago = v.renewed_ms_ago.unwrap_or(0),
                "the leader's lease has expired; taking over"
            );
        }
    }

    /// One term, from a successful open of the election file. `None` when
    /// the lease was gone before the term could start.
    fn lead(
        &self,
        mut file: LeaderFile,
        seen: Option<(LeaseView, Duration)>,
        ctl: &dyn Control,
        stop: &AtomicBool,
    ) -> Result<Option<TermEnd>, ElectError> {
        let started = self.clock.now();
        let not_leasefs = |what, source| ElectError::NotLeasefs {
            path: file.path().to_path_buf(),
            what,
            source,
        };
        if let Err(e) = file.client_renewal() {
            if is_eio(&e) {
                warn!("the lease was taken before the term could start");
                return Ok(None);
            }
            return Err(not_leasefs("client renewal ioctl", e));
        }
        let mut tracker = RenewTracker::new(self.timing, started);
        // How long the daemon vouches for the lease now (over etcd: what
        // etcd confirmed of the claim), before anything of the term runs.
        let sent = self.clock.now();
        match file.renew_valid() {
            Ok(assured) => tracker.renewed(sent, assured),
            Err(e) if lease_gone(&e) => {
                warn!("the lease was taken before the term could start");
                return Ok(None);
            }
            Err(e) => return Err(not_leasefs("renewal ioctl", e)),
        }
        let epoch = match file.epoch() {
            Ok(e) => e,
            Err(e) if is_eio(&e) => return Ok(None),
            Err(e) => return Err(not_leasefs("epoch ioctl", e)),
        };

        let elected_why = self.settle_predecessor(&file, epoch, seen, started, ctl);

        let env = [
            ("LEASEFS_EPOCH", epoch.to_string()),
            ("LEASEFS_ELECTION", self.dir.display().to_string()),
            ("LEASEFS_ID", self.id.clone()),
        ];
        let leader = self.leader_in_mount();
        let mut rec = LeaderRecord {
            id: self.id.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            epoch,
            time_ms: crate::clock::wall_ms(),
            pgid: None,
            cgroup: None,
        };
        // The term begins, in this order: registered with the daemon (with
        // the command's tree, fenced before it runs), its record in the
        // election file (what a successor reads), `elected` in the audit
        // table, and only then the command.
        let mut running: Option<Running> = None;
        let mut dog: Option<Watchdog> = None;
        if self.command.is_empty() {
            let term = self.term_info(&leader, epoch, None);
            if let Err(e) = control::fence(ctl, &term) {
                warn!(epoch, "the daemon did not register the term: {e}");
            }
            if let Err(e) = file.append_record(&rec) {
                warn!(
                    epoch,
                    "the term ended before it began: cannot write its record ({e})"
                );
                return Ok(None);
            }
            self.record(
                ctl,
                self.event(EventKind::Elected, epoch, elected_why.clone()),
            );
        } else {
            let mut began: Result<(), std::io::Error> = Ok(());
            let mut late = false;
            let fd = file.raw_fd();
            let start = |tree: &crate::proc_tree::Tree| {
                // Armed before anything can block on the daemon: a term
                // whose beginning outlasts its lease is discarded unrun.
                dog = Some(Watchdog::start(
                    tree.clone(),
                    self.clock.clone(),
                    tracker.stop_at(),
                    tracker.kill_at(),
                ));
                let term =
                    self.term_info(&leader, epoch, Some((tree.leader, tree.cgroup.as_deref())));
                control::fence(ctl, &term)?;
                rec.pgid = Some(tree.leader);
                rec.cgroup = tree.cgroup.clone();
                if let Err(e) = file.append_record(&rec) {
                    began = Err(e);
                    return Err("the term's record could not be written".into());
                }
                self.record(
                    ctl,
                    self.event(EventKind::Elected, epoch, elected_why.clone()),
                );
                if tracker.deadline_missed(self.clock.now()).is_some() {
                    late = true;
                    return Err("the lease may have run out while the term began".into());
                }
                Ok(())
            };
            match command::spawn(&self.command, &env, fd, start) {
                Ok(r) => {
                    info!(epoch, pgid = r.pgid(), cgroup = ?r.tree().cgroup, "command started");
                    running = Some(r);
                }
                Err(e) => {
                    // Nothing of the command ran; its fence, if it was
                    // registered, is for a tree that is gone.
                    if let Some(pgid) = rec.pgid
                        && let Err(err) = control::unfence(ctl, pgid)
                    {
                        warn!(
                            pgid,
                            "cannot drop the fence of a command that never ran: {err}"
                        );
                    }
                    if let Err(io) = began {
                        warn!(
                            epoch,
                            "the term ended before it began: cannot write its record ({io})"
                        );
                        return Ok(None);
                    }
                    if late {
                        // Begun (recorded) but its deadline passed before
                        // the command could run: lost, and compete again.
                        let why = format!(
                            "renew deadline missed before the command could start: no renewal the daemon vouched for in {} ms (deadline {} ms, lease {} ms)",
                            self.clock
                                .now()
                                .saturating_sub(tracker.last_ok())
                                .as_millis(),
                            self.timing.renew_deadline.as_millis(),
                            self.timing.lease.as_millis()
                        );
                        self.record(ctl, self.event(EventKind::Lost, epoch, why.clone()));
                        drop(file);
                        return Ok(Some(TermEnd::Lost(why)));
                    }
                    if matches!(e, SpawnError::Fence(_))
                        && file.epoch().is_err_and(|e| lease_gone(&e))
                    {
                        warn!(
                            epoch,
                            "the lease was lost before the command could start: {e}"
                        );
                        return Ok(None);
                    }
                    if rec.pgid.is_some() {
                        // Recorded as begun: it ends here.
                        self.record(
                            ctl,
                            self.event(
                                EventKind::Resigned,
                                epoch,
                                format!("command could not start: {e}"),
                            ),
                        );
                    }
                    drop(file);
                    return Err(match e {
                        SpawnError::Fence(reason) => ElectError::Control {
                            what: "to fence the command",
                            reason,
                        },
                        other => ElectError::Spawn {
                            program: self.command[0].to_string_lossy().into_owned(),
                            reason: other.to_string(),
                        },
                    });
                }
            }
        }

        let mut renewer = Renewer::new(file.shared(), self.clock.clone());
        loop {
            let now = self.clock.now();
            if let Some((sent, answer)) = renewer.poll() {
                match answer {
                    Ok(assured) => {
                        tracker.renewed(sent, assured);
                        if let Some(d) = &dog {
                            d.extend(tracker.stop_at(), tracker.kill_at());
                        }
                    }
                    Err(e) if lease_gone(&e) => {
                        let why = if is_eio(&e) {
                            format!("fenced: renewal refused, the lease was taken over ({e})")
                        } else {
                            format!(
                                "fenced: the daemon that held the lease is gone ({e}); the lease ended with it"
                            )
                        };
                        return Ok(Some(self.end_term(
                            ctl,
                            file,
                            (running, dog),
                            epoch,
                            EventKind::Lost,
                            why,
                        )));
                    }
                    Err(e) => {
                        warn!(epoch, "lease renewal failed: {e}; retrying");
                        tracker.failed(now);
                    }
                }
            }
            if dog.as_ref().is_some_and(Watchdog::fired) || tracker.deadline_missed(now).is_some() {
                let age = now.saturating_sub(tracker.last_ok());
                let stalled = if renewer.pending() {
                    "; the daemon has not answered the last renewal"
                } else {
                    ""
                };
                // Stop first: only then ask the daemon anything.
                let mut both = (running, dog);
                stop_tree(&mut both, self.clock.now(), self.timing.kill_grace);
                let fenced = file.epoch().is_err_and(|e| lease_gone(&e));
                let why = format!(
                    "renew deadline missed: no renewal the daemon vouched for in {} ms (deadline {} ms, lease {} ms){stalled}{}",
                    age.as_millis(),
                    self.timing.renew_deadline.as_millis(),
                    self.timing.lease.as_millis(),
                    if fenced {
                        "; fenced: the lease was taken over"
                    } else {
                        ""
                    }
                );
                return Ok(Some(self.end_term(
                    ctl,
                    file,
                    both,
                    epoch,
                    EventKind::Lost,
                    why,
                )));
            }
            if stop.load(Ordering::Relaxed) {
                let why = "the elector was asked to stop".to_string();
                self.end_term(ctl, file, (running, dog), epoch, EventKind::Resigned, why);
                return Ok(Some(TermEnd::Stopped));
            }
            if let Some(exit) = running.as_mut().and_then(Running::try_wait) {
                // A command that died of its fencing did not resign.
                if file.epoch().is_err_and(|e| lease_gone(&e)) {
                    let why =
                        format!("fenced: the lease was taken over; command ended with {exit}");
                    return Ok(Some(self.end_term(
                        ctl,
                        file,
                        (running, dog),
                        epoch,
                        EventKind::Lost,
                        why,
                    )));
                }
                let why = format!("command ended with {exit}");
                self.end_term(ctl, file, (running, dog), epoch, EventKind::Resigned, why);
                return Ok(Some(TermEnd::Resigned(Some(exit))));
            }
            if tracker.due(now) && !renewer.pending() {
                renewer.send();
            }
            // Events waiting for the daemon: only while no renewal waits
            // for it either (a stalled daemon would stall this loop; the
            // watchdog would still stop the command on time).
            if !renewer.pending() && !lock(&self.pending).is_empty() {
                self.flush_audit(ctl);
            }
            let nap = tracker.until_next(self.clock.now()).min(self.timing.poll());
            std::thread::sleep(nap.max(Duration::from_millis(1)));
        }
    }

    /// Records how the predecessor's term ended when it could not say so
    /// itself (it died, or it was preempted while stopped), and its start
    /// if it died before recording that. Returns the `why` of this term's
    /// `elected`. The daemon leaves out what repeats the table (another
    /// start of a term, a second account of its end), so an audit table
    /// that cannot be read is no reason to record nothing.
    fn settle_predecessor(
        &self,
        file: &LeaderFile,
        epoch: u64,
        seen: Option<(LeaseView, Duration)>,
        won_at: Duration,
        ctl: &dyn Control,
    ) -> String {
        let prev = match last_record(file.path()) {
            Ok(p) => p.filter(|p| p.epoch < epoch),
            Err(e) => {
                warn!("cannot read the election file's records: {e}");
                None
            }
        };
        let history = match &prev {
            Some(_) => self.read_history(ctl),
            None => None,
        };
        let alive = prev.as_ref().is_some_and(|p| {
            p.host == self.host && p.pid != std::process::id() && pid_alive(p.pid)
        });
        let seen = seen.map(|(v, at)| (v, won_at.saturating_sub(at).as_millis() as u64));
        let verdict = judge_predecessor(
            prev.as_ref(),
            history.as_deref(),
            seen.as_ref().map(|(v, ms)| (v, *ms)),
            self.timing.lease.as_millis() as u64,
            alive,
            &self.id,
        );
        if let Some(p) = &prev {
            let about = |event: EventKind, at_ms: u64, why: String| AuditEvent {
                election: self.dir_in_mount.clone(),
                event: event.as_str().into(),
                who: p.id.clone(),
                host: p.host.clone(),
                pid: p.pid,
                epoch: p.epoch,
                at_ms,
                why,
            };
            if verdict.start_missing {
                let why = format!(
                    "recorded by {}: the term's record is in the election file, its start was not in the audit table",
                    self.id
                );
                self.record(ctl, about(EventKind::Elected, p.time_ms, why));
            }
            if let Some((kind, why)) = verdict.event {
                self.record(ctl, about(kind, crate::clock::wall_ms(), why));
            }
        }
        verdict.elected_why
    }

    /// The audit table, read again a few times if the daemon does not
    /// answer at once; `None` if it still cannot be read.
    fn read_history(&self, ctl: &dyn Control) -> Option<Vec<AuditEvent>> {
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100));
            }
            match control::history(ctl, &self.dir_in_mount) {
                Ok(h) => return Some(h),
                Err(e) => last = e,
            }
        }
        warn!("cannot read the audit table ({last}); recording the predecessor's end regardless");
        None
    }

    /// The term as the daemon registers it.
    fn term_info<'a>(
        &'a self,
        leader: &'a str,
        epoch: u64,
        command: Option<(u32, Option<&'a str>)>,
    ) -> control::TermInfo<'a> {
        control::TermInfo {
            leader,
            epoch,
            who: &self.id,
            host: &self.host,
            pid: std::process::id(),
            command,
        }
    }

    /// loseLeadership / resign: stop the command's group, record the event,
    /// drop the fence, close the election file (the lease goes on at once).
    fn end_term(
        &self,
        ctl: &dyn Control,
        file: LeaderFile,
        mut command: (Option<Running>, Option<Watchdog>),
        epoch: u64,
        kind: EventKind,
        why: String,
    ) -> TermEnd {
        let group_gone = stop_tree(&mut command, self.clock.now(), self.timing.kill_grace);
        let pgid = command.0.as_ref().map(Running::pgid);
        drop(command);
        self.record(ctl, self.event(kind, epoch, why.clone()));
        if let Some(pgid) = pgid {
            if group_gone {
                if let Err(e) = control::unfence(ctl, pgid) {
                    warn!(pgid, "cannot drop the command's fence: {e}");
                }
            } else {
                warn!(
                    pgid,
                    "processes of the command's group are left; its fence stays"
                );
            }
        }
        drop(file);
        match kind {
            EventKind::Lost => TermEnd::Lost(why),
            _ => TermEnd::Resigned(None),
        }
    }

    fn event(&self, kind: EventKind, epoch: u64, why: String) -> AuditEvent {
        AuditEvent {
            election: self.dir_in_mount.clone(),
            event: kind.as_str().into(),
            who: self.id.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            epoch,
            at_ms: crate::clock::wall_ms(),
            why,
        }
    }

    /// Logs an event and appends it to the audit table, after any event
    /// still waiting. An event the daemon does not take now waits in
    /// order and is tried again on every round (a restarting daemon, an
    /// etcd out of reach), never a reason to give up leadership.
    fn record(&self, ctl: &dyn Control, e: AuditEvent) {
        if e.event == "lost" {
            warn!(event = %e.event, who = %e.who, epoch = e.epoch, "{}", e.why);
        } else {
            info!(event = %e.event, who = %e.who, epoch = e.epoch, "{}", e.why);
        }
        lock(&self.pending).push_back(e);
        self.flush_audit(ctl);
    }

    /// Writes the events waiting, oldest first, until one fails.
    fn flush_audit(&self, ctl: &dyn Control) -> bool {
        let mut q = lock(&self.pending);
        while let Some(e) = q.front() {
            if let Err(err) = control::audit(ctl, e) {
                warn!(
                    waiting = q.len(),
                    "cannot record '{}' (epoch {}) in the audit table yet: {err}", e.event, e.epoch
                );
                return false;
            }
            q.pop_front();
        }
        true
    }

    /// Before the elector exits: a few more tries for the events still
    /// waiting, then each one that never made it is reported.
    fn flush_audit_before_exit(&self, ctl: &dyn Control) {
        let end = self.clock.now() + Duration::from_secs(3);
        while !self.flush_audit(ctl) && self.clock.now() < end {
            std::thread::sleep(Duration::from_millis(200));
        }
        for e in lock(&self.pending).drain(..) {
            tracing::error!(
                "this event never reached the audit table: {}",
                serde_json::to_string(&e).unwrap_or_default()
            );
        }
    }

    /// Sleeps `d`, waking early when `stop` is set.
    fn sleep(&self, d: Duration, stop: &AtomicBool) {
        let end = self.clock.now() + d;
        while !stop.load(Ordering::Relaxed) {
            let left = end.saturating_sub(self.clock.now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(25)));
        }
    }
}

/// Stops the command's tree (if any) within `grace`, and no later than
/// the watchdog's kill deadline; then disarms the watchdog. Whether no
/// process of the tree is left.
fn stop_tree(
    command: &mut (Option<Running>, Option<Watchdog>),
    now: Duration,
    grace: Duration,
) -> bool {
    let (running, dog) = command;
    let Some(r) = running.as_mut() else {
        *dog = None;
        return true;
    };
    let grace = match dog.as_ref() {
        Some(d) => grace.min(d.kill_at().saturating_sub(now)),
        None => grace,
    };
    let (_, gone) = r.stop(grace);
    *dog = None;
    gone
}

/// What a follower remembers of the leader it watches, for its log.
#[derive(Default)]
struct Watch {
    epoch: u64,
    expiry_noted: bool,
}

fn is_eio(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

/// The lease is gone: taken over (`EIO`), or its daemon is (the mount is
/// dead: `ENOTCONN`; a daemon restarted on the data directory recovers
/// the file, so the lease does not come back).
fn lease_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO) | Some(libc::ENOTCONN) | Some(libc::ENODEV)
    )
}

/// True while process `pid` exists and is not a zombie.
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// `d` stretched by up to 20 %, so that candidates started together do not
/// try in lock step.
fn jitter(d: Duration) -> Duration {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let frac = (h.finish() % 1000) as u32;
    d + d * frac / 5000
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_events_wait_in_order_until_the_daemon_takes_them() {
        use std::cell::RefCell;
        let written = RefCell::new(Vec::<String>::new());
        let down = std::cell::Cell::new(true);
        let ctl = |req: serde_json::Value| {
            if down.get() {
                return Err("cannot reach the daemon".to_string());
            }
            written
                .borrow_mut()
                .push(req["event"]["event"].as_str().unwrap_or("").to_string());
            Ok(serde_json::json!({"id": 1}))
        };
        let e = Elector::new(
            "/m/e".into(),
            "/e".into(),
            "a".into(),
            Vec::new(),
            Timing::from_lease(Duration::from_secs(2), Duration::from_millis(100)),
        );
        e.record(&ctl, e.event(EventKind::Elected, 5, "first".into()));
        e.record(&ctl, e.event(EventKind::Lost, 5, "fenced".into()));
        assert!(written.borrow().is_empty());
        assert_eq!(lock(&e.pending).len(), 2);
        down.set(false);
        e.record(&ctl, e.event(EventKind::Elected, 9, "next".into()));
        assert_eq!(*written.borrow(), ["elected", "lost", "elected"]);
        assert!(lock(&e.pending).is_empty());
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(200));
            assert!(
                j >= Duration::from_millis(200) && j <= Duration::from_millis(240),
                "{j:?}"
            );
        }
    }
}

//! The election's clocks: how long a lease lives without renewal, how often
//! the leader renews, by when it must have renewed (the renew deadline), and
//! how often followers try. [`RenewTracker`] is the leader's bookkeeping of
//! the deadline, kept free of sleeping and I/O so that tests drive it with
//! plain durations.
//!
//! The renew deadline is shorter than the lease (as `RenewDeadline <
//! LeaseDuration` in Kubernetes' leaderelection): a leader that has not
//! renewed by then stops its command while its lease is still valid, so the
//! command is gone before any follower can take the lease over. Each
//! renewal also says how long the daemon can vouch for the lease (over
//! etcd: no more than what etcd confirmed of its claim), and
//! the command is stopped before that runs out too, whichever comes first.
//! Time is the boot clock: it keeps running while the process is stopped
//! or the machine suspended, so a leader woken up sees at once that it
//! missed the deadline.

use std::time::Duration;

use super::ElectError;

/// The durations of one election. Every candidate of an election should use
/// the same values, and `lease` must be the mount's `soft_limit`: the
/// daemon, not this struct, decides when a lease can be taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The mount's soft limit: a leader that has not renewed for this long
    /// can be preempted by a follower.
    pub lease: Duration,
    /// How often the leader renews.
    pub renew_interval: Duration,
    /// A leader that has not renewed successfully for this long gives up
    /// leadership (loseLeadership), well before `lease`.
    pub renew_deadline: Duration,
    /// How often a follower tries to take the lease, and how long a leader
    /// that ended its term waits before competing again.
    pub retry: Duration,
    /// How long the command gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long before the lease could go to another the command must be
    /// killed: room for a loaded machine to deliver the SIGKILL.
    pub margin: Duration,
}

impl Timing {
    /// Renews every `lease/4`, gives up at `lease*2/3`, and allows the
    /// command `lease/6` to stop on SIGTERM, so that its command is killed
    /// by `lease*5/6`, `lease/12` (the margin) before `lease*11/12`.
    pub fn from_lease(lease: Duration, retry: Duration) -> Timing {
        Timing {
            lease,
            renew_interval: lease / 4,
            renew_deadline: lease * 2 / 3,
            retry,
            kill_grace: lease / 6,
            margin: lease / 12,
        }
    }

    /// Refuses timings that could let a command outlive its lease.
    pub fn validate(&self) -> Result<(), ElectError> {
        let bad = |m: String| Err(ElectError::Timing(m));
        let ms = |d: Duration| d.as_millis();
        if self.lease.is_zero() || self.renew_interval.is_zero() || self.retry.is_zero() {
            return bad("lease, renew interval and retry must be > 0".into());
        }
        if self.renew_interval >= self.renew_deadline {
            return bad(format!(
                "renew interval ({} ms) must be shorter than the renew deadline ({} ms)",
                ms(self.renew_interval),
                ms(self.renew_deadline)
            ));
        }
        if self.renew_deadline + self.kill_grace + self.margin >= self.lease {
            return bad(format!(
                "renew deadline ({} ms) plus kill grace ({} ms) plus margin ({} ms) must be shorter than the lease ({} ms)",
                ms(self.renew_deadline),
                ms(self.kill_grace),
                ms(self.margin),
                ms(self.lease)
            ));
        }
        Ok(())
    }

    /// How long a leader sleeps at most between looks at its command and
    /// its deadline: short, so that a command's exit hands leadership over
    /// quickly.
    pub fn poll(&self) -> Duration {
        self.retry
            .min(Duration::from_millis(25))
            .min(self.renew_interval)
    }
}

/// The leader's view of its own lease: when it last renewed for sure, when
/// it renews next. Times are monotonic durations from any fixed origin.
#[derive(Clone, Debug)]
pub struct RenewTracker {
    timing: Timing,
    /// When the last successful renewal was *sent* (the daemon stamped it
    /// at or after this moment), so the deadline errs on the early side.
    last_ok: Duration,
    /// Until when the daemon vouched for the lease, counted from the
    /// sending of the renewal that said so.
    assured: Duration,
    next_due: Duration,
}

impl RenewTracker {
    /// `start`: a moment at or before the lease's last renewal by the
    /// daemon (taken just before switching it to client renewal).
    pub fn new(timing: Timing, start: Duration) -> Self {
        RenewTracker {
            timing,
            last_ok: start,
            assured: start + timing.lease,
            next_due: start + timing.renew_interval,
        }
    }

    /// A renewal sent at `sent_at` succeeded; the daemon vouches for the
    /// lease for `assured` from then (`None`: a daemon that does not say,
    /// taken for the lease).
    pub fn renewed(&mut self, sent_at: Duration, assured: Option<Duration>) {
        if sent_at >= self.last_ok {
            self.assured = sent_at + assured.unwrap_or(self.timing.lease).min(self.timing.lease);
        }
        self.last_ok = self.last_ok.max(sent_at);
        self.next_due = sent_at + self.timing.renew_interval;
    }

    /// When the last renewal the daemon answered was sent.
    pub fn last_ok(&self) -> Duration {
        self.last_ok
    }

    /// When the command must be asked to stop (SIGTERM): at the renew
    /// deadline, or earlier if the daemon vouches for less.
    pub fn stop_at(&self) -> Duration {
        let t = &self.timing;
        (self.last_ok + t.renew_deadline).min(
            self.assured
                .saturating_sub(t.margin)
                .saturating_sub(t.kill_grace),
        )
    }

    /// When the command's whole tree must be killed: its grace after
    /// [`Self::stop_at`], a margin before the lease can go elsewhere.
    pub fn kill_at(&self) -> Duration {
        self.stop_at() + self.timing.kill_grace
    }

    /// A renewal failed for a reason that may pass: try again soon.
    pub fn failed(&mut self, now: Duration) {
        self.next_due = now + self.timing.retry.min(self.timing.renew_interval);
    }

    pub fn due(&self, now: Duration) -> bool {
        now >= self.next_due
    }

    /// How long ago the last sure renewal was, once the command must
    /// stop ([`Self::stop_at`]).
    pub fn deadline_missed(&self, now: Duration) -> Option<Duration> {
        (now >= self.stop_at()).then(|| now.saturating_sub(self.last_ok))
    }

    /// How long to sleep before the next renewal or the deadline.
    pub fn until_next(&self, now: Duration) -> Duration {
        self.next_due.min(self.stop_at()).saturating_sub(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_follow_the_lease() {
        let t = Timing::from_lease(ms(60_000), ms(200));
        assert_eq!(t.renew_interval, ms(15_000));
        assert_eq!(t.renew_deadline, ms(40_000));
        assert_eq!(t.kill_grace, ms(10_000));
        assert_eq!(t.margin, ms(5_000));
        t.validate().expect("default timing is valid");
        assert!(Timing::from_lease(ms(2_000), ms(200)).validate().is_ok());
    }

    #[test]
    fn timing_that_lets_a_command_outlive_its_lease_is_refused() {
        let mut t = Timing::from_lease(ms(2_000), ms(200));
        t.renew_deadline = ms(1_900);
        assert!(t.validate().is_err());
        let mut t = Timing::from_lease(ms(2_000), ms(200));
        t.renew_interval = t.renew_deadline;
        assert!(t.validate().is_err());
        assert!(Timing::from_lease(ms(2_000), ms(0)).validate().is_err());
    }

    #[test]
    fn renewing_keeps_the_deadline_ahead() {
        let t = Timing::from_lease(ms(2_000), ms(200));
        let mut r = RenewTracker::new(t, ms(0));
        assert!(!r.due(ms(499)));
        assert!(r.due(ms(500)));
        r.renewed(ms(500), None);
        assert_eq!(r.deadline_missed(ms(1_800)), None);
        assert_eq!(r.until_next(ms(600)), ms(400));
    }

    /// A leader stopped (SIGSTOP) past its deadline sees it on waking,
    /// before it could renew and carry on as if nothing happened.
    #[test]
    fn a_late_wake_up_misses_the_deadline() {
        let t = Timing::from_lease(ms(2_000), ms(200));
        let mut r = RenewTracker::new(t, ms(0));
        r.renewed(ms(500), None);
        assert_eq!(r.deadline_missed(ms(1_832)), None);
        assert_eq!(r.deadline_missed(ms(1_834)), Some(ms(1_334)));
        assert_eq!(r.until_next(ms(5_000)), Duration::ZERO);
    }

    #[test]
    fn failed_renewals_are_retried_but_do_not_move_the_deadline() {
        let t = Timing::from_lease(ms(2_000), ms(100));
        let mut r = RenewTracker::new(t, ms(0));
        r.failed(ms(500));
        assert!(!r.due(ms(599)));
        assert!(r.due(ms(600)));
        r.failed(ms(1_200));
        assert!(r.deadline_missed(ms(1_334)).is_some());
        // An old renewal reported late never moves the deadline back.
        r.renewed(ms(1_300), None);
        r.renewed(ms(900), None);
        assert_eq!(r.deadline_missed(ms(2_600)), None);
    }

    /// Over etcd the daemon vouches only for what etcd confirmed (its claim
    /// partitioned away, or TTLs cut to whole seconds): the command is
    /// killed a margin before that, however recent the renewal.
    #[test]
    fn the_command_stops_before_what_the_daemon_vouches_for_runs_out() {
        let t = Timing::from_lease(ms(3_000), ms(100));
        let mut r = RenewTracker::new(t, ms(0));
        r.renewed(ms(0), Some(ms(3_000)));
        assert_eq!(r.stop_at(), ms(2_000));
        assert_eq!(r.kill_at(), ms(2_500));
        // A renewal that vouches for 2 s only (etcd confirmed less than L).
        r.renewed(ms(100), Some(ms(2_000)));
        assert_eq!(r.kill_at(), ms(2_100 - 250));
        // Partitioned: etcd confirmed the claim 1.5 s before this renewal.
        r.renewed(ms(1_000), Some(ms(1_500)));
        assert_eq!(r.kill_at(), ms(2_500 - 250));
        assert!(r.deadline_missed(ms(1_749)).is_none());
        assert!(r.deadline_missed(ms(1_750)).is_some());
        // Nothing vouched for: stop at once.
        r.renewed(ms(1_100), Some(ms(0)));
        assert!(r.deadline_missed(ms(1_100)).is_some());
        // A stale answer arriving late moves nothing.
        r.renewed(ms(1_050), Some(ms(3_000)));
        assert!(r.deadline_missed(ms(1_100)).is_some());
    }
}

//! The housekeeping leader among daemons sharing one namespace, elected
//! with etcd's election API: exactly one daemon at a time runs hard-limit
//! recovery, re-replication and orphan cleanup.
//!
//! A daemon campaigns under an etcd lease it keeps alive. It stops acting
//! as leader as soon as a keep-alive has not been confirmed for two thirds
//! of the TTL, before etcd can elect someone else. What leadership means
//! (the housekeeper's tasks and its audit events) is the caller's: this
//! module only says when it is taken and lost.

use std::time::Duration;

use crate::clock::BootInstant as Instant;

use super::{Etcd, KeepAlive};
use crate::sync::{Arc, AtomicBool, Ordering};

/// The leadership lease: short, since a dead leader's tasks wait this long.
const TTL_SECS: i64 = 6;

/// Campaigns for housekeeping leadership until `stop` is set, calling
/// `take` when this daemon won it and `lose` (with why) when it ended; on
/// the way out a leader resigns (revokes its lease) so another daemon
/// takes over at once.
pub fn run(
    etcd: Arc<Etcd>,
    mount_id: String,
    stop: Arc<AtomicBool>,
    take: impl Fn(&str),
    lose: impl Fn(&str),
) {
    let period = Duration::from_secs(TTL_SECS as u64) / 3;
    let limit = Duration::from_secs(TTL_SECS as u64) * 2 / 3;
    let name = etcd.key("hk/leader");
    while !stop.load(Ordering::Relaxed) {
        // The lease's TTL counts from etcd's grant (or latest renewal),
        // which comes after this.
        let mut last_ok = Instant::now();
        let lease = match etcd.grant(TTL_SECS) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("housekeeping election: {e}");
                std::thread::sleep(period);
                continue;
            }
        };
        let mut c = etcd.client();
        let (n, v) = (name.clone(), mount_id.clone());
        let campaign = etcd.spawn(async move { c.campaign(n, v, lease).await });
        // Keep the lease alive while the campaign waits for the leader.
        while !campaign.is_finished() && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last_ok.elapsed() >= period {
                match renew(&etcd, lease, last_ok, period, limit) {
                    Renewal::Confirmed(sent) => last_ok = sent,
                    Renewal::Pending => {}
                    Renewal::Over(_) => break,
                }
            }
        }
        if !campaign.is_finished() {
            campaign.abort();
            etcd.revoke(lease);
            continue;
        }
        match etcd.wait(campaign) {
            Some(Ok(_)) => {}
            other => {
                tracing::warn!("housekeeping campaign failed: {other:?}");
                etcd.revoke(lease);
                std::thread::sleep(period);
                continue;
            }
        }
        // Leadership lasts from the last renewal the campaign had
        // confirmed (or the grant), not from the election's answer.
        if last_ok.elapsed() >= limit {
            etcd.revoke(lease);
            continue;
        }
        take("elected through etcd");
        let why = loop {
            if stop.load(Ordering::Relaxed) {
                break "unmounted";
            }
            std::thread::sleep(period.min(Duration::from_millis(500)));
            match renew(&etcd, lease, last_ok, period, limit) {
                Renewal::Confirmed(sent) => last_ok = sent,
                Renewal::Pending => {}
                Renewal::Over(why) => break why,
            }
        };
        lose(why);
        etcd.revoke(lease);
    }
}

/// What one keep-alive of the leadership lease said.
enum Renewal {
    /// etcd renewed it; the keep-alive was sent at this moment, from
    /// which the new TTL counts at the earliest.
    Confirmed(Instant),
    /// No answer yet, and the lease may still be valid.
    Pending,
    /// Leadership is over: etcd does not know the lease any more, or it
    /// has not been confirmed for `limit`.
    Over(&'static str),
}

/// One keep-alive of `lease`, waiting no longer than what is left of
/// `limit` since `last_ok` (so that leadership ends on time, not a
/// keep-alive timeout later). Freshness counts from when the keep-alive
/// was sent, not from its answer: etcd may have renewed it at any moment
/// in between.
fn renew(etcd: &Etcd, lease: i64, last_ok: Instant, period: Duration, limit: Duration) -> Renewal {
    let left = limit.saturating_sub(last_ok.elapsed());
    if left.is_zero() {
        return Renewal::Over("etcd lease not renewed in time");
    }
    let sent = Instant::now();
    match etcd.keep_alive_once(lease, left.min(period)) {
        KeepAlive::Confirmed { .. } => Renewal::Confirmed(sent),
        KeepAlive::Gone => Renewal::Over("etcd lease gone (revoked or run out)"),
        KeepAlive::Unanswered if last_ok.elapsed() >= limit => {
            Renewal::Over("etcd lease not renewed in time")
        }
        KeepAlive::Unanswered => Renewal::Pending,
    }
}

//! The housekeeping leader among daemons sharing one namespace, elected
//! with etcd's election API: exactly one daemon at a time runs hard-limit
//! recovery, re-replication and orphan cleanup.
//!
//! A daemon campaigns under an etcd lease it keeps alive. It stops acting
//! as leader as soon as a keep-alive has not been confirmed for two thirds
//! of the TTL, before etcd can elect someone else. What leadership means
//! (the housekeeper's tasks and its audit events) is the caller's: this
//! module only says when it is taken and lost.

use std::time::{Duration, Instant};

use super::Etcd;
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
        let mut last_ok = Instant::now();
        while !campaign.is_finished() && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last_ok.elapsed() >= period {
                if etcd.keep_alive_once(lease, period) {
                    last_ok = Instant::now();
                } else if last_ok.elapsed() >= limit {
                    break;
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
        take("elected through etcd");
        let mut last_ok = Instant::now();
        let why = loop {
            if stop.load(Ordering::Relaxed) {
                break "unmounted";
            }
            std::thread::sleep(period.min(Duration::from_millis(500)));
            if etcd.keep_alive_once(lease, period) {
                last_ok = Instant::now();
            } else if last_ok.elapsed() >= limit {
                break "etcd lease not renewed in time";
            }
        };
        lose(why);
        etcd.revoke(lease);
    }
}

//! How a new leader accounts for its predecessor's term: the `why` of its
//! own `elected`, and the events it records on the predecessor's behalf
//! when the predecessor could not (docs/SEMANTICS.md, "Leader election").

use super::control::EventKind;
use super::leader_file::{LeaderRecord, LeaseView};
use crate::meta::AuditEvent;

/// The new leader's account of its predecessor: the `why` of `elected`, and
/// the event that ends the predecessor's term when nobody recorded one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub elected_why: String,
    pub event: Option<(EventKind, String)>,
    /// The predecessor's `elected` is not in the table (it died between
    /// its record and that event): the successor records it.
    pub start_missing: bool,
}

/// Judges how the previous term (`prev`, the election file's last record)
/// ended. `history`: the audit table (`None` if unreadable: then the end
/// is recorded regardless, and the daemon leaves it out if the table had
/// one). `seen`: the lease as read before the winning open, and the
/// milliseconds from that read to the win. `alive`: the predecessor's
/// elector still runs on this host.
pub(crate) fn judge_predecessor(
    prev: Option<&LeaderRecord>,
    history: Option<&[AuditEvent]>,
    seen: Option<(&LeaseView, u64)>,
    lease_ms: u64,
    alive: bool,
    me: &str,
) -> Verdict {
    let Some(p) = prev else {
        return Verdict {
            elected_why: "first term of this election".into(),
            event: None,
            start_missing: false,
        };
    };
    let name = format!("previous leader {} (epoch {})", p.id, p.epoch);
    let history = history.unwrap_or(&[]);
    let start_missing = !history
        .iter()
        .any(|e| e.epoch == p.epoch && e.event == EventKind::Elected.as_str());
    if let Some(end) = history
        .iter()
        .rev()
        .find(|e| e.epoch == p.epoch && EventKind::ends_term(&e.event))
    {
        return Verdict {
            elected_why: format!("{name} {}", end.event),
            event: None,
            start_missing,
        };
    }
    let expired = seen.filter(|(v, since)| v.epoch == p.epoch && v.looks_expired(lease_ms, *since));
    let (kind, why) = match expired {
        Some((v, since)) => {
            let age = v.renewed_ms_ago.unwrap_or(0) + since;
            let kind = if alive {
                EventKind::Preempted
            } else {
                EventKind::Expired
            };
            let tail = if alive {
                format!("; its elector (pid {}) still runs and is fenced", p.pid)
            } else {
                String::new()
            };
            let why = format!(
                "lease not renewed for {age} ms (soft limit {lease_ms} ms); recovered and taken over by {me}{tail}"
            );
            (kind, why)
        }
        None if alive => (
            EventKind::Expired,
            format!("lease released without a resignation; taken over by {me}"),
        ),
        None => (
            EventKind::Expired,
            format!(
                "lease released without a resignation: elector {}:{} is gone (killed or crashed); taken over by {me}",
                p.host, p.pid
            ),
        ),
    };
    Verdict {
        elected_why: format!("{name} {}", kind.as_str()),
        event: Some((kind, why)),
        start_missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, epoch: u64) -> LeaderRecord {
        LeaderRecord {
            id: id.into(),
            host: "h".into(),
            pid: 42,
            epoch,
            time_ms: 0,
            pgid: Some(43),
            cgroup: None,
        }
    }

    fn ev(event: &str, epoch: u64) -> AuditEvent {
        AuditEvent {
            election: "/e".into(),
            event: event.into(),
            who: "a".into(),
            host: "h".into(),
            pid: 42,
            epoch,
            at_ms: 0,
            why: String::new(),
        }
    }

    fn held(epoch: u64, renewed_ms_ago: u64) -> LeaseView {
        LeaseView {
            state: "held".into(),
            holder: Some("h:42".into()),
            epoch,
            mode: Some("client".into()),
            renewed_ms_ago: Some(renewed_ms_ago),
        }
    }

    #[test]
    fn a_first_term_has_no_predecessor() {
        let v = judge_predecessor(None, Some(&[]), None, 2000, false, "b");
        assert_eq!(v.event, None);
        assert_eq!(v.elected_why, "first term of this election");
    }

    #[test]
    fn a_predecessor_that_recorded_its_end_gets_no_second_event() {
        let h = [ev("elected", 5), ev("resigned", 5)];
        let v = judge_predecessor(
            Some(&rec("a", 5)),
            Some(&h),
            Some((&held(5, 10), 5)),
            2000,
            true,
            "b",
        );
        assert_eq!(v.event, None);
        assert_eq!(v.elected_why, "previous leader a (epoch 5) resigned");
    }

    #[test]
    fn a_killed_predecessor_expired() {
        let h = [ev("elected", 5)];
        let v = judge_predecessor(
            Some(&rec("a", 5)),
            Some(&h),
            Some((&held(5, 10), 50)),
            2000,
            false,
            "b",
        );
        let (kind, why) = v.event.expect("event");
        assert_eq!(kind, EventKind::Expired);
        assert!(why.contains("is gone"), "{why}");
    }

    #[test]
    fn a_stopped_predecessor_past_the_soft_limit_was_preempted() {
        let h = [ev("elected", 5)];
        // Read 1900 ms after its last renewal; the win came 150 ms later.
        let v = judge_predecessor(
            Some(&rec("a", 5)),
            Some(&h),
            Some((&held(5, 1900), 150)),
            2000,
            true,
            "b",
        );
        let (kind, why) = v.event.expect("event");
        assert_eq!(kind, EventKind::Preempted);
        assert!(why.contains("2050 ms"), "{why}");
        assert_eq!(v.elected_why, "previous leader a (epoch 5) preempted");
        // The same, but its elector is gone: the lease simply expired.
        let v = judge_predecessor(
            Some(&rec("a", 5)),
            Some(&h),
            Some((&held(5, 1900), 150)),
            2000,
            false,
            "b",
        );
        assert_eq!(v.event.expect("event").0, EventKind::Expired);
    }

    #[test]
    fn an_unreadable_audit_table_still_records_the_predecessors_end() {
        // The daemon leaves it out if the table had an end already.
        let v = judge_predecessor(Some(&rec("a", 5)), None, None, 2000, false, "b");
        assert_eq!(v.event.map(|e| e.0), Some(EventKind::Expired));
        assert!(v.start_missing);
    }

    #[test]
    fn a_predecessor_without_its_start_gets_one() {
        // Died between its record and its `elected`.
        let h = [ev("elected", 3), ev("resigned", 3)];
        let v = judge_predecessor(Some(&rec("a", 5)), Some(&h), None, 2000, false, "b");
        assert!(v.start_missing);
        assert_eq!(v.event.map(|e| e.0), Some(EventKind::Expired));
        let h = [ev("elected", 5)];
        let v = judge_predecessor(Some(&rec("a", 5)), Some(&h), None, 2000, false, "b");
        assert!(!v.start_missing);
    }
}

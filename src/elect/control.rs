//! What an elector asks of the daemon besides the lease: appending to the
//! election audit table, reading it back, and fencing a term's command.
//!
//! The transport is a [`Control`]: one JSON request, one JSON answer, as on
//! the daemon's control socket (`DATA/control.sock`). The command line
//! supplies the socket; tests of the election logic may supply a fake.

use serde_json::{Value, json};

use crate::meta::AuditEvent;

/// Sends one request to the daemon and returns its answer, or the daemon's
/// (or the transport's) error message.
pub trait Control {
    fn request(&self, req: Value) -> Result<Value, String>;
}

impl<F: Fn(Value) -> Result<Value, String>> Control for F {
    fn request(&self, req: Value) -> Result<Value, String> {
        self(req)
    }
}

/// The events of the audit table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A candidate won the lease and leads under a new epoch.
    Elected,
    /// The leader stopped leading against its will: fenced (its lease was
    /// taken) or its renew deadline passed.
    Lost,
    /// The leader stopped leading on purpose: its command exited, or the
    /// elector was told to stop.
    Resigned,
    /// A term ended without its leader saying so: its lease was released
    /// (the elector died) or ran out while its elector was gone. Recorded by
    /// the successor, about the predecessor.
    Expired,
    /// A live leader's lease went unrenewed past the soft limit and a
    /// follower took it over by lease recovery. Recorded by the successor,
    /// about the predecessor.
    Preempted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Elected => "elected",
            EventKind::Lost => "lost",
            EventKind::Resigned => "resigned",
            EventKind::Expired => "expired",
            EventKind::Preempted => "preempted",
        }
    }

    /// Events that end a term.
    pub fn ends_term(name: &str) -> bool {
        matches!(name, "lost" | "resigned" | "expired" | "preempted")
    }
}

/// Appends one event to the audit table.
pub fn audit(ctl: &dyn Control, event: &AuditEvent) -> Result<(), String> {
    ctl.request(json!({"op": "audit", "event": event}))
        .map(|_| ())
}

/// The latest events of the election `election` (its directory inside the
/// mount), oldest first: one page, the daemon's default (100).
pub fn history(ctl: &dyn Control, election: &str) -> Result<Vec<AuditEvent>, String> {
    history_last(ctl, election, None)
}

/// The last `n` events of the election (`Some(0)`: every event the table
/// keeps; `None`: the daemon's default page), oldest first, read a page
/// (at most 1,000 events) at a time.
pub fn history_last(
    ctl: &dyn Control,
    election: &str,
    n: Option<usize>,
) -> Result<Vec<AuditEvent>, String> {
    let mut out: Vec<AuditEvent> = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let want = match n {
            Some(0) => 1000,
            Some(n) => (n - out.len()).min(1000),
            None => 100,
        };
        let mut req = json!({"op": "history", "election": election, "limit": want});
        if let Some(b) = before {
            req["before"] = json!(b);
        }
        let v = ctl.request(req)?;
        let mut page: Vec<AuditEvent> = serde_json::from_value(v["events"].clone())
            .map_err(|e| format!("bad history from the daemon: {e}"))?;
        page.append(&mut out);
        out = page;
        before = v["before"].as_i64();
        let done = match n {
            None => true,
            Some(0) => false,
            Some(n) => out.len() >= n,
        };
        if done || before.is_none() {
            return Ok(out);
        }
    }
}

/// A term as the daemon registers it: the election file (a path inside
/// the mount), the epoch, the leader, and its command's tree if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermInfo<'a> {
    pub leader: &'a str,
    pub epoch: u64,
    pub who: &'a str,
    pub host: &'a str,
    /// The elector's pid.
    pub pid: u32,
    /// The command's pid (its process group and session) and cgroup.
    pub command: Option<(u32, Option<&'a str>)>,
}

/// Registers a term with the daemon: for the audit (the daemon records
/// `preempted` when it takes the lease from a leader that stopped
/// renewing), and, with a command, the command's tree: once the election
/// file's lease is no longer held at `epoch`, the daemon refuses that tree
/// every change of the filesystem, and stops what is left of it.
pub fn fence(ctl: &dyn Control, t: &TermInfo<'_>) -> Result<(), String> {
    let (pgid, cgroup) = t.command.unwrap_or((0, None));
    ctl.request(json!({
        "op": "fence", "path": t.leader, "epoch": t.epoch, "who": t.who,
        "host": t.host, "pid": t.pid, "pgid": pgid, "cgroup": cgroup,
    }))
    .map(|_| ())
}

/// Forgets the registration of `pgid`; only for a tree with no process
/// left, or a later process that reuses the number would be fenced.
pub fn unfence(ctl: &dyn Control, pgid: u32) -> Result<(), String> {
    ctl.request(json!({"op": "unfence", "pgid": pgid}))
        .map(|_| ())
}

/// One line of `leasefs elect --history`: time (UTC), event, who,
/// host:pid, epoch, why.
pub fn format_event(e: &AuditEvent) -> String {
    format!(
        "{}  {:<9}  {:<16}  {:<24}  {:>8}  {}",
        format_utc_ms(e.at_ms),
        e.event,
        e.who,
        format!("{}:{}", e.host, e.pid),
        e.epoch,
        e.why
    )
}

/// The header matching [`format_event`].
pub fn format_header() -> String {
    format!(
        "{:<24}  {:<9}  {:<16}  {:<24}  {:>8}  {}",
        "TIME (UTC)", "EVENT", "WHO", "HOST:PID", "EPOCH", "WHY"
    )
}

/// `YYYY-MM-DD HH:MM:SS.mmmZ` for milliseconds since the Unix epoch.
pub fn format_utc_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn utc_times_format_like_iso() {
        assert_eq!(format_utc_ms(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(format_utc_ms(951_782_400_123), "2000-02-29 00:00:00.123Z");
        assert_eq!(format_utc_ms(1_700_000_000_000), "2023-11-14 22:13:20.000Z");
    }

    #[test]
    fn requests_have_the_shape_the_daemon_reads() {
        let sent = RefCell::new(Vec::new());
        let ctl = |req: Value| {
            sent.borrow_mut().push(req.clone());
            match req["op"].as_str() {
                Some("history") => Ok(json!({"events": [{
                    "election": "/e", "event": "elected", "who": "a", "host": "h",
                    "pid": 1, "epoch": 2, "at_ms": 3, "why": "first term"}]})),
                _ => Ok(json!({"ok": true})),
            }
        };
        let t = TermInfo {
            leader: "/e/LEADER",
            epoch: 7,
            who: "a",
            host: "h",
            pid: 9,
            command: Some((42, Some("/leasefs-elect.9.0"))),
        };
        fence(&ctl, &t).expect("fence");
        unfence(&ctl, 42).expect("unfence");
        let h = history(&ctl, "/e").expect("history");
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].who, "a");
        let sent = sent.borrow();
        assert_eq!(
            sent[0],
            json!({"op": "fence", "pgid": 42, "path": "/e/LEADER", "epoch": 7, "who": "a",
                   "host": "h", "pid": 9, "cgroup": "/leasefs-elect.9.0"})
        );
        assert_eq!(sent[1], json!({"op": "unfence", "pgid": 42}));
        assert!(format_event(&h[0]).contains("elected"));
    }
}

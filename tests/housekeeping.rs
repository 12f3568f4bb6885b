//! Housekeeping runs as a leader-only task: the daemon takes housekeeping
//! leadership at mount and loses it at unmount, and both events are in the
//! election audit table operators query with sqlite3.

mod common;
use common::*;

fn events(m: &Mount) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open_with_flags(
        m.data.join("meta.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open meta.db");
    let mut st = c
        .prepare(
            "SELECT event, why FROM election_audit WHERE election = 'housekeeping' ORDER BY id",
        )
        .expect("prepare");
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn housekeeping_leadership_is_taken_at_mount_and_lost_at_unmount_in_the_audit_table() {
    if etcd_backend() {
        // Over etcd, leadership is an election among daemons and the table
        // lives in etcd: tests/multi_daemon.rs checks both.
        return;
    }
    let mut m = Mount::new();
    let ev = events(&m);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, "elected");
    m.unmount();
    let ev = events(&m);
    assert_eq!(
        ev.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        ["elected", "lost"],
        "{ev:?}"
    );
    m.mount();
    assert_eq!(events(&m).len(), 3);
}

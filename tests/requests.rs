//! What the kernel asks the daemon per operation, counted by the daemon's
//! own statistics (`leasefs stats --once --json`, field `ops`): requests
//! the filesystem can spare the kernel are a cost every small file pays.

mod common;

use common::Mount;

fn ops(m: &Mount) -> serde_json::Value {
    let out = m.leasefs(&["stats", m.mnt.to_str().unwrap(), "--once", "--json"]);
    assert!(
        out.status.success(),
        "stats --once --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["ops"].clone()
}

fn count(ops: &serde_json::Value, op: &str) -> u64 {
    ops[op].as_u64().unwrap_or(0)
}

/// A create's reply carries attributes the kernel may use for its own
/// permission check in the same open(2) (docs/SEMANTICS.md, "Visible
/// length"): creating a file costs no GETATTR of the file itself. What
/// remains is one GETATTR of the parent directory, whose attributes the
/// kernel drops after every entry added to it.
#[test]
fn creating_a_small_file_asks_for_no_attributes_of_the_new_file() {
    let m = Mount::new();
    m.sh_ok("mkdir d");
    let n = 200;
    let before = ops(&m);
    m.sh_ok(&format!(
        "cd d && i=0; while [ $i -lt {n} ]; do printf x > f$i; i=$((i + 1)); done"
    ));
    let after = ops(&m);
    let grew = |op: &str| count(&after, op) - count(&before, op);
    assert_eq!(grew("create"), n, "{before} -> {after}");
    // Without the create reply's attributes: 2 per file (the new file's
    // and its directory's).
    assert!(
        grew("getattr") <= n + n / 10,
        "{} GETATTRs for {n} created files: {before} -> {after}",
        grew("getattr")
    );
}

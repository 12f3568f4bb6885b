//! A root mount that a hostile local user cannot use (docs/SEMANTICS.md,
//! "Threat model"): each attack runs as `nobody` through `setpriv`, as an
//! ordinary user of the machine would run it, against a mount made by
//! root; over etcd with two daemons where that is where it shows.

mod common;

use std::path::Path;
use std::process::Output;

use common::etcd::{EtcdServer, daemon, shared_datanodes};
use common::*;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A `testkit` subcommand as `nobody:nogroup`, to completion.
fn testkit_as_nobody(args: &[&str]) -> Output {
    let kit = testkit();
    let mut cmd = vec![kit.to_str().expect("testkit path")];
    cmd.extend_from_slice(args);
    as_nobody(&cmd)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// CREATE without `O_EXCL` of a name that another daemon made after this
/// kernel looked it up: the kernel counts a successful CREATE as a new
/// file and skips its own open-permission check, so the daemon must not
/// hand back the existing file. `nobody` swaps root's 0600 file in and
/// out of a name in its own directory through one daemon while opening
/// that name with `O_RDWR|O_APPEND|O_CREAT` through the other: it must
/// never get the file open (before the fix it read it and appended to it
/// within a few hundred tries).
#[test]
fn create_never_opens_an_existing_file_without_a_permission_check() {
    let etcd = EtcdServer::start();
    let dn = tempfile::tempdir().expect("tempdir");
    let dns = shared_datanodes(&dn);
    let a = daemon(&etcd, "create-race", &dns, &[]);
    let b = daemon(&etcd, "create-race", &dns, &[]);
    a.open_to_all();
    b.open_to_all();
    a.sh_ok(
        "mkdir n && chown nobody:nogroup n && printf TOPSECRET > n/secret && chmod 600 n/secret",
    );
    wait_for(
        std::time::Duration::from_secs(5),
        "B sees the secret",
        || b.path("n/secret").exists(),
    );
    let swapper = {
        let (from, to) = (a.path("n/secret"), a.path("n/x"));
        std::thread::spawn(move || testkit_as_nobody(&["swap", p(&from), p(&to), "8"]))
    };
    let race = testkit_as_nobody(&["create-race", p(&b.path("n/x")), "8"]);
    let swaps = swapper.join().expect("swapper");
    let (race, swaps) = (stdout(&race), stdout(&swaps));
    assert!(
        !race.starts_with("breach"),
        "nobody opened root's 0600 file through CREATE: {race} ({swaps})"
    );
    // Root's file is whole, under one of the two names.
    let content: Vec<String> = ["n/secret", "n/x"]
        .iter()
        .filter_map(|n| {
            let path = a.path(n);
            let md = std::fs::metadata(&path).ok()?;
            (md.len() > 0 || std::os::unix::fs::MetadataExt::uid(&md) == 0)
                .then(|| std::fs::read_to_string(&path).unwrap_or_default())
        })
        .filter(|c| c.starts_with("TOPSECRET"))
        .collect();
    assert_eq!(
        content,
        ["TOPSECRET"],
        "root's file after the race: {race} ({swaps})"
    );
    eprintln!("create race: {race}; {swaps}");
}

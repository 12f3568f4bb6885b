//! The cluster lease interface ([`Cluster`]) on a real etcd: two
//! `EtcdLeases` on one prefix stand for two daemons. Claims are exclusive,
//! shared by a daemon's handles, given up with the last one, run out when
//! not kept alive, are ended by a successor of a crashed daemon, and give
//! epochs that grow across daemons.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::etcd::EtcdServer;
use leasefs::etcd::leases::EtcdLeases;
use leasefs::lease::EpochSource;
use leasefs::lease::cluster::{Claim, ClaimInfo, Cluster, EPOCH_SEQ_BITS};

const TTL: Duration = Duration::from_secs(2);

fn who(mount: &str) -> ClaimInfo {
    ClaimInfo {
        mount_id: mount.into(),
        host: "h".into(),
        pid: 1,
        comm: "test".into(),
        since_ms: 0,
        lease_id: 0,
    }
}

fn two_daemons(etcd: &EtcdServer, test: &str) -> (Arc<EtcdLeases>, Arc<EtcdLeases>) {
    let (c1, name) = etcd.connect(test);
    let c2 = etcd.connect_to(&name);
    let a = EtcdLeases::new(c1, "A".into(), TTL).expect("daemon A");
    let b = EtcdLeases::new(c2, "B".into(), TTL).expect("daemon B");
    (a, b)
}

fn mine(c: Claim) -> u64 {
    match c {
        Claim::Mine { epoch_base } => epoch_base,
        Claim::Busy(h) => panic!("expected the claim, held by {h:?}"),
    }
}

#[test]
fn a_claim_is_exclusive_shared_by_handles_and_given_up_with_the_last() {
    let etcd = EtcdServer::start();
    let (a, b) = two_daemons(&etcd, "exclusive");
    mine(a.claim(7, 1, &who("A")).expect("claim"));
    // A second handle of A shares the claim; B is refused and told who.
    mine(a.claim(7, 2, &who("A")).expect("claim"));
    match b.claim(7, 1, &who("B")).expect("claim") {
        Claim::Busy(h) => assert_eq!(h.mount_id, "A"),
        Claim::Mine { .. } => panic!("two daemons hold file 7"),
    }
    assert_eq!(b.remote_holder(7).map(|h| h.mount_id), Some("A".into()));
    assert_eq!(a.remote_holder(7), None, "its own claim is not remote");
    assert_eq!(a.claimed_files().expect("list"), vec![7]);
    a.unclaim(7, 1);
    assert!(matches!(b.claim(7, 1, &who("B")), Ok(Claim::Busy(_))));
    a.unclaim(7, 2);
    // Given up at once: no waiting for a TTL.
    mine(b.claim(7, 1, &who("B")).expect("claim"));
    assert!(b.claimed_files().expect("list").contains(&7));
}

#[test]
fn racing_claims_give_one_holder() {
    let etcd = EtcdServer::start();
    let (a, b) = two_daemons(&etcd, "race");
    for file in 0..40u64 {
        let (a2, b2) = (a.clone(), b.clone());
        let ta = std::thread::spawn(move || a2.claim(file, 1, &who("A")).expect("claim"));
        let tb = std::thread::spawn(move || b2.claim(file, 1, &who("B")).expect("claim"));
        let (ra, rb) = (ta.join().expect("A"), tb.join().expect("B"));
        let won = [&ra, &rb]
            .iter()
            .filter(|c| matches!(c, Claim::Mine { .. }))
            .count();
        assert_eq!(won, 1, "file {file}: {ra:?} / {rb:?}");
    }
}

#[test]
fn epochs_grow_across_daemons() {
    let etcd = EtcdServer::start();
    let (a, b) = two_daemons(&etcd, "epochs");
    let mut ea = a.epochs();
    let mut eb = b.epochs();
    let mut last = 0;
    for round in 0..5 {
        let (d, e) = if round % 2 == 0 {
            (&a, &mut ea)
        } else {
            (&b, &mut eb)
        };
        let base = mine(d.claim(3, 1, &who("x")).expect("claim"));
        for _ in 0..3 {
            let epoch = e.next(3).expect("epoch");
            assert!(epoch > last, "epoch {epoch} after {last}");
            assert_eq!(epoch >> EPOCH_SEQ_BITS, base);
            last = epoch;
        }
        d.unclaim(3, 1);
    }
}

#[test]
fn kept_alive_claims_last_wanted_ones_are_offered_and_abandoned_ones_run_out() {
    let etcd = EtcdServer::start();
    let (a, b) = two_daemons(&etcd, "expiry");
    mine(a.claim(1, 10, &who("A")).expect("claim"));
    mine(a.claim(2, 11, &who("A")).expect("claim"));
    let wanted = Arc::new(Mutex::new(Vec::new()));
    let lost = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let (a, b) = (a.clone(), b.clone());
        let (wanted, lost, stop) = (wanted.clone(), lost.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // B's liveness lease, which its wanted-file records live by.
                b.keep_alive(&|_| {}, &|_| {});
                let (w, l) = (wanted.clone(), lost.clone());
                a.keep_alive(&move |f| w.lock().unwrap().push(f), &move |f| {
                    l.lock().unwrap().push(f)
                });
                // A keep-alive round every period, as the daemon runs them.
                common::let_time_pass(a.period());
            }
        })
    };
    // Kept alive: still A's after several TTLs, which only time shows.
    common::let_time_pass(TTL * 2);
    assert!(matches!(b.claim(1, 1, &who("B")), Ok(Claim::Busy(_))));
    // B was refused file 1: A's next rounds offer it for preemption (A
    // preempts only an expired client holder; the daemon decides that).
    assert!(common::wait_until(Duration::from_secs(3), || {
        wanted.lock().unwrap().contains(&1)
    }));
    assert!(!wanted.lock().unwrap().contains(&2), "nobody wants file 2");
    // A stops keeping its claims alive (a hung or dead daemon): after the
    // TTL, and not before, they run out and B gets them.
    stop.store(true, Ordering::Relaxed);
    t.join().expect("keep-alive thread");
    let t0 = Instant::now();
    assert!(common::wait_until(Duration::from_secs(10), || {
        matches!(b.claim(2, 1, &who("B")), Ok(Claim::Mine { .. }))
    }));
    assert!(t0.elapsed() >= TTL / 2, "ran out after {:?}", t0.elapsed());
    assert!(
        lost.lock().unwrap().is_empty(),
        "etcd answered every keep-alive"
    );
}

#[test]
fn a_successor_ends_a_crashed_daemons_claims_at_once() {
    let etcd = EtcdServer::start();
    let (c1, name) = etcd.connect("reap");
    let a = EtcdLeases::new(c1, "A".into(), Duration::from_secs(60)).expect("A");
    mine(a.claim(5, 1, &who("A")).expect("claim"));
    mine(a.claim(6, 1, &who("A")).expect("claim"));
    // A "crashes": nothing keeps its claims alive, but they have 60 s.
    drop(a);
    let b = EtcdLeases::new(etcd.connect_to(&name), "B".into(), TTL).expect("B");
    assert!(b.mount_alive("A"));
    assert!(matches!(b.claim(5, 1, &who("B")), Ok(Claim::Busy(_))));
    // Its successor on the same data directory knows A is gone.
    let a2 = EtcdLeases::new(etcd.connect_to(&name), "A2".into(), TTL).expect("A2");
    assert_eq!(a2.reap("A").expect("reap"), 2);
    assert!(!b.mount_alive("A"));
    mine(b.claim(5, 1, &who("B")).expect("claim"));
    mine(a2.claim(6, 1, &who("A2")).expect("claim"));
}

/// A commit made under a claim ([`Change::Claimed`]) applies only while
/// that very claim is held: not after it was given up, nor under another
/// daemon's later claim of the file, and the refusal says `Fenced` (the
/// writer gets EIO) rather than being retried.
#[test]
fn commits_under_a_claim_apply_only_while_that_claim_is_held() {
    use leasefs::error::FsError;
    use leasefs::lease::LeaseError;
    use leasefs::meta::{BlockMap, Change, EtcdMeta, ROOT_INO};

    let etcd = EtcdServer::start();
    let (c1, name) = etcd.connect("fenced-commit");
    let meta = EtcdMeta::open(c1.clone(), 0, 0).expect("metadata");
    let a = EtcdLeases::new(c1, "A".into(), TTL).expect("daemon A");
    let b = EtcdLeases::new(etcd.connect_to(&name), "B".into(), TTL).expect("daemon B");
    let file = ROOT_INO;
    let under = |epoch: u64| {
        meta.commit(
            &[
                Change::SetLastEpoch { ino: file, epoch },
                Change::Claimed { ino: file, epoch },
            ],
            true,
        )
    };
    let fenced =
        |r: Result<_, FsError>| matches!(r, Err(FsError::Lease(LeaseError::Fenced { .. })));
    let ea = (mine(a.claim(file, 1, &who("A")).expect("claim")) << EPOCH_SEQ_BITS) | 1;
    under(ea).expect("a commit under A's claim");
    a.unclaim(file, 1);
    assert!(fenced(under(ea)), "a commit under a claim given up applied");
    let eb = (mine(b.claim(file, 1, &who("B")).expect("claim")) << EPOCH_SEQ_BITS) | 1;
    assert!(eb > ea);
    assert!(
        fenced(under(ea)),
        "a commit under A's old claim applied under B's"
    );
    under(eb).expect("a commit under B's claim");
}

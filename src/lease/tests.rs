//! Rules of the lease manager, each pinned by a test named after it. Time is a
//! [`FakeClock`]: an hour of lease life takes microseconds.

use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::*;
use crate::clock::FakeClock;
use crate::sync::Arc;

struct Counter(u64);

impl EpochSource for Counter {
    fn next(&mut self, _file: FileId) -> Result<u64, String> {
        self.0 += 1;
        Ok(self.0)
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn manager(cfg: LeaseConfig) -> (Arc<FakeClock>, Arc<LeaseManager>) {
    let clock = Arc::new(FakeClock::new());
    let mgr = LeaseManager::new(cfg, clock.clone(), Box::new(Counter(100)), "h1".into());
    (clock, Arc::new(mgr))
}

fn waiting_cfg(wait: u64) -> LeaseConfig {
    LeaseConfig {
        lease_wait: Some(secs(wait)),
        ..LeaseConfig::default()
    }
}

fn holder(handle: HandleId) -> Holder {
    Holder {
        host: "h1".into(),
        pid: 1000 + handle as u32,
        comm: "writer".into(),
        handle,
        opened_wall_ms: 1_700_000_000_000,
    }
}

/// A callback that must never run (acquire answered at once).
fn never() -> GrantCallback {
    Box::new(|res| panic!("callback must not run, got {res:?}"))
}

/// A callback whose single answer the test reads from the receiver.
fn recorder() -> (GrantCallback, Receiver<Result<Grant, LeaseError>>) {
    let (tx, rx) = mpsc::channel();
    let cb: GrantCallback = Box::new(move |res| tx.send(res).expect("receiver alive"));
    (cb, rx)
}

fn acquire(mgr: &LeaseManager, file: FileId, handle: HandleId) -> Result<Acquire, LeaseError> {
    mgr.acquire(file, holder(handle), AcquireOpts::default(), never())
}

fn granted(res: Result<Acquire, LeaseError>) -> u64 {
    match res {
        Ok(Acquire::Granted(g)) => g.epoch,
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// Queues `handle` for `file` and returns the receiver of its answer.
fn queue(
    mgr: &LeaseManager,
    file: FileId,
    handle: HandleId,
    opts: AcquireOpts,
) -> Receiver<Result<Grant, LeaseError>> {
    let (cb, rx) = recorder();
    match mgr.acquire(file, holder(handle), opts, cb) {
        Ok(Acquire::Queued) => rx,
        other => panic!("expected Queued, got {other:?}"),
    }
}

fn answer(rx: &Receiver<Result<Grant, LeaseError>>) -> Result<Grant, LeaseError> {
    rx.try_recv().expect("callback was called")
}

#[test]
fn second_writer_is_busy_and_holder_reacquires_same_epoch() {
    let (_, mgr) = manager(LeaseConfig::default());
    let epoch = granted(acquire(&mgr, 7, 1));
    match acquire(&mgr, 7, 2) {
        Err(e @ LeaseError::Busy { .. }) => {
            assert_eq!(e.errno(), libc::EBUSY);
            assert!(e.to_string().contains("h1:1001"), "{e}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(granted(acquire(&mgr, 7, 1)), epoch);
    // Other files are independent.
    granted(acquire(&mgr, 8, 2));
    assert_eq!(mgr.len(), 2);
    assert_eq!(mgr.file_of_handle(1), Some(7));
    assert_eq!(mgr.file_of_handle(2), Some(8));
    assert_eq!(mgr.check(7, 1, epoch).ok(), Some(()));
    assert!(matches!(
        mgr.check(7, 2, epoch),
        Err(LeaseError::NotHolder { .. })
    ));
}

#[test]
fn epochs_strictly_increase_across_all_grants() {
    let (_, mgr) = manager(waiting_cfg(10));
    let mut seen = vec![granted(acquire(&mgr, 1, 1)), granted(acquire(&mgr, 2, 2))];
    let rx = queue(&mgr, 1, 3, AcquireOpts::default());
    assert!(mgr.release(1, 1));
    seen.push(answer(&rx).unwrap().epoch);
    assert!(mgr.release(2, 2));
    seen.push(granted(acquire(&mgr, 2, 4)));
    seen.push(granted(acquire(&mgr, 3, 5)));
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(mgr.info(1).epoch, seen[2]);
}

#[test]
fn release_hands_lease_to_first_waiter_fifo() {
    let (_, mgr) = manager(waiting_cfg(10));
    let first = granted(acquire(&mgr, 1, 1));
    let rx2 = queue(&mgr, 1, 2, AcquireOpts::default());
    let rx3 = queue(&mgr, 1, 3, AcquireOpts::default());
    assert_eq!(mgr.info(1).waiters, 2);
    assert!(
        rx2.try_recv().is_err(),
        "nobody is granted while the holder holds"
    );

    assert!(mgr.release(1, 1));
    let second = answer(&rx2).unwrap().epoch;
    assert!(second > first);
    assert!(rx3.try_recv().is_err());
    assert_eq!(mgr.file_of_handle(2), Some(1));
    assert_eq!(mgr.check(1, 2, second).ok(), Some(()));

    assert!(mgr.release(1, 2));
    let third = answer(&rx3).unwrap().epoch;
    assert!(third > second);
    assert!(mgr.release(1, 3));
    assert_eq!(mgr.len(), 0);
    assert_eq!(mgr.info(1).state, LeaseState::Free);
    assert!(!mgr.release(1, 3), "a second release changes nothing");
}

#[test]
fn releasing_a_waiter_leaves_the_queue_without_callback() {
    let (_, mgr) = manager(waiting_cfg(10));
    granted(acquire(&mgr, 1, 1));
    assert!(matches!(
        mgr.acquire(1, holder(2), AcquireOpts::default(), never()),
        Ok(Acquire::Queued)
    ));
    let rx3 = queue(&mgr, 1, 3, AcquireOpts::default());
    assert!(mgr.release(1, 2));
    assert_eq!(mgr.info(1).waiters, 1);
    assert!(mgr.release(1, 1));
    assert!(answer(&rx3).is_ok());
}

#[test]
fn lease_wait_times_out_on_tick() {
    let (clock, mgr) = manager(waiting_cfg(10));
    granted(acquire(&mgr, 1, 1));
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    clock.advance(secs(9));
    assert!(mgr.tick().is_empty());
    assert!(rx.try_recv().is_err(), "not yet");
    clock.advance(secs(1));
    assert!(mgr.tick().is_empty());
    let err = answer(&rx).unwrap_err();
    assert!(matches!(err, LeaseError::WaitTimedOut { file: 1 }));
    assert_eq!(err.errno(), libc::EBUSY);
    assert_eq!(mgr.info(1).waiters, 0);
    assert!(mgr.waiting().is_empty());
}

#[test]
fn nonblock_fails_at_once_even_with_lease_wait() {
    let (_, mgr) = manager(waiting_cfg(10));
    granted(acquire(&mgr, 1, 1));
    let res = mgr.acquire(1, holder(2), AcquireOpts { nonblock: true }, never());
    assert!(matches!(res, Err(LeaseError::Busy { file: 1, .. })));
    assert_eq!(mgr.info(1).waiters, 0);
}

#[test]
fn flushed_clean_holder_makes_conflicting_open_wait_and_release_grants_it() {
    // Default config: no lease_wait, so only the pending RELEASE is waited for.
    let (clock, mgr) = manager(LeaseConfig::default());
    granted(acquire(&mgr, 1, 1));
    mgr.note_flush(1, 1);
    // Even O_NONBLOCK waits: close() returned, the lease is about to go.
    let rx = queue(&mgr, 1, 2, AcquireOpts { nonblock: true });
    clock.advance(Duration::from_millis(5));
    assert!(mgr.release(1, 1));
    let epoch = answer(&rx).unwrap().epoch;
    assert_eq!(mgr.check(1, 2, epoch).ok(), Some(()));

    // Writing after the flush makes the holder a live writer again.
    mgr.note_flush(1, 2);
    mgr.note_write(1, 2);
    assert!(matches!(acquire(&mgr, 1, 3), Err(LeaseError::Busy { .. })));
}

#[test]
fn flushed_holder_that_never_releases_times_out_after_grace() {
    let (clock, mgr) = manager(LeaseConfig::default());
    granted(acquire(&mgr, 1, 1));
    mgr.note_flush(1, 1);
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    clock.advance(secs(1));
    mgr.tick();
    assert!(rx.try_recv().is_err());
    clock.advance(secs(1));
    mgr.tick();
    assert!(matches!(answer(&rx), Err(LeaseError::WaitTimedOut { .. })));
}

#[test]
fn client_lease_preempted_after_soft_limit_and_old_handle_fenced() {
    let (clock, mgr) = manager(LeaseConfig::default());
    let old = granted(acquire(&mgr, 1, 1));
    mgr.set_mode(1, 1, RenewalMode::Client).unwrap();
    clock.advance(secs(59));
    assert!(matches!(acquire(&mgr, 1, 2), Err(LeaseError::Busy { .. })));
    clock.advance(secs(1));

    let (cb, rx) = recorder();
    let ticket = match mgr.acquire(1, holder(2), AcquireOpts { nonblock: true }, cb) {
        Ok(Acquire::Recover(t)) => t,
        other => panic!("expected Recover, got {other:?}"),
    };
    assert_eq!(ticket.reason, RecoveryReason::SoftLimit);
    assert_eq!(ticket.stale.holder.as_deref(), Some("h1:1001"));
    assert_eq!(ticket.stale.epoch, old);
    assert_eq!(ticket.stale.renewed_ms_ago, Some(60_000));
    assert_eq!(mgr.info(1).state, LeaseState::Recovering);
    assert_eq!(mgr.file_of_handle(1), None);

    // The stale holder is fenced at once, before recovery finishes.
    let fenced = LeaseError::Fenced {
        file: 1,
        epoch: old,
    };
    assert_eq!(
        format!("{:?}", mgr.check(1, 1, old)),
        format!("{:?}", Err::<(), _>(fenced))
    );
    assert!(matches!(mgr.renew(1, 1), Err(LeaseError::Fenced { epoch, .. }) if epoch == old));
    assert!(matches!(
        mgr.set_mode(1, 1, RenewalMode::Daemon),
        Err(LeaseError::Fenced { .. })
    ));
    assert_eq!(mgr.check(1, 1, old).unwrap_err().errno(), libc::EIO);
    // A third writer cannot jump in during recovery.
    assert!(matches!(acquire(&mgr, 1, 3), Err(LeaseError::Busy { .. })));
    assert!(rx.try_recv().is_err(), "granted only after recovery");

    mgr.finish_recovery(1, Ok(()));
    let new = answer(&rx).unwrap().epoch;
    assert!(new > old);
    assert_eq!(mgr.check(1, 2, new).ok(), Some(()));
    assert!(matches!(
        mgr.check(1, 1, old),
        Err(LeaseError::Fenced { .. })
    ));
    // The stale handle can never take the lease back.
    assert!(matches!(
        acquire(&mgr, 5, 1),
        Err(LeaseError::Fenced { .. })
    ));
    // Its RELEASE clears the fencing record.
    assert!(mgr.release(1, 1));
    assert!(matches!(mgr.renew(1, 1), Err(LeaseError::NotHolder { .. })));
}

#[test]
fn renewed_client_lease_is_not_preempted() {
    let (clock, mgr) = manager(LeaseConfig::default());
    granted(acquire(&mgr, 1, 1));
    mgr.set_mode(1, 1, RenewalMode::Client).unwrap();
    for _ in 0..10 {
        clock.advance(secs(30));
        mgr.renew(1, 1).unwrap();
    }
    clock.advance(secs(30));
    assert!(matches!(acquire(&mgr, 1, 2), Err(LeaseError::Busy { .. })));
    assert_eq!(mgr.info(1).renewed_ms_ago, Some(30_000));
}

#[test]
fn daemon_lease_not_preempted_while_renew_daemon_leases_runs() {
    let (clock, mgr) = manager(LeaseConfig::default());
    granted(acquire(&mgr, 1, 1));
    // Three hours, past both limits, with the renewal thread alive.
    for _ in 0..360 {
        clock.advance(secs(30));
        assert_eq!(mgr.renew_daemon_leases(), 1);
        assert!(mgr.tick().is_empty());
    }
    assert!(matches!(acquire(&mgr, 1, 2), Err(LeaseError::Busy { .. })));
    let info = mgr.info(1);
    assert_eq!(info.state, LeaseState::Held);
    assert_eq!(info.mode, Some(RenewalMode::Daemon));
    assert_eq!(info.renewed_ms_ago, Some(0));
}

/// The whole daemon stopped for two hard limits (SIGSTOP, a paused VM):
/// its daemon-renewed leases belong to open descriptors whose holders
/// waited on it, and survive; a renewal thread that stays dead while the
/// monitor runs still lets them expire a hard limit later.
#[test]
fn daemon_leases_survive_a_pause_of_the_whole_daemon() {
    let (clock, mgr) = manager(LeaseConfig::default());
    let epoch = granted(acquire(&mgr, 1, 1));
    for _ in 0..30 {
        clock.advance(secs(2));
        mgr.renew_daemon_leases();
        assert!(mgr.tick().is_empty());
    }
    clock.advance(secs(7200));
    assert!(
        mgr.tick().is_empty(),
        "a daemon-renewed lease expired for a pause"
    );
    assert!(mgr.check(1, 1, epoch).is_ok());
    // The renewal thread never comes back; the monitor does.
    let mut ticks = 0;
    let tickets = loop {
        clock.advance(secs(2));
        ticks += 1;
        let t = mgr.tick();
        if !t.is_empty() {
            break t;
        }
        assert!(ticks <= 1800, "never expired");
    };
    assert_eq!(ticks, 1800, "expired a hard limit after the pause");
    assert_eq!(tickets[0].reason, RecoveryReason::HardLimit);
}

#[test]
fn hard_limit_recovery_from_tick() {
    let (clock, mgr) = manager(LeaseConfig::default());
    let daemon_epoch = granted(acquire(&mgr, 1, 1));
    granted(acquire(&mgr, 2, 2));
    mgr.set_mode(2, 2, RenewalMode::Client).unwrap();
    // The monitor ticks every 2 s; the renewal thread never runs.
    for _ in 0..1799 {
        clock.advance(secs(2));
        assert!(mgr.tick().is_empty());
    }
    clock.advance(secs(2));
    let mut tickets = mgr.tick();
    tickets.sort_by_key(|t| t.file);
    assert_eq!(tickets.len(), 2, "{tickets:?}");
    assert!(
        tickets
            .iter()
            .all(|t| t.reason == RecoveryReason::HardLimit)
    );
    assert_eq!(tickets[0].stale.mode, Some(RenewalMode::Daemon));
    assert_eq!(tickets[1].stale.mode, Some(RenewalMode::Client));
    assert!(matches!(
        mgr.check(1, 1, daemon_epoch),
        Err(LeaseError::Fenced { epoch, .. }) if epoch == daemon_epoch
    ));
    assert!(mgr.tick().is_empty(), "recovery is started once");
    mgr.finish_recovery(1, Ok(()));
    mgr.finish_recovery(2, Ok(()));
    assert_eq!(mgr.len(), 0);
    assert_eq!(mgr.info(1).epoch, 0);
}

#[test]
fn contended_client_lease_past_soft_limit_recovered_by_tick() {
    let (clock, mgr) = manager(waiting_cfg(120));
    let old = granted(acquire(&mgr, 1, 1));
    mgr.set_mode(1, 1, RenewalMode::Client).unwrap();
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    clock.advance(secs(59));
    assert!(mgr.tick().is_empty());
    clock.advance(secs(1));
    let tickets = mgr.tick();
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].reason, RecoveryReason::SoftLimit);
    mgr.finish_recovery(1, Ok(()));
    assert!(answer(&rx).unwrap().epoch > old);
    // An uncontended client lease past the soft limit is left alone.
    mgr.set_mode(1, 2, RenewalMode::Client).unwrap();
    clock.advance(secs(600));
    assert!(mgr.tick().is_empty());
}

#[test]
fn recover_now_fences_holder_and_frees_file() {
    let (_, mgr) = manager(LeaseConfig::default());
    assert!(mgr.recover_now(1).is_none(), "free file");
    let epoch = granted(acquire(&mgr, 1, 1));
    let ticket = mgr.recover_now(1).expect("held lease");
    assert_eq!(ticket.reason, RecoveryReason::Manual);
    assert!(mgr.recover_now(1).is_none(), "already recovering");
    assert!(matches!(
        mgr.check(1, 1, epoch),
        Err(LeaseError::Fenced { .. })
    ));
    mgr.finish_recovery(1, Ok(()));
    assert_eq!(mgr.info(1).state, LeaseState::Free);
}

#[test]
fn orphan_recovery_blocks_writers_until_finished() {
    let (_, mgr) = manager(waiting_cfg(30));
    let ticket = mgr
        .recover_orphan(1, 50, Some(holder(9)))
        .expect("unknown file");
    assert_eq!(ticket.reason, RecoveryReason::HolderGone);
    assert_eq!(ticket.stale.epoch, 50);
    assert!(mgr.recover_orphan(1, 50, None).is_none());
    assert_eq!(mgr.info(1).state, LeaseState::Recovering);
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    assert!(matches!(
        mgr.acquire(1, holder(3), AcquireOpts { nonblock: true }, never()),
        Err(LeaseError::Busy { .. })
    ));
    mgr.finish_recovery(1, Ok(()));
    assert!(answer(&rx).is_ok());
}

#[test]
fn cancel_waiter_interrupts_its_open() {
    let (_, mgr) = manager(waiting_cfg(10));
    granted(acquire(&mgr, 1, 1));
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    assert_eq!(mgr.waiting(), vec![(1, 2, 1002)]);
    assert!(mgr.cancel_waiter(1, 2));
    let err = answer(&rx).unwrap_err();
    assert!(matches!(err, LeaseError::Interrupted { file: 1 }));
    assert_eq!(err.errno(), libc::EINTR);
    assert!(!mgr.cancel_waiter(1, 2));
    assert!(mgr.waiting().is_empty());
    assert_eq!(mgr.info(1).waiters, 0);
}

#[test]
fn recovery_failure_fails_every_waiter_and_drops_lease() {
    let (clock, mgr) = manager(waiting_cfg(300));
    granted(acquire(&mgr, 1, 1));
    mgr.set_mode(1, 1, RenewalMode::Client).unwrap();
    let rx2 = queue(&mgr, 1, 2, AcquireOpts::default());
    clock.advance(secs(61));
    let (cb, rx3) = recorder();
    assert!(matches!(
        mgr.acquire(1, holder(3), AcquireOpts::default(), cb),
        Ok(Acquire::Recover(_))
    ));
    mgr.finish_recovery(1, Err("no live replica".into()));
    for rx in [rx2, rx3] {
        match answer(&rx) {
            Err(e @ LeaseError::RecoveryFailed { .. }) => {
                assert!(e.to_string().contains("no live replica"));
                assert_eq!(e.errno(), libc::EIO);
            }
            other => panic!("expected RecoveryFailed, got {other:?}"),
        }
    }
    assert_eq!(mgr.len(), 0);
    assert!(mgr.waiting().is_empty());
}

#[test]
fn idle_tick_does_not_scan_healthy_leases() {
    let (clock, mgr) = manager(LeaseConfig::default());
    for f in 0..10_000 {
        granted(acquire(&mgr, f, f));
        if f % 2 == 0 {
            mgr.set_mode(f, f, RenewalMode::Client).unwrap();
        }
    }
    for _ in 0..4 {
        clock.advance(secs(30));
        for f in (0..10_000).step_by(2) {
            mgr.renew(f, f).unwrap();
        }
        assert_eq!(mgr.renew_daemon_leases(), 5_000);
        assert!(mgr.tick().is_empty());
    }
    assert_eq!(mgr.tick_examined(), 0);
    // Expiry costs what expires: one client lease left unrenewed.
    for _ in 0..130 {
        clock.advance(secs(30));
        for f in (2..10_000).step_by(2) {
            mgr.renew(f, f).unwrap();
        }
        mgr.renew_daemon_leases();
        mgr.tick();
    }
    assert_eq!(mgr.tick_examined(), 1);
}

#[test]
fn callbacks_run_outside_the_lock() {
    let (clock, mgr) = manager(waiting_cfg(10));
    let (tx, rx) = mpsc::channel();
    let worker = {
        let mgr = mgr.clone();
        std::thread::spawn(move || {
            granted(acquire(&mgr, 1, 1));
            // Each callback calls back into the manager.
            let reentrant = |mgr: Arc<LeaseManager>, tx: mpsc::Sender<String>| -> GrantCallback {
                Box::new(move |res| {
                    let info = mgr.info(1);
                    let _ = mgr.waiting();
                    let _ = mgr.tick();
                    tx.send(format!("{:?} {:?}", res.map(|_| ()), info.state))
                        .unwrap();
                })
            };
            let opts = AcquireOpts::default();
            let cb = reentrant(mgr.clone(), tx.clone());
            assert!(matches!(
                mgr.acquire(1, holder(2), opts, cb),
                Ok(Acquire::Queued)
            ));
            mgr.release(1, 1); // grant
            let cb = reentrant(mgr.clone(), tx.clone());
            assert!(matches!(
                mgr.acquire(1, holder(3), opts, cb),
                Ok(Acquire::Queued)
            ));
            mgr.cancel_waiter(1, 3); // interrupt
            let cb = reentrant(mgr.clone(), tx.clone());
            assert!(matches!(
                mgr.acquire(1, holder(4), opts, cb),
                Ok(Acquire::Queued)
            ));
            clock.advance(secs(11));
            mgr.tick(); // timeout
            let cb = reentrant(mgr.clone(), tx.clone());
            assert!(matches!(
                mgr.acquire(1, holder(5), opts, cb),
                Ok(Acquire::Queued)
            ));
            mgr.shutdown();
        })
    };
    let mut got = Vec::new();
    for _ in 0..4 {
        let msg = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a callback deadlocked on the manager's lock");
        got.push(msg);
    }
    worker.join().unwrap();
    assert_eq!(got[0], "Ok(()) Held");
    assert!(got[1].starts_with("Err(Interrupted"), "{got:?}");
    assert!(got[2].starts_with("Err(WaitTimedOut"), "{got:?}");
    assert!(got[3].starts_with("Err(ShuttingDown"), "{got:?}");
}

#[test]
fn shutdown_fails_waiters_and_refuses_new_acquires() {
    let (_, mgr) = manager(waiting_cfg(10));
    granted(acquire(&mgr, 1, 1));
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    mgr.shutdown();
    assert!(matches!(answer(&rx), Err(LeaseError::ShuttingDown)));
    assert!(matches!(acquire(&mgr, 2, 3), Err(LeaseError::ShuttingDown)));
    assert!(mgr.release(1, 1));
    assert_eq!(mgr.len(), 0);
}

#[test]
fn info_shows_holder_host_pid_comm_and_json_fields() {
    let (clock, mgr) = manager(waiting_cfg(10));
    let mut h = holder(1);
    h.comm = "a-very-long-process-name".into();
    let epoch = granted(mgr.acquire(1, h, AcquireOpts::default(), never()));
    let _rx = queue(&mgr, 1, 2, AcquireOpts::default());
    clock.advance(Duration::from_millis(1500));
    let info = mgr.info(1);
    assert_eq!(info.holder.as_deref(), Some("h1:1001"));
    assert_eq!(info.comm.as_deref(), Some("a-very-long-proc"));
    assert_eq!(info.handle, Some(1));
    assert_eq!(info.epoch, epoch);
    assert_eq!(info.renewed_ms_ago, Some(1500));
    assert_eq!(info.opened_wall_ms, Some(1_700_000_000_000));
    assert_eq!(info.waiters, 1);
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["state"], "held");
    assert_eq!(json["mode"], "daemon");
    assert_eq!(
        serde_json::to_value(RecoveryReason::HardLimit).unwrap(),
        "hard_limit"
    );
    let free = serde_json::to_value(mgr.info(99)).unwrap();
    assert_eq!(free["state"], "free");
    assert_eq!(free["epoch"], 0);
    assert_eq!(mgr.list().len(), 1);
}

#[test]
fn comm_is_cut_at_a_character_boundary() {
    let (_, mgr) = manager(LeaseConfig::default());
    let mut h = holder(1);
    h.comm = "ééééééééé".into(); // 18 bytes
    granted(mgr.acquire(1, h, AcquireOpts::default(), never()));
    assert_eq!(mgr.info(1).comm.as_deref(), Some("éééééééé"));
}

#[test]
fn lease_record_stays_small() {
    // A million leases must fit in 256 MB with their index entries.
    assert!(std::mem::size_of::<super::record::Lease>() <= 104);
}

#[test]
fn manager_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<LeaseManager>();
}

#[test]
fn concurrent_opens_never_see_two_holders_of_one_file() {
    use std::sync::atomic::{AtomicI32, Ordering};

    let (_, mgr) = manager(waiting_cfg(3600));
    let holders: Arc<Vec<AtomicI32>> = Arc::new((0..4).map(|_| AtomicI32::new(0)).collect());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (mgr, holders) = (mgr.clone(), holders.clone());
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let file = (t + i) % 4;
                    let handle = t * 1_000_000 + i + 1;
                    let (cb, rx) = recorder();
                    let epoch = match mgr.acquire(file, holder(handle), AcquireOpts::default(), cb)
                    {
                        Ok(Acquire::Granted(g)) => g.epoch,
                        Ok(Acquire::Queued) => {
                            rx.recv_timeout(Duration::from_secs(10))
                                .expect("queued open answered")
                                .expect("granted")
                                .epoch
                        }
                        other => panic!("unexpected {other:?}"),
                    };
                    let slot = &holders[file as usize];
                    assert_eq!(slot.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    mgr.check(file, handle, epoch).unwrap();
                    mgr.note_write(file, handle);
                    slot.fetch_sub(1, Ordering::SeqCst);
                    assert!(mgr.release(file, handle));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(mgr.is_empty());
    assert!(mgr.waiting().is_empty());
}

#[test]
fn maintenance_pins_only_a_file_nobody_holds_and_writers_wait_for_it() {
    let (clock, mgr) = manager(LeaseConfig::default());
    granted(acquire(&mgr, 1, 1));
    // A writer holds it (or its close is in flight): no pin.
    assert!(!mgr.pin(1));
    assert!(mgr.release(1, 1));
    assert!(mgr.pin(1));
    assert!(!mgr.pin(1), "pinned twice");
    // A writer that asks now waits, even with O_NONBLOCK (the file is not
    // really held), however long the maintenance takes...
    let rx = queue(&mgr, 1, 2, AcquireOpts { nonblock: true });
    clock.advance(secs(3600));
    let tickets = mgr.tick();
    assert!(
        tickets.is_empty(),
        "a pinned file needs no recovery: {tickets:?}"
    );
    assert!(rx.try_recv().is_err(), "granted while pinned");
    assert!(mgr.list().is_empty(), "pins are not leases");
    // ...and gets the lease when it ends.
    mgr.unpin(1);
    assert!(answer(&rx).is_ok());
    mgr.unpin(1);
    assert_eq!(mgr.info(1).state, LeaseState::Held, "unpin of a held file");
    // Unpinned with nobody waiting: free.
    assert!(mgr.pin(2));
    mgr.unpin(2);
    assert_eq!(mgr.info(2).state, LeaseState::Free);
}

/// Hands out a few epochs, then none.
struct Failing(u64);

impl EpochSource for Failing {
    fn next(&mut self, _file: FileId) -> Result<u64, String> {
        if self.0 == 0 {
            return Err("disk full".into());
        }
        self.0 -= 1;
        Ok(100 - self.0)
    }
}

#[test]
fn a_grant_without_a_durable_epoch_fails_the_open() {
    let clock = Arc::new(FakeClock::new());
    let cfg = waiting_cfg(10);
    let mgr = LeaseManager::new(cfg, clock, Box::new(Failing(1)), "h1".into());
    granted(acquire(&mgr, 1, 1));
    // The waiter's grant finds no epoch: its open fails (EIO), and the
    // file is free rather than held without one.
    let rx = queue(&mgr, 1, 2, AcquireOpts::default());
    assert!(mgr.release(1, 1));
    match answer(&rx) {
        Err(e @ LeaseError::NoEpoch { .. }) => assert_eq!(e.errno(), libc::EIO),
        other => panic!("expected NoEpoch, got {other:?}"),
    }
    assert_eq!(mgr.info(1).state, LeaseState::Free);
    match acquire(&mgr, 1, 3) {
        Err(LeaseError::NoEpoch { .. }) => {}
        other => panic!("expected NoEpoch, got {other:?}"),
    }
}

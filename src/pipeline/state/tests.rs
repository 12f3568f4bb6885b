//! The stream's state machine alone: queues, barriers, acknowledgements
//! and endings, without a streamer.

use std::sync::Weak;

use super::*;
use crate::pipeline::budget::{Budget, UnitWaiter};
use crate::sync::{Arc, Mutex, lock};

/// Completions that note how they were called.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn done(&self, name: &'static str) -> Done {
        let calls = self.0.clone();
        Box::new(move |r| {
            let what = match r {
                Ok(()) => "ok".to_string(),
                Err(e) => e.to_string(),
            };
            lock(&calls).push(format!("{name}: {what}"));
        })
    }

    fn seen(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.0))
    }
}

fn call(d: Option<Done>, r: FsResult<()>) {
    if let Some(d) = d {
        d(r)
    }
}

struct NoWaiter;
impl UnitWaiter for NoWaiter {
    fn unit_granted(self: Arc<Self>, _: Unit) {}
}

/// A write buffer of `units`, and a way to take from it.
struct Buffer {
    budget: Arc<Budget>,
    waiter: Weak<dyn UnitWaiter>,
    _rt: tokio::runtime::Runtime,
}

impl Buffer {
    fn new(units: usize) -> Buffer {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        Buffer {
            budget: Budget::new(units, rt.handle().clone()),
            waiter: Weak::<NoWaiter>::new(),
            _rt: rt,
        }
    }

    fn take(&self) -> impl FnMut() -> Option<Unit> + '_ {
        || self.budget.take(&self.waiter)
    }
}

fn limits(max_in_flight: usize) -> Limits {
    Limits {
        packet_size: 100,
        max_in_flight,
        block_size: 250,
    }
}

/// The packets the streamer would take next, as (offset, length),
/// each acknowledged at once; stops at the first barrier.
fn take_packets(s: &mut StreamState, buf: &Buffer) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    while let Next::Job(Job::Packet(p)) = s.next_job() {
        out.push((p.off, p.data.len()));
        call(s.ack(p.end(), &mut buf.take()), Ok(()));
    }
    out
}

#[test]
fn packets_fill_to_the_packet_size_and_never_cross_a_block_boundary() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(10), 0);
    let now = s.accept(&[7; 600], calls.done("write"), 1, &mut buf.take());
    call(now, Ok(()));
    assert_eq!(calls.seen(), ["write: ok"]);
    assert_eq!((s.pos(), s.in_flight(), s.visible_len()), (600, 7, 0));
    assert!(s.claim_streamer());
    assert!(!s.claim_streamer(), "one streamer at a time");
    assert_eq!(
        take_packets(&mut s, &buf),
        [
            (0, 100),
            (100, 100),
            (200, 50),
            (250, 100),
            (350, 100),
            (450, 50),
            (500, 100)
        ]
    );
    assert_eq!((s.visible_len(), s.in_flight()), (600, 0));
    assert!(
        !s.is_streaming(),
        "the streamer stops when the queue is empty"
    );
}

#[test]
fn only_a_written_stream_with_everything_acknowledged_is_closed_by_its_caller() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(10), 0);
    assert!(!s.claim_for_close(), "nothing written: nothing to record");
    call(
        s.accept(&[7; 50], calls.done("w"), 1, &mut buf.take()),
        Ok(()),
    );
    assert!(!s.claim_for_close(), "a packet is still buffered");
    assert!(matches!(
        s.barrier(Barrier::Sync, calls.done("sync")),
        Enqueued::Queued
    ));
    assert!(!s.claim_for_close(), "a job is queued");
    assert!(s.claim_streamer());
    let Next::Job(Job::Packet(p)) = s.next_job() else {
        panic!("the packet first")
    };
    assert!(!s.claim_for_close(), "the streamer runs");
    call(s.ack(p.end(), &mut buf.take()), Ok(()));
    let Next::Job(Job::Sync(d)) = s.next_job() else {
        panic!("then the sync")
    };
    d(Ok(()));
    assert!(matches!(s.next_job(), Next::Idle));
    // Everything acknowledged, nothing queued: the close is the caller's.
    assert!(s.claim_for_close());
    assert!(s.is_streaming(), "a write meanwhile waits for the close");
    assert!(!s.claim_streamer());
    assert!(!s.release_after_close());
    assert!(!s.is_streaming());
    // A write queued while the caller closed starts a worker after it.
    assert!(s.claim_for_close());
    call(
        s.accept(&[8; 50], calls.done("w2"), 2, &mut buf.take()),
        Ok(()),
    );
    assert!(matches!(
        s.barrier(Barrier::Flush, calls.done("flush")),
        Enqueued::Queued
    ));
    assert!(s.release_after_close(), "the streamer stays claimed");
    assert!(s.is_streaming());
    assert_eq!(calls.seen(), ["w: ok", "sync: ok", "w2: ok"]);
}

#[test]
fn queued_packets_that_continue_one_merge_up_to_the_cap_and_the_block_end_and_each_is_acknowledged()
{
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(10), 0);
    call(
        s.accept(&[7; 450], calls.done("w1"), 1, &mut buf.take()),
        Ok(()),
    );
    assert!(matches!(
        s.barrier(Barrier::Flush, calls.done("flush")),
        Enqueued::Queued
    ));
    call(
        s.accept(&[8; 50], calls.done("w2"), 2, &mut buf.take()),
        Ok(()),
    );
    assert!(s.claim_streamer());
    let Next::Job(Job::Packet(mut p)) = s.next_job() else {
        panic!("a packet first")
    };
    // Capped at 200 bytes: the first two packets.
    assert_eq!(s.merge_following(&mut p, 200, 0..250), [100, 200]);
    assert_eq!((p.off, p.data.len()), (0, 200));
    for end in [100, 200] {
        call(s.ack(end, &mut buf.take()), Ok(()));
    }
    assert_eq!(s.visible_len(), 200);
    // The block ends at 250: the packet up to it, not the one after.
    let Next::Job(Job::Packet(mut p)) = s.next_job() else {
        panic!("the block's last packet")
    };
    assert_eq!(s.merge_following(&mut p, 1 << 20, 0..250), [250]);
    call(s.ack(250, &mut buf.take()), Ok(()));
    // The next block's packets merge up to the barrier, never past it.
    let Next::Job(Job::Packet(mut p)) = s.next_job() else {
        panic!("the next block")
    };
    assert_eq!(s.merge_following(&mut p, 1 << 20, 250..500), [350, 450]);
    assert!(matches!(s.next_job(), Next::Job(Job::Flush(_))));
    assert_eq!(s.in_flight(), 2 + 1, "one more packet behind the barrier");
}

#[test]
fn a_merging_block_lets_twice_the_bound_in_flight() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let big = Limits {
        block_size: 1 << 20,
        ..limits(2)
    };
    let mut s = StreamState::new(big, 0);
    assert!(
        s.accept(&[1; 450], calls.done("w"), 1, &mut buf.take())
            .is_none()
    );
    assert_eq!((s.in_flight(), s.in_flight_bound()), (2, 2));
    let mut s = StreamState::new(big, 0);
    assert!(s.set_merging(true, &mut buf.take()).is_none());
    assert!(
        s.accept(&[1; 450], calls.done("w"), 1, &mut buf.take())
            .is_some()
    );
    assert_eq!((s.in_flight(), s.in_flight_bound()), (4, 4));
}

#[test]
fn a_write_past_the_in_flight_bound_waits_for_acks_in_order() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(
        Limits {
            block_size: 1 << 20,
            ..limits(2)
        },
        1000,
    );
    // Two packets in flight, a third full one waiting, 150 bytes
    // still to come: the write is blocked.
    let now = s.accept(&[1; 450], calls.done("write"), 1, &mut buf.take());
    assert!(now.is_none());
    assert_eq!((s.pos(), s.in_flight()), (1300, 2));
    let Next::Job(Job::Packet(p)) = s.next_job() else {
        panic!("a packet first")
    };
    assert_eq!((p.off, p.end()), (1000, 1100));
    // Acknowledged in order: each ack moves the visible length and
    // lets one more packet in, until the write's bytes are all in.
    assert!(s.ack(p.end(), &mut buf.take()).is_none());
    assert_eq!((s.visible_len(), s.in_flight(), s.pos()), (1100, 2, 1400));
    let Next::Job(Job::Packet(p)) = s.next_job() else {
        panic!("the second packet")
    };
    assert_eq!(p.off, 1100);
    call(s.ack(p.end(), &mut buf.take()), Ok(()));
    assert_eq!(calls.seen(), ["write: ok"]);
    assert_eq!((s.visible_len(), s.pos()), (1200, 1450));
    assert!(s.peak_in_flight() <= 2);
    // The last 50 bytes wait in the current packet for more, or a
    // barrier.
    assert_eq!(take_packets(&mut s, &buf), [(1200, 100), (1300, 100)]);
    assert_eq!(s.visible_len(), 1400);
}

#[test]
fn a_barrier_waits_behind_the_packets_before_it() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(10), 0);
    // Nothing written: nothing to wait for.
    for kind in [Barrier::Flush, Barrier::Close] {
        match s.barrier(kind, calls.done("idle")) {
            Enqueued::Now(d, r) => d(r),
            Enqueued::Queued => panic!("an untouched stream queued a {kind:?}"),
        }
    }
    assert_eq!(calls.seen(), ["idle: ok", "idle: ok"]);
    // An fsync always runs: there may be blocks earlier writers left
    // unsynced.
    assert!(matches!(
        s.barrier(Barrier::Sync, calls.done("idle sync")),
        Enqueued::Queued
    ));
    assert!(matches!(s.next_job(), Next::Job(Job::Sync(_))));
    call(
        s.accept(&[2; 150], calls.done("write"), 1, &mut buf.take()),
        Ok(()),
    );
    // The barrier seals the partial packet and waits behind it.
    assert!(matches!(
        s.barrier(Barrier::Sync, calls.done("sync")),
        Enqueued::Queued
    ));
    assert_eq!(take_packets(&mut s, &buf), [(0, 100), (100, 50)]);
    // (`take_packets` stopped at the barrier and took it.)
    assert_eq!(calls.seen(), ["write: ok"]);
    assert!(matches!(s.next_job(), Next::Idle));
}

// The one-step endings: a close only behind the stream's last packet
// with nothing after it but closes; an fsync also with a close behind it (a
// forked child's exec closes its copy of the descriptor: FLUSH).
#[test]
fn an_fsync_is_taken_with_its_packet_whatever_follows_it_and_a_close_only_with_closes_behind_it() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    // One packet queued, then two barriers behind it; the packet taken.
    let behind_a_packet = |first: Barrier, second: Barrier| {
        let mut s = StreamState::new(limits(8), 0);
        call(
            s.accept(&[1; 50], calls.done("write"), 1, &mut buf.take()),
            Ok(()),
        );
        s.barrier(first, calls.done("first"));
        s.barrier(second, calls.done("second"));
        assert!(matches!(s.next_job(), Next::Job(Job::Packet(_))));
        s
    };
    let mut s = behind_a_packet(Barrier::Sync, Barrier::Close);
    assert!(s.take_ending(false).is_none(), "no fsync asked for");
    assert!(matches!(s.take_ending(true), Some(Ending::Sync(_))));
    assert!(matches!(s.next_job(), Next::Job(Job::Close(_))));
    // A close with anything behind it is not the stream's last.
    let mut s = behind_a_packet(Barrier::Close, Barrier::Flush);
    assert!(s.take_ending(true).is_none());
    assert!(matches!(s.next_job(), Next::Job(Job::Close(_))));
    // But one with only closes behind it is (a child's exec closed its
    // copy of the descriptor, then the writer closed its own): every
    // close completes with it.
    let mut s = behind_a_packet(Barrier::Close, Barrier::Close);
    let Some(Ending::Close(d)) = s.take_ending(false) else {
        panic!("two closes behind the last packet: no one-step close")
    };
    assert!(matches!(s.next_job(), Next::Idle));
    d(Ok(()));
    let seen = calls.seen();
    assert_eq!(seen[seen.len() - 2..], ["first: ok", "second: ok"]);
}

#[test]
fn a_failed_stream_fails_every_waiter_and_every_later_call() {
    let buf = Buffer::new(100);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(1), 0);
    assert!(
        s.accept(&[3; 300], calls.done("write"), 1, &mut buf.take())
            .is_none()
    );
    assert!(matches!(
        s.barrier(Barrier::Close, calls.done("close")),
        Enqueued::Queued
    ));
    s.fail(FsError::Io("every replica failed".into()));
    let Next::Failed(e, cbs) = s.next_job() else {
        panic!("a failed stream runs nothing")
    };
    for d in cbs {
        d(Err(e.clone()));
    }
    assert_eq!(
        calls.seen(),
        [
            "write: i/o error: every replica failed",
            "close: i/o error: every replica failed"
        ]
    );
    assert_eq!(s.in_flight(), 0);
    assert!(matches!(s.check_write(None), Err(FsError::Io(_))));
    assert!(matches!(
        s.barrier(Barrier::Flush, calls.done("flush")),
        Enqueued::Now(_, Err(FsError::Io(_)))
    ));
    // The first error stays the stream's.
    let kept = s.fail_first(FsError::BadHandle);
    assert!(matches!(kept, FsError::Io(_)), "{kept}");
}

#[test]
fn without_a_unit_of_the_write_buffer_only_the_first_packet_goes_in_flight() {
    let buf = Buffer::new(1);
    let calls = Calls::default();
    let other = buf.budget.take(&buf.waiter).expect("the only unit");
    let mut s = StreamState::new(limits(10), 0);
    assert!(
        s.accept(&[4; 250], calls.done("write"), 1, &mut buf.take())
            .is_none(),
        "the second packet needs a unit another stream holds"
    );
    assert_eq!((s.in_flight(), s.pos()), (1, 200));
    assert_eq!(buf.budget.stats().waiting, 1);
    // The unit comes: the write goes on, and what it does not need
    // goes back.
    let g = s.unit_granted(other, &mut buf.take());
    call(g.done, Ok(()));
    assert_eq!(calls.seen(), ["write: ok"]);
    assert_eq!((s.in_flight(), s.pos()), (2, 250));
    assert!(g.spare.is_empty());
}

#[test]
fn writes_must_continue_the_stream_and_truncation_moves_its_end() {
    let buf = Buffer::new(10);
    let calls = Calls::default();
    let mut s = StreamState::new(limits(10), 500);
    s.check_write(Some(500)).unwrap();
    s.check_write(None).unwrap();
    match s.check_write(Some(10)) {
        Err(FsError::OutOfOrderWrite { expected, got }) => {
            assert_eq!((expected, got), (500, 10))
        }
        r => panic!("{r:?}"),
    }
    call(
        s.accept(&[5; 50], calls.done("write"), 1, &mut buf.take()),
        Ok(()),
    );
    assert!(matches!(
        s.truncate(20, calls.done("truncate"), 2),
        Enqueued::Queued
    ));
    assert_eq!((s.pos(), s.mtime()), (20, Some(2)));
    s.check_write(Some(20)).unwrap();
    assert_eq!(take_packets(&mut s, &buf), [(500, 50)]);
    s.truncated(20);
    assert_eq!(s.visible_len(), 20);
    // A close with nothing after it leaves the stream clean.
    assert!(s.is_dirty());
    s.closed();
    assert!(!s.is_dirty());
}

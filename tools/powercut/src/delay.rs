//! Replies sent late, for `powercut slow`: a write under a slowed
//! directory is made at once and its reply is sent after the delay by one
//! timer thread, so that a slow disk holds up only the writers waiting on
//! it, never the request threads (which serve everyone else meanwhile).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

type Reply = Box<dyn FnOnce() + Send>;

/// One late reply.
struct Late {
    at: Instant,
    seq: u64,
    reply: Reply,
}

impl PartialEq for Late {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Late {}
impl PartialOrd for Late {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Late {
    /// The earliest first (`BinaryHeap` is a max-heap), in order of
    /// arrival on a tie.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Sends replies when their delay is over.
pub struct Delayer {
    tx: Sender<Late>,
}

impl Delayer {
    pub fn new() -> std::io::Result<Delayer> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("late-replies".into())
            .spawn(move || run(rx))?;
        Ok(Delayer { tx })
    }

    /// Runs `reply` once `delay` has passed.
    pub fn after(&self, delay: Duration, reply: impl FnOnce() + Send + 'static) {
        let late = Late {
            at: Instant::now() + delay,
            seq: 0,
            reply: Box::new(reply),
        };
        if let Err(mpsc::SendError(late)) = self.tx.send(late) {
            // The timer thread is gone (it never is while the process
            // runs): answer now rather than never.
            (late.reply)();
        }
    }
}

fn run(rx: Receiver<Late>) {
    let mut due: BinaryHeap<Late> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|l| l.at <= now) {
            if let Some(l) = due.pop() {
                (l.reply)();
            }
        }
        let next = match due.peek() {
            Some(l) => rx.recv_timeout(l.at - now),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(mut l) => {
                seq += 1;
                l.seq = seq;
                due.push(l);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                for l in due.drain() {
                    (l.reply)();
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn replies_come_after_their_delay_earliest_first() {
        let d = Delayer::new().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        for (name, ms) in [("b", 60u64), ("a", 20), ("c", 60)] {
            let (order, tx) = (order.clone(), tx.clone());
            d.after(Duration::from_millis(ms), move || {
                order.lock().unwrap().push((name, t0.elapsed()));
                let _ = tx.send(());
            });
        }
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        let got = order.lock().unwrap().clone();
        let names: Vec<_> = got.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(got[0].1 >= Duration::from_millis(20), "{got:?}");
        assert!(got[2].1 >= Duration::from_millis(60), "{got:?}");
    }
}

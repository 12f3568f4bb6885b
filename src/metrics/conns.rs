//! The connections the metrics endpoint serves at once, oldest first.
//! A new connection always finds room unless every one of them is
//! answering a request right now: the oldest connection that is not
//! (idle between requests, sending its request head, or slow to take its
//! answer) is told to close. So slow or idle clients can hold a place only
//! until someone else connects, and a scrape never waits behind them.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, lock};

use tokio::sync::Notify;

/// One connection's state, shared by its task, its requests and the
/// registry.
#[derive(Default)]
pub struct Conn {
    /// A request of it is being answered (its snapshot taken).
    answering: AtomicBool,
    /// Requests it has been sent.
    requests: AtomicU64,
    /// Told to close to make room for a newer connection.
    pub evicted: Notify,
}

impl Conn {
    /// Marks the connection busy until the guard is dropped.
    pub fn answering(self: &Arc<Self>) -> Answering {
        self.answering.store(true, Ordering::Release);
        Answering {
            conn: self.clone(),
            nth: self.requests.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }
}

/// While alive, the connection answers a request and is not evicted.
pub struct Answering {
    conn: Arc<Conn>,
    /// Which request of the connection it is (1 for the first).
    pub nth: u64,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.conn.answering.store(false, Ordering::Release);
    }
}

/// The registry of connections being served.
pub struct Conns {
    max: usize,
    list: Mutex<List>,
}

#[derive(Default)]
struct List {
    /// The last id given.
    last: u64,
    /// (id, connection), oldest first.
    open: Vec<(u64, Arc<Conn>)>,
}

impl Conns {
    pub fn new(max: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max,
            list: Mutex::new(List::default()),
        })
    }

    /// A place for a new connection, evicting the oldest one that is not
    /// answering if all are taken; `None` when every place is answering.
    pub fn admit(self: &Arc<Self>) -> Option<Place> {
        let mut l = lock(&self.list);
        if l.open.len() >= self.max {
            let oldest_idle = l
                .open
                .iter()
                .position(|(_, c)| !c.answering.load(Ordering::Acquire))?;
            let (_, c) = l.open.remove(oldest_idle);
            c.evicted.notify_one();
        }
        l.last += 1;
        let id = l.last;
        let conn = Arc::new(Conn::default());
        l.open.push((id, conn.clone()));
        Some(Place {
            conns: self.clone(),
            id,
            conn,
        })
    }

    /// Connections holding a place.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.list).open.len()
    }
}

/// A connection's place; given back when dropped.
pub struct Place {
    conns: Arc<Conns>,
    id: u64,
    pub conn: Arc<Conn>,
}

impl Drop for Place {
    fn drop(&mut self) {
        lock(&self.conns.list).open.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_connection_not_answering_makes_room() {
        let c = Conns::new(2);
        let a = c.admit().expect("room");
        let b = c.admit().expect("room");
        let busy = a.conn.answering();
        // Full: b (not answering) goes, a (answering) stays.
        let n = c.admit().expect("room made");
        assert_eq!(c.len(), 2);
        assert!(
            futures_now(b.conn.evicted.notified()),
            "b was not told to close"
        );
        assert!(!futures_now(a.conn.evicted.notified()));
        // Both left answering: no room, and nobody is evicted.
        let _busy_n = n.conn.answering();
        assert!(c.admit().is_none());
        drop(busy);
        drop(b);
        assert!(c.admit().is_some(), "a is idle again");
        drop(a);
    }

    /// Whether a `notified()` future is ready at once (a stored permit).
    fn futures_now(f: tokio::sync::futures::Notified<'_>) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(1), f)
                .await
                .is_ok()
        })
    }
}

//! A bounded queue between the training thread and a plugin's worker thread.
//! When full, a droppable item evicts the oldest droppable one (counted) or waits,
//! by policy. Items that must not be lost (checkpoints, run start/end) are always
//! accepted, even past the capacity.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Condvar, Mutex,
    },
    time::Instant,
};

use crate::config::OnFull;

/// What [`BoundedQueue::pop_until`] got.
#[derive(Debug, PartialEq)]
pub enum Popped<T> {
    Item(T),
    /// Nothing came before the deadline.
    TimedOut,
    /// Closed and drained: nothing more will come.
    Closed,
}

pub trait QueueItem {
    fn droppable(&self) -> bool;
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

pub struct BoundedQueue<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
    policy: OnFull,
    dropped: AtomicU64,
    /// Pushes that waited for room (`on_full = "block"`), and how long they waited in all.
    waited: AtomicU64,
    blocked_ns: AtomicU64,
}

impl<T: QueueItem> BoundedQueue<T> {
    pub fn new(capacity: usize, policy: OnFull) -> BoundedQueue<T> {
        BoundedQueue {
            state: Mutex::new(State { items: VecDeque::with_capacity(capacity.min(4096)), closed: false }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity: capacity.max(1),
            policy,
            dropped: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            blocked_ns: AtomicU64::new(0),
        }
    }

    /// Enqueues `item`; returns false when the queue is closed.
    pub fn push(&self, item: T) -> bool {
        let mut state = self.state.lock().expect("queue lock");
        if item.droppable() {
            // Read only once the queue is full: a push with room costs no clock read.
            let mut blocked_since: Option<Instant> = None;
            while state.items.len() >= self.capacity && !state.closed {
                match self.policy {
                    OnFull::DropOldest => match state.items.iter().position(QueueItem::droppable) {
                        Some(oldest) => {
                            state.items.remove(oldest);
                            self.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        None => break,
                    },
                    OnFull::Block => {
                        if blocked_since.is_none() {
                            blocked_since = Some(Instant::now());
                            self.waited.fetch_add(1, Ordering::Relaxed);
                        }
                        state = self.not_full.wait(state).expect("queue lock");
                    }
                }
            }
            if let Some(since) = blocked_since {
                self.blocked_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        if state.closed {
            return false;
        }
        state.items.push_back(item);
        self.not_empty.notify_one();
        true
    }

    /// The next item, waiting for one; `None` once closed and drained.
    pub fn pop(&self) -> Option<T> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if let Some(item) = state.items.pop_front() {
                self.not_full.notify_one();
                return Some(item);
            }
            if state.closed {
                return None;
            }
            state = self.not_empty.wait(state).expect("queue lock");
        }
    }

    /// The next item, waiting for one until `deadline` at most.
    pub fn pop_until(&self, deadline: Instant) -> Popped<T> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if let Some(item) = state.items.pop_front() {
                self.not_full.notify_one();
                return Popped::Item(item);
            }
            if state.closed {
                return Popped::Closed;
            }
            let now = Instant::now();
            if now >= deadline {
                return Popped::TimedOut;
            }
            state = self.not_empty.wait_timeout(state, deadline - now).expect("queue lock").0;
        }
    }

    /// No more items will be accepted; the consumer drains what is queued.
    pub fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// How many pushes waited for room.
    pub fn waited(&self) -> u64 {
        self.waited.load(Ordering::Relaxed)
    }

    /// How long pushes waited for room, in all.
    pub fn blocked(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.blocked_ns.load(Ordering::Relaxed))
    }

    pub fn len(&self) -> usize {
        self.state.lock().expect("queue lock").items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Item(u32, bool);

    impl QueueItem for Item {
        fn droppable(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn drop_oldest_keeps_the_newest_and_counts() {
        let q = BoundedQueue::new(2, OnFull::DropOldest);
        for i in 0..5 {
            assert!(q.push(Item(i, true)));
        }
        assert_eq!(q.dropped(), 3);
        assert_eq!(q.pop(), Some(Item(3, true)));
        assert_eq!(q.pop(), Some(Item(4, true)));
    }

    #[test]
    fn undroppable_items_survive_and_are_never_evicted() {
        let q = BoundedQueue::new(1, OnFull::DropOldest);
        q.push(Item(0, false));
        q.push(Item(1, true)); // full of undroppables: accepted past capacity
        q.push(Item(2, true)); // evicts item 1, never item 0
        q.push(Item(3, false)); // undroppable: always accepted
        assert_eq!(q.dropped(), 1);
        assert_eq!(q.pop(), Some(Item(0, false)));
        assert_eq!(q.pop(), Some(Item(2, true)));
        assert_eq!(q.pop(), Some(Item(3, false)));
    }

    #[test]
    fn pop_until_returns_items_first_then_times_out_then_reports_closed() {
        let q = BoundedQueue::new(4, OnFull::DropOldest);
        q.push(Item(0, true));
        let past = Instant::now();
        // An item waiting is handed over even when the deadline has passed.
        assert_eq!(q.pop_until(past), Popped::Item(Item(0, true)));
        assert_eq!(q.pop_until(past), Popped::TimedOut);
        q.push(Item(1, false));
        q.close();
        assert_eq!(q.pop_until(past), Popped::Item(Item(1, false)));
        // Closed is reported at once, without waiting for a deadline far away.
        assert_eq!(q.pop_until(Instant::now() + std::time::Duration::from_secs(3600)), Popped::Closed);
    }

    #[test]
    fn block_waits_for_room_and_close_drains() {
        let q = std::sync::Arc::new(BoundedQueue::new(1, OnFull::Block));
        q.push(Item(0, true));
        let (done, pushed) = std::sync::mpsc::channel();
        let producer = {
            let q = q.clone();
            std::thread::spawn(move || {
                let accepted = q.push(Item(1, true));
                done.send(()).unwrap();
                accepted
            })
        };
        // The push must wait: either it is seen waiting, or it returned while
        // the queue was full (a queue that does not block).
        while q.waited() == 0 {
            assert!(pushed.try_recv().is_err(), "push returned while the queue was full: {} item(s)", q.len());
            std::thread::yield_now();
        }
        assert!(pushed.try_recv().is_err(), "push returned before there was room");
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(), Some(Item(0, true)));
        pushed.recv().unwrap();
        assert!(producer.join().unwrap());
        q.close();
        assert_eq!(q.pop(), Some(Item(1, true)));
        assert_eq!(q.pop(), None);
        assert_eq!((q.dropped(), q.waited()), (0, 1));
        assert!(!q.push(Item(2, true)));
    }
}

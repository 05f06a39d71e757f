//! Admission of pool calls: at most `concurrency` run at once, at most `queue` wait; beyond
//! that the server answers 503 at once, so the gateway can retry or report busy.
//!
//! A pool is shared by every caller of its tool, so its queue is fair between them:
//! - a free slot goes to the callers with waiting calls in turn (round robin), and within one
//!   caller's calls to the oldest: a caller's call waits for about one call per other waiting
//!   caller, not for everything queued before it;
//! - a full queue does not shut the others out: a call of a caller with fewer waiting calls
//!   than the caller with the most takes the place of that caller's newest waiting call, which
//!   is refused as busy (as it would have been had it come last). A caller's own calls never
//!   push each other out.
//!
//! Callers are told apart by their [`OwnerKey`] (the owner the gateway signed into the call's
//! token; the function never sees it).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use toolyard_api::OwnerKey;

/// Bounded concurrency plus a bounded queue, fair between callers.
#[derive(Debug)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    concurrency: usize,
    queue: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// Each caller's waiting calls, oldest first (no empty entry).
    queues: HashMap<OwnerKey, VecDeque<Waiter>>,
    /// The callers with waiting calls, in the order their turns come.
    turns: VecDeque<OwnerKey>,
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// `true`: a slot is the waiter's; `false`: pushed out of the queue.
    decision: oneshot::Sender<bool>,
}

/// Why a call got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// Every slot and the queue were taken when it came (and it could push no one out).
    Full,
    /// It waited, and gave its place to a call of a caller with fewer waiting calls (its own
    /// caller had the most waiting).
    PushedOut,
}

/// How many calls are running and waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    /// Calls holding a slot.
    pub running: usize,
    /// Calls waiting for one.
    pub waiting: usize,
}

/// Held while a call runs; frees its slot (for the next caller's turn) when dropped.
#[derive(Debug)]
pub struct Admitted {
    inner: Arc<Inner>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.inner.release();
    }
}

impl Admission {
    /// `concurrency` running calls (at least 1) and `queue` waiting ones.
    pub fn new(concurrency: usize, queue: usize) -> Self {
        let inner = Inner { concurrency: concurrency.max(1), queue, state: Mutex::default() };
        Self { inner: Arc::new(inner) }
    }

    /// Waits for a slot for a call of `caller`; denied when it has no place in the queue (at
    /// once) or loses it to another caller's call (see the module docs). Dropping the future
    /// gives its place back.
    pub async fn admit(&self, caller: &OwnerKey) -> Result<Admitted, Denied> {
        let (id, decision) = {
            let mut state = self.inner.lock();
            if state.running < self.inner.concurrency && state.queues.is_empty() {
                state.running += 1;
                return Ok(Admitted { inner: Arc::clone(&self.inner) });
            }
            if state.waiting() >= self.inner.queue && !state.push_out_for(caller) {
                return Err(Denied::Full);
            }
            state.enqueue(caller)
        };
        let mut place = Place { inner: &self.inner, caller, id, decision, over: false };
        let granted = (&mut place.decision).await.unwrap_or(false);
        place.over = true;
        if granted { Ok(Admitted { inner: Arc::clone(&self.inner) }) } else { Err(Denied::PushedOut) }
    }

    /// The calls running and waiting now.
    pub fn load(&self) -> Load {
        let state = self.inner.lock();
        Load { running: state.running, waiting: state.waiting() }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self) {
        let mut state = self.lock();
        state.running -= 1;
        state.grant(self.concurrency);
    }
}

impl State {
    fn enqueue(&mut self, caller: &OwnerKey) -> (u64, oneshot::Receiver<bool>) {
        let (decision, receiver) = oneshot::channel();
        let id = self.next_id;
        self.next_id += 1;
        let queue = self.queues.entry(caller.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(caller.clone());
        }
        queue.push_back(Waiter { id, decision });
        (id, receiver)
    }

    fn waiting(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    /// Frees a place in the full queue for `caller`: refuses the newest waiting call of the
    /// caller with the most, when that is at least two more than `caller` has waiting.
    fn push_out_for(&mut self, caller: &OwnerKey) -> bool {
        let mine = self.queues.get(caller).map_or(0, VecDeque::len);
        let Some((heaviest, most)) = self.queues.iter().map(|(k, q)| (k, q.len())).max_by_key(|(_, n)| *n) else {
            return false;
        };
        if most < mine + 2 {
            return false;
        }
        let heaviest = heaviest.clone();
        if let Some(pushed) = self.remove(&heaviest, VecDeque::pop_back) {
            // A waiter whose future is gone needs no telling.
            let _ = pushed.decision.send(false);
        }
        true
    }

    /// Gives free slots to the waiting calls whose turn it is; a caller with more waiting
    /// calls goes to the back of the turns.
    fn grant(&mut self, concurrency: usize) {
        while self.running < concurrency {
            let Some(caller) = self.turns.front().cloned() else { return };
            let Some(waiter) = self.remove(&caller, VecDeque::pop_front) else { return };
            if self.queues.contains_key(&caller) {
                self.turns.rotate_left(1);
            }
            self.running += 1;
            if waiter.decision.send(true).is_err() {
                self.running -= 1;
            }
        }
    }

    /// Takes one waiting call of `caller` (`take` picks which); a caller left with none loses
    /// its turn.
    fn remove(
        &mut self,
        caller: &OwnerKey,
        take: impl FnOnce(&mut VecDeque<Waiter>) -> Option<Waiter>,
    ) -> Option<Waiter> {
        let queue = self.queues.get_mut(caller)?;
        let waiter = take(queue)?;
        if queue.is_empty() {
            self.queues.remove(caller);
            self.turns.retain(|c| c != caller);
        }
        Some(waiter)
    }
}

/// A waiting call's place in the queue, given back if its future is dropped before the wait
/// is over.
struct Place<'a> {
    inner: &'a Inner,
    caller: &'a OwnerKey,
    id: u64,
    decision: oneshot::Receiver<bool>,
    over: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        let mut state = self.inner.lock();
        let id = self.id;
        if state.remove(self.caller, |q| q.iter().position(|w| w.id == id).and_then(|at| q.remove(at))).is_some() {
            return;
        }
        // Granted a slot it will not use: the slot goes to the next turn.
        if self.decision.try_recv() == Ok(true) {
            state.running -= 1;
            state.grant(self.inner.concurrency);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use toolyard_api::Owner;

    use super::*;

    type Order = Arc<Mutex<Vec<&'static str>>>;

    fn key(user: &str) -> OwnerKey {
        Owner { issuer: "local".into(), user: user.into(), groups: vec![] }.key()
    }

    fn enqueued(admission: &Admission) -> u64 {
        admission.inner.lock().next_id
    }

    /// Starts a call of `user` that records `label` in `order` when it gets a slot (and gives
    /// the slot back at once); returns once the call waits in the queue or is refused.
    async fn queue_up(
        admission: &Arc<Admission>,
        user: &str,
        label: &'static str,
        order: &Order,
    ) -> tokio::task::JoinHandle<Result<(), Denied>> {
        let before = enqueued(admission);
        let task = tokio::spawn({
            let (admission, order, caller) = (Arc::clone(admission), Arc::clone(order), key(user));
            async move {
                let admitted = admission.admit(&caller).await?;
                order.lock().unwrap().push(label);
                drop(admitted);
                Ok(())
            }
        });
        while enqueued(admission) == before && !task.is_finished() {
            tokio::task::yield_now().await;
        }
        task
    }

    #[tokio::test]
    async fn beyond_concurrency_plus_queue_is_refused_and_places_come_back() {
        let admission = Arc::new(Admission::new(1, 1));
        let alice = key("alice");
        let first = admission.admit(&alice).await.expect("runs");
        let waiting = queue_up(&admission, "alice", "second", &Order::default()).await;
        assert_eq!(admission.admit(&alice).await.err(), Some(Denied::Full), "a third call is refused");
        drop(first);
        assert_eq!(waiting.await.unwrap(), Ok(()), "the queued call runs once the first ends");
        assert!(admission.admit(&alice).await.is_ok(), "places are given back");
        assert_eq!(admission.load(), Load { running: 0, waiting: 0 });
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_back() {
        let (admission, alice) = (Admission::new(1, 1), key("alice"));
        let running = admission.admit(&alice).await.unwrap();
        let waiter = admission.admit(&alice);
        assert!(tokio::time::timeout(Duration::from_millis(10), waiter).await.is_err());
        assert_eq!(admission.load(), Load { running: 1, waiting: 0 });
        drop(running);
        assert_eq!(admission.load(), Load { running: 0, waiting: 0 });
    }

    #[tokio::test]
    async fn slots_go_to_the_waiting_callers_in_turn() {
        let admission = Arc::new(Admission::new(1, 8));
        let running = admission.admit(&key("alice")).await.unwrap();
        let order = Order::default();
        let mut calls = Vec::new();
        for (user, label) in
            [("alice", "a1"), ("alice", "a2"), ("alice", "a3"), ("bob", "b1"), ("bob", "b2"), ("carol", "c1")]
        {
            calls.push(queue_up(&admission, user, label, &order).await);
        }
        drop(running);
        for call in calls {
            assert_eq!(call.await.unwrap(), Ok(()));
        }
        assert_eq!(*order.lock().unwrap(), ["a1", "b1", "c1", "a2", "b2", "a3"]);
    }

    #[tokio::test]
    async fn a_full_queue_makes_room_for_a_caller_with_fewer_waiting() {
        let admission = Arc::new(Admission::new(1, 3));
        let running = admission.admit(&key("alice")).await.unwrap();
        let order = Order::default();
        let a1 = queue_up(&admission, "alice", "a1", &order).await;
        let a2 = queue_up(&admission, "alice", "a2", &order).await;
        let a3 = queue_up(&admission, "alice", "a3", &order).await;
        let refused = admission.admit(&key("alice")).await.err();
        assert_eq!(refused, Some(Denied::Full), "alice's own calls do not push each other out");
        let b1 = queue_up(&admission, "bob", "b1", &order).await;
        assert_eq!(a3.await.unwrap(), Err(Denied::PushedOut), "alice's newest waiting call gave its place to bob's");
        let c1 = queue_up(&admission, "carol", "c1", &order).await;
        assert_eq!(a2.await.unwrap(), Err(Denied::PushedOut), "and her next newest to carol's");
        assert_eq!(admission.load(), Load { running: 1, waiting: 3 });
        let refused = admission.admit(&key("bob")).await.err();
        assert_eq!(refused, Some(Denied::Full), "one waiting call each: bob's second is refused");
        drop(running);
        for call in [a1, b1, c1] {
            assert_eq!(call.await.unwrap(), Ok(()));
        }
        assert_eq!(*order.lock().unwrap(), ["a1", "b1", "c1"]);
    }

    #[tokio::test]
    async fn a_slot_granted_to_a_dropped_waiter_goes_to_the_next() {
        let admission = Arc::new(Admission::new(1, 4));
        let alice = key("alice");
        let running = admission.admit(&alice).await.unwrap();
        let mut first = Box::pin(admission.admit(&alice));
        assert!(tokio::time::timeout(Duration::from_millis(10), &mut first).await.is_err(), "waits");
        let order = Order::default();
        let second = queue_up(&admission, "bob", "b1", &order).await;
        // The slot goes to alice's waiting call, whose future is then dropped unpolled.
        drop(running);
        drop(first);
        assert_eq!(second.await.unwrap(), Ok(()), "the slot went on to bob's call");
        assert_eq!(admission.load(), Load { running: 0, waiting: 0 });
    }
}

//! A one-tick clock for hyper's HTTP/1 header-read deadline.
//!
//! hyper arms that deadline for every request on a keep-alive connection: as soon as an answer
//! is written it starts a new sleep for the next request's headers, and drops it when they
//! arrive, usually within microseconds. With tokio's timer each of those sleeps takes the
//! time driver's lock twice, and since it is usually the earliest timer, registering it also
//! wakes the thread parked on the driver (a system call and a context switch per request).
//!
//! [`CoarseTimer`] keeps the sleeps in a slab instead and wakes the expired ones from one
//! task that ticks once per `tick`. A sleep that ends before its deadline, as almost all do,
//! costs a slot taken and given back under an uncontended lock. A deadline fires up to one
//! tick late, which is what a slow-client limit measured in seconds can afford.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

/// The default tick: deadlines fire at most this much late.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);

/// A [`hyper::rt::Timer`] whose sleeps are woken by one ticking task (see the module docs).
/// Cheap to clone; the ticking task ends when the last clone and the last sleep are gone.
#[derive(Clone, Debug)]
pub struct CoarseTimer {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    sleeping: Mutex<Slab<Slot>>,
}

#[derive(Debug)]
struct Slot {
    deadline: Instant,
    waker: Waker,
}

impl Shared {
    fn sleeping(&self) -> MutexGuard<'_, Slab<Slot>> {
        // A panic while holding the lock leaves the slab consistent (every change is one call).
        self.sleeping.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl CoarseTimer {
    /// A timer with the default tick, ticking on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start() -> Self {
        Self::with_tick(DEFAULT_TICK)
    }

    /// A timer whose deadlines fire at most `tick` late.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn with_tick(tick: Duration) -> Self {
        let shared = Arc::new(Shared::default());
        tokio::spawn(tick_until_dropped(Arc::downgrade(&shared), tick));
        CoarseTimer { shared }
    }

    /// Sleeps waiting for their deadline (for tests and metrics).
    pub fn sleeping(&self) -> usize {
        self.shared.sleeping().len()
    }

    fn sleep_until_deadline(&self, deadline: Instant) -> CoarseSleep {
        CoarseSleep { shared: self.shared.clone(), deadline, slot: None }
    }
}

/// Wakes the sleeps whose deadline has passed, once per `tick`, while the timer lives.
async fn tick_until_dropped(shared: Weak<Shared>, tick: Duration) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due = Vec::new();
    loop {
        interval.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        let now = Instant::now();
        due.extend(shared.sleeping().iter().filter(|(_, s)| s.deadline <= now).map(|(_, s)| s.waker.clone()));
        // Woken outside the lock: a woken sleep takes it to give its slot back.
        due.drain(..).for_each(Waker::wake);
    }
}

/// One deadline of [`CoarseTimer`]. Holds a slot while it is polled and pending.
#[derive(Debug)]
pub struct CoarseSleep {
    shared: Arc<Shared>,
    deadline: Instant,
    slot: Option<usize>,
}

impl CoarseSleep {
    fn release(&mut self) {
        if let Some(key) = self.slot.take() {
            self.shared.sleeping().remove(key);
        }
    }
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            self.release();
            return Poll::Ready(());
        }
        let this = &mut *self;
        let mut sleeping = this.shared.sleeping();
        match this.slot {
            Some(key) => sleeping[key].waker.clone_from(cx.waker()),
            None => this.slot = Some(sleeping.insert(Slot { deadline: this.deadline, waker: cx.waker().clone() })),
        }
        Poll::Pending
    }
}

impl Drop for CoarseSleep {
    fn drop(&mut self) {
        self.release();
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.sleep_until_deadline(deadline))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        // Reuses the allocation when the sleep is one of ours; a pending slot is given back
        // and taken again at the next poll, with the new deadline.
        if let Some(ours) = sleep.as_mut().downcast_mut_pin::<CoarseSleep>() {
            let ours = ours.get_mut();
            ours.release();
            ours.deadline = new_deadline;
        } else {
            *sleep = self.sleep_until(new_deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[tokio::test]
    async fn a_sleep_ends_at_its_deadline_woken_by_the_tick() {
        let timer = CoarseTimer::with_tick(Duration::from_millis(10));
        let deadline = Instant::now() + Duration::from_millis(30);
        tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(deadline)).await.expect("the sleep ended");
        assert!(Instant::now() >= deadline, "ended before its deadline");
        assert_eq!(timer.sleeping(), 0, "an ended sleep gives its slot back");
    }

    #[tokio::test]
    async fn a_sleep_dropped_before_its_deadline_gives_its_slot_back() {
        let timer = CoarseTimer::with_tick(Duration::from_secs(3600));
        let mut sleeps: Vec<_> = (0..3).map(|_| timer.sleep(Duration::from_secs(60))).collect();
        for sleep in &mut sleeps {
            assert!(futures::poll!(sleep.as_mut()).is_pending());
        }
        assert_eq!(timer.sleeping(), 3);
        sleeps.truncate(1);
        assert_eq!(timer.sleeping(), 1);
        // Reset moves the deadline: past it, the sleep is ready and holds no slot.
        timer.reset(&mut sleeps[0], Instant::now());
        assert_eq!(timer.sleeping(), 0);
        assert!(futures::poll!(sleeps[0].as_mut()).is_ready());
        assert_eq!(timer.sleeping(), 0);
    }
}

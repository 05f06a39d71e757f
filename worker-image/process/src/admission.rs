//! Admission of pool calls: at most `concurrency` run at once, at most `queue` wait; beyond
//! that the server answers 503 at once, so the gateway can retry or report busy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bounded concurrency plus a bounded queue.
#[derive(Debug)]
pub struct Admission {
    running: Arc<Semaphore>,
    admitted: Arc<AtomicUsize>,
    capacity: usize,
}

/// Held while a call runs; frees its place when dropped.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    admitted: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// `concurrency` running calls and `queue` waiting ones.
    pub fn new(concurrency: usize, queue: usize) -> Self {
        Self { running: Arc::new(Semaphore::new(concurrency)), admitted: Arc::default(), capacity: concurrency + queue }
    }

    /// Waits for a free slot, or `None` at once when the queue is full.
    pub async fn admit(&self) -> Option<Admitted> {
        if self.admitted.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.admitted.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // Counted from here on: dropping this future gives the place back.
        struct Undo<'a>(Option<&'a AtomicUsize>);
        impl Drop for Undo<'_> {
            fn drop(&mut self) {
                if let Some(a) = self.0 {
                    a.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        let mut undo = Undo(Some(&self.admitted));
        let permit = Arc::clone(&self.running).acquire_owned().await.ok()?;
        undo.0 = None;
        Some(Admitted { _permit: permit, admitted: Arc::clone(&self.admitted) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn beyond_concurrency_plus_queue_is_refused_and_places_come_back() {
        let admission = Arc::new(Admission::new(1, 1));
        let first = admission.admit().await.expect("runs");
        let waiting = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.admit().await.is_some() }
        });
        // Let the second call queue up.
        while admission.admitted.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        assert!(admission.admit().await.is_none(), "a third call is refused");
        drop(first);
        assert!(waiting.await.unwrap(), "the queued call runs once the first ends");
        assert!(admission.admit().await.is_some(), "places are given back");
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_back() {
        let admission = Admission::new(1, 1);
        let _running = admission.admit().await.unwrap();
        let waiter = admission.admit();
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), waiter).await.is_err());
        assert_eq!(admission.admitted.load(Ordering::Acquire), 1);
    }
}

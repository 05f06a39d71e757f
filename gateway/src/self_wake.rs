//! [`RepollSelfWakes`]: a future adapter that polls its future once more, at once, when the
//! future wakes its own task while being polled, instead of leaving that wake to the scheduler.
//!
//! Why the gateway needs it: when a handler takes the chunk of a request body, hyper's HTTP/1
//! body channel wakes the waker its sender last registered, even when the sender is already
//! gone (the whole body was read). That waker is the connection task's own, and the wake comes
//! while the task is running. tokio reschedules a task woken during its own poll as a yield,
//! and a yield wakes an idle worker thread: two `futex` calls and a spurious poll on another
//! thread for every request with a body. Wrapped in this adapter, the connection future sees
//! the wake as a flag and is polled again in the same task poll, where it finds nothing to do.
//!
//! Only one extra poll is made per task poll: a future that wakes itself on purpose to yield
//! (hyper after a long run of work, tokio's cooperative budget) still yields, as the second
//! self-wake goes to the task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// `inner`, polled once more within the same task poll when it wakes itself during a poll.
pub struct RepollSelfWakes<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

/// The waker the inner future sees.
struct Signal {
    /// Set while the inner future is being polled.
    polling: AtomicBool,
    /// Set by a wake; read after each poll of the inner future.
    woken: AtomicBool,
    /// The task's own waker, woken by wakes that come while the inner future is not polled.
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // `woken` first, then `polling`: a poll that ends after this sees `woken`; a wake that
        // sees the poll over wakes the task. Either way the wake is not lost.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> RepollSelfWakes<F> {
    /// Wraps `inner` (boxed once, here).
    pub fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&signal));
        Self { inner: Box::pin(inner), signal, waker }
    }
}

impl<F: Future> Future for RepollSelfWakes<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let signal = &this.signal;
        signal.task.register(cx.waker());
        signal.polling.store(true, Ordering::SeqCst);
        // A wake from before this poll has done its work: it is why the task runs now.
        signal.woken.store(false, Ordering::SeqCst);
        let mut inner_cx = Context::from_waker(&this.waker);
        let mut result = this.inner.as_mut().poll(&mut inner_cx);
        if result.is_pending() && signal.woken.swap(false, Ordering::SeqCst) {
            result = this.inner.as_mut().poll(&mut inner_cx);
        }
        signal.polling.store(false, Ordering::SeqCst);
        if result.is_pending() && signal.woken.swap(false, Ordering::SeqCst) {
            // Woken again during the second poll, or between its end and now: yield as the
            // future asked.
            cx.waker().wake_by_ref();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Counts the wakes of the task that polls it.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future that wakes itself during its first `self_wakes` polls and is ready at the poll
    /// after them; it records how many times it was polled.
    struct SelfWaking {
        self_wakes: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for SelfWaking {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst);
            if n < self.self_wakes {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }
    }

    /// A wrapped [`SelfWaking`], its poll count, and the counted waker of the task polling it.
    fn self_waking(self_wakes: usize) -> (RepollSelfWakes<SelfWaking>, Arc<AtomicUsize>, Arc<CountingWaker>, Waker) {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&task));
        (RepollSelfWakes::new(SelfWaking { self_wakes, polls: Arc::clone(&polls) }), polls, task, waker)
    }

    #[test]
    fn one_self_wake_is_polled_again_at_once_without_waking_the_task() {
        let (mut future, polls, task, waker) = self_waking(1);
        let result = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert!(result.is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task was not woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_task() {
        let (mut future, polls, task, waker) = self_waking(3);
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2, "one poll more, not a loop");
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the second self-wake went to the task");
        assert!(Pin::new(&mut future).poll(&mut cx).is_ready());
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_wake_after_the_poll_wakes_the_task() {
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&task));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let mut future = RepollSelfWakes::new(async move { (&mut rx).await.ok() });
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        tx.send(7).unwrap();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the wake reached the task");
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready(Some(7)));
    }

    /// Wakes from another thread racing the end of polls are never lost: every message sent
    /// is received, on a runtime whose tasks are all wrapped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_from_other_threads_are_not_lost() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(1);
        let receiver = tokio::spawn(RepollSelfWakes::new(async move {
            let mut sum = 0u64;
            while let Some(n) = rx.recv().await {
                sum += u64::from(n);
            }
            sum
        }));
        let sender = std::thread::spawn(move || {
            for n in 0..20_000u32 {
                tx.blocking_send(n).unwrap();
            }
        });
        let sum = tokio::time::timeout(Duration::from_secs(60), receiver).await.expect("no lost wake").unwrap();
        sender.join().unwrap();
        assert_eq!(sum, (0..20_000u64).sum::<u64>());
    }
}

//! Clients of two users side by side (the benches of one user flooding what another calls):
//! one OS thread and keep-alive connection per client ([`super::loadgen::Connection`]), each
//! calling either at a steady pace or in a closed loop, and every answer sorted into
//! answered, refused and failed with the latency of each.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::loadgen::{Answer, Connection, Endpoint};

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The right answer.
    Answered,
    /// Refused for a limit (busy, too many).
    Refused,
    /// Anything else: a wrong answer, another error, a broken connection.
    Failed,
}

/// The latencies of each outcome, sorted once [`join`] returns them.
#[derive(Default)]
pub struct Tally {
    pub answered: Vec<Duration>,
    pub refused: Vec<Duration>,
    pub failed: u64,
}

/// The `q` quantile of `sorted` in milliseconds (NaN when empty).
pub fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

/// [`quantile_ms`] as table text: "—" when nothing was measured.
pub fn quantile_text(sorted: &[Duration], q: f64) -> String {
    if sorted.is_empty() { "—".into() } else { format!("{:.2} ms", quantile_ms(sorted, q)) }
}

/// Runs a client thread per endpoint until `stop`. Client `c` sends `body(x)` with
/// `x = (c << 32) + n` for its `n`th call, sorts each answer with `outcome(answer, x)`, then
/// waits until `every` has passed since that call began (`None`: calls again at once). Paced
/// clients start spread evenly over the interval.
pub fn clients(
    endpoints: Vec<Endpoint>,
    every: Option<Duration>,
    stop: &Arc<AtomicBool>,
    body: impl Fn(u64) -> Vec<u8> + Send + Sync + 'static,
    outcome: impl Fn(io::Result<Answer>, u64) -> Outcome + Send + Sync + 'static,
) -> Vec<std::thread::JoinHandle<Tally>> {
    let (body, outcome) = (Arc::new(body), Arc::new(outcome));
    let count = endpoints.len();
    endpoints
        .into_iter()
        .enumerate()
        .map(|(c, endpoint)| {
            let (stop, body, outcome) = (stop.clone(), body.clone(), outcome.clone());
            std::thread::spawn(move || {
                let mut connection = Connection::new(endpoint);
                let mut tally = Tally::default();
                if let Some(every) = every {
                    std::thread::sleep(every.mul_f64(c as f64 / count as f64));
                }
                let mut x = (c as u64) << 32;
                while !stop.load(Ordering::Relaxed) {
                    x += 1;
                    let started = Instant::now();
                    let answer = connection.post(&body(x));
                    let took = started.elapsed();
                    match outcome(answer, x) {
                        Outcome::Answered => tally.answered.push(took),
                        Outcome::Refused => tally.refused.push(took),
                        Outcome::Failed => tally.failed += 1,
                    }
                    if let Some(every) = every {
                        std::thread::sleep(every.saturating_sub(started.elapsed()));
                    }
                }
                tally
            })
        })
        .collect()
}

/// The threads' tallies together, each list sorted.
pub fn join(threads: Vec<std::thread::JoinHandle<Tally>>) -> Tally {
    let mut tally = Tally::default();
    for thread in threads {
        let one = thread.join().expect("client thread");
        tally.answered.extend(one.answered);
        tally.refused.extend(one.refused);
        tally.failed += one.failed;
    }
    tally.answered.sort();
    tally.refused.sort();
    tally
}

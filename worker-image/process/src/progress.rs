//! A running function's progress reports (`toolyard.progress(fraction, message)` in Python).
//!
//! A fresh process appends one JSON object per line to the file named by
//! [`env::PROGRESS_FILE`](toolyard_api::protocol::env::PROGRESS_FILE); a reused jsonl worker
//! writes the same object, with the call's `id`, as a line of its protocol before the answer
//! ([`crate::worker`]). Both reach a [`ProgressReporter`], called once per valid report (a
//! progress file's reports once per read, the latest of them), on the task that reads them.

use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use toolyard_api::protocol::{Event, MAX_PROGRESS_EVENTS, Progress};

/// Where a waiting caller takes a run's progress: the latest report (a slow reader sees fewer,
/// never stale ones).
pub type ProgressSender = watch::Sender<Option<Progress>>;

/// Takes each of a run's progress reports, on the task that reads them (so it must not block).
#[derive(Clone)]
pub struct ProgressReporter(Arc<dyn Fn(Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressReporter")
    }
}

impl ProgressReporter {
    /// A reporter calling `take` with each report.
    pub fn new(take: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        Self(Arc::new(take))
    }

    /// A reporter passing each report on to `sender` (the latest wins).
    pub fn to_sender(sender: ProgressSender) -> Self {
        Self::new(move |progress| {
            sender.send_replace(Some(progress));
        })
    }

    /// Takes one report.
    pub fn report(&self, progress: Progress) {
        (self.0)(progress);
    }
}

/// Longest report line read; a longer one is skipped.
const MAX_REPORT_LINE: usize = 4096;
/// Bytes of the progress file read per poll (the rest waits for the next one).
const MAX_READ_PER_POLL: u64 = 64 * 1024;
/// How often the progress file is read while the function runs.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The report one line holds, if it is a valid one.
pub fn parse_line(line: &[u8]) -> Option<Progress> {
    Progress::from_report(&serde_json::from_slice::<Value>(line).ok()?)
}

/// Reads a progress file as a function appends to it.
#[derive(Debug)]
pub struct ProgressFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    partial: Vec<u8>,
    /// In a line longer than [`MAX_REPORT_LINE`]: skip to its end.
    skipping: bool,
}

impl ProgressFile {
    /// Follows `path` (which the function creates when it first reports).
    pub fn new(path: PathBuf) -> Self {
        Self { path, file: None, partial: Vec::new(), skipping: false }
    }

    /// Sends the latest valid report among the lines completed since the last read.
    pub fn read_new(&mut self, report: &ProgressReporter) {
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let Some(file) = self.file.as_mut() else { return };
        let mut chunk = Vec::new();
        if file.take(MAX_READ_PER_POLL).read_to_end(&mut chunk).is_err() {
            return;
        }
        let mut latest = None;
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let complete = piece.last() == Some(&b'\n');
            let piece = piece.strip_suffix(b"\n").unwrap_or(piece);
            if !self.skipping {
                self.partial.extend_from_slice(piece);
                if self.partial.len() > MAX_REPORT_LINE {
                    self.partial.clear();
                    self.skipping = true;
                }
            }
            if complete {
                if !self.skipping
                    && let Some(progress) = parse_line(&self.partial)
                {
                    latest = Some(progress);
                }
                self.partial.clear();
                self.skipping = false;
            }
        }
        if let Some(progress) = latest {
            report.report(progress);
        }
    }

    /// Reads the file every [`POLL_INTERVAL`] until `done` fires (or is dropped), then once
    /// more for the last lines.
    pub async fn follow(mut self, report: ProgressReporter, mut done: tokio::sync::oneshot::Receiver<()>) {
        let mut ticks = tokio::time::interval(POLL_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.read_new(&report),
                _ = &mut done => break,
            }
        }
        self.read_new(&report);
    }
}

/// The reports of one call as [`call_event::PROGRESS`](toolyard_api::protocol::call_event)
/// events, stamped when seen: the latest [`MAX_PROGRESS_EVENTS`] of them. Each report is also
/// passed on to `forward`, when given (a caller waiting for them).
#[derive(Clone)]
pub struct ProgressLog {
    events: Arc<Mutex<VecDeque<Event>>>,
    forward: Option<ProgressSender>,
}

impl std::fmt::Debug for ProgressLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressLog").finish_non_exhaustive()
    }
}

impl ProgressLog {
    /// A log that passes each report on to `forward` too.
    pub fn new(forward: Option<ProgressSender>) -> Self {
        Self { events: Arc::default(), forward }
    }

    /// The reporter that adds to this log.
    pub fn reporter(&self) -> ProgressReporter {
        let log = self.clone();
        ProgressReporter::new(move |progress: Progress| {
            let event = progress.event(jiff::Timestamp::now().to_string());
            {
                let mut events = log.events.lock().unwrap_or_else(|e| e.into_inner());
                if events.len() == MAX_PROGRESS_EVENTS {
                    events.pop_front();
                }
                events.push_back(event);
            }
            if let Some(forward) = &log.forward {
                forward.send_replace(Some(progress));
            }
        })
    }

    /// The events kept so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn the_latest_complete_valid_line_wins_and_long_lines_are_skipped() {
        let dir = crate::child::TempDir::new("progress-test").unwrap();
        let path = dir.path().join("progress.jsonl");
        let (tx, rx) = watch::channel(None);
        let tx = ProgressReporter::to_sender(tx);
        let mut reports = ProgressFile::new(path.clone());
        reports.read_new(&tx);
        assert_eq!(*rx.borrow(), None, "no file yet");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"{\"progress\":0.1}\n{\"progress\":0.2,\"message\":\"two\"}\n{\"progress\":0.3").unwrap();
        reports.read_new(&tx);
        assert_eq!(*rx.borrow(), Some(Progress { fraction: 0.2, message: Some("two".into()) }));
        f.write_all(b"}\nnot json\n").unwrap();
        reports.read_new(&tx);
        assert_eq!(rx.borrow().as_ref().map(|p| p.fraction), Some(0.3), "the latest valid line wins");
        f.write_all(b"{\"progress\":0.4}\n").unwrap();
        reports.read_new(&tx);
        assert_eq!(rx.borrow().as_ref().map(|p| p.fraction), Some(0.4), "a line split across reads counts");
        let long = format!("{{\"progress\":0.9,\"message\":\"{}\"}}\n", "x".repeat(MAX_REPORT_LINE));
        f.write_all(long.as_bytes()).unwrap();
        reports.read_new(&tx);
        assert_eq!(rx.borrow().as_ref().map(|p| p.fraction), Some(0.4), "an over-long line is skipped");
        f.write_all(b"{\"progress\":1.0}\n").unwrap();
        reports.read_new(&tx);
        assert_eq!(rx.borrow().as_ref().map(|p| p.fraction), Some(1.0));
    }

    #[test]
    fn a_log_keeps_the_latest_reports_as_events_and_forwards_them() {
        let (forward, seen) = watch::channel(None);
        let log = ProgressLog::new(Some(forward));
        let reporter = log.reporter();
        for i in 0..=MAX_PROGRESS_EVENTS {
            reporter.report(Progress { fraction: i as f64 / 100.0, message: None });
        }
        let events = log.events();
        assert_eq!(events.len(), MAX_PROGRESS_EVENTS, "the latest are kept");
        let last = Progress::of_event(events.last().unwrap()).unwrap();
        assert_eq!(last.fraction, MAX_PROGRESS_EVENTS as f64 / 100.0);
        assert_eq!(Progress::of_event(&events[0]).unwrap().fraction, 0.01, "the first one was dropped");
        assert_eq!(seen.borrow().as_ref(), Some(&last));
    }
}

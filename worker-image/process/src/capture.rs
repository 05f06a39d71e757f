//! Bounded capture of a child's output stream.
//!
//! A tool may print without limit; the runner keeps the first `Capture::limit` bytes,
//! keeps draining the pipe (so the tool never blocks on a full pipe) and notes how much it
//! dropped.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};

/// Default limit of one captured stream.
pub const DEFAULT_LOG_LIMIT: usize = 1024 * 1024;

/// Bytes kept from one stream, and how many were dropped past the limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes of the stream.
    pub bytes: Vec<u8>,
    /// Bytes read past the limit and dropped.
    pub dropped: u64,
}

impl Captured {
    /// The log as uploaded: the kept bytes, plus a last line saying how much was cut.
    pub fn into_log(self) -> Vec<u8> {
        let mut bytes = self.bytes;
        if self.dropped > 0 {
            if !bytes.ends_with(b"\n") && !bytes.is_empty() {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(
                format!("[toolyard: output truncated; {} more bytes were dropped]\n", self.dropped).as_bytes(),
            );
        }
        bytes
    }

    /// The log as text (invalid UTF-8 replaced), with the truncation note.
    pub fn into_text(self) -> String {
        String::from_utf8_lossy(&self.into_log()).into_owned()
    }

    /// The last non-empty line (for error messages of tools that wrote none), at most 512 bytes.
    pub fn last_line(&self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.bytes);
        let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
        Some(truncate_chars(line, 512))
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary, adding "..." when cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// A capture in progress, shared with the task that reads the pipe so that what was read so
/// far can be taken even if the pipe never closes (a process outside the group holds it).
#[derive(Clone, Debug)]
pub struct Capture {
    inner: Arc<Mutex<Captured>>,
    limit: usize,
}

impl Capture {
    /// An empty capture keeping at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { inner: Arc::default(), limit }
    }

    /// Reads `stream` to its end into this capture.
    pub async fn drain(&self, mut stream: impl AsyncRead + Unpin) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.push(&buf[..n]),
            }
        }
    }

    /// Appends bytes, keeping at most the limit.
    pub fn push(&self, chunk: &[u8]) {
        let mut captured = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.limit.saturating_sub(captured.bytes.len());
        let kept = room.min(chunk.len());
        captured.bytes.extend_from_slice(&chunk[..kept]);
        captured.dropped += (chunk.len() - kept) as u64;
    }

    /// Takes what was captured so far, leaving the capture empty.
    pub fn take(&self) -> Captured {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_limit_is_counted_and_noted() {
        let capture = Capture::new(10);
        capture.drain(&b"0123456789abcdef"[..]).await;
        let captured = capture.take();
        assert_eq!(captured.bytes, b"0123456789");
        assert_eq!(captured.dropped, 6);
        assert_eq!(captured.into_text(), "0123456789\n[toolyard: output truncated; 6 more bytes were dropped]\n");
        assert_eq!(capture.take(), Captured::default(), "take empties the capture");
    }

    #[test]
    fn last_line_skips_blank_lines_and_is_bounded() {
        let c = Captured { bytes: b"first\nTraceback...\nValueError: bad\n\n".to_vec(), dropped: 0 };
        assert_eq!(c.last_line().as_deref(), Some("ValueError: bad"));
        assert_eq!(Captured::default().last_line(), None);
        assert_eq!(truncate_chars(&"é".repeat(400), 10), "ééé...");
        assert_eq!(truncate_chars("short", 10), "short");
    }
}

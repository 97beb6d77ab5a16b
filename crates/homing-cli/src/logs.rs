//! Log lines leave the process through a thread of their own, so that a standard error nobody
//! reads cannot stop the work. Written where they were made, a line blocks its thread once the
//! pipe is full: a `homing worker` (one runtime thread by default) whose log went to a pipe that
//! was no longer read stopped after about 500 jobs at `HOMING_LOG=debug`, its jobs left running,
//! its heartbeats with them, and a multi-thread process stopped the same way once each of its
//! threads had logged once more. A container runtime's log driver that falls behind, or a
//! supervisor that stops reading, is such a pipe.
//!
//! Each event is formatted on its own thread as before and handed to the writer thread whole.
//! While the writer cannot keep up, up to [`QUEUED_BYTES`] of lines wait; beyond that, lines
//! are dropped and counted, and once the writer gets through, a warning says how many were
//! lost. Before the process exits the queue is written out, waiting at most [`EXIT_WAIT`] so
//! that a standard error blocked for good cannot hold up the exit either.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How many bytes of log lines may wait for the writer (about 5,000 lines of a busy worker).
const QUEUED_BYTES: usize = 1 << 20;
/// How long the exit waits for the queued lines to be written.
const EXIT_WAIT: Duration = Duration::from_secs(1);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line sent before it is written.
    Flush(mpsc::Sender<()>),
}

struct Shared {
    queued: AtomicUsize,
    dropped: AtomicU64,
}

/// The writer the log formatter is given: every event becomes one [`Msg::Line`].
#[derive(Clone)]
pub struct Sink {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Starts the writer thread over standard error and returns its sink. If the thread cannot be
/// started, the sink writes in place, as before.
pub fn start() -> Sink {
    SINK.get_or_init(|| {
        // Lines are bounded by bytes; the channel's own bound only has to be above what the
        // byte budget lets through in small lines.
        let (tx, rx) = mpsc::sync_channel(QUEUED_BYTES / 32);
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        });
        let s = shared.clone();
        let started = std::thread::Builder::new()
            .name("homing-log".into())
            .spawn(move || pump(rx, s));
        if let Err(e) = started {
            eprintln!("homing: log lines are written in place: no thread for them ({e})");
        }
        Sink { tx, shared }
    })
    .clone()
}

fn pump(rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut err = std::io::stderr();
    for msg in rx {
        match msg {
            Msg::Line(line) => {
                let _ = err.write_all(&line);
                shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
            }
            Msg::Flush(done) => {
                let _ = err.flush();
                let _ = done.send(());
            }
        }
        let lost = shared.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            // Through the formatter like any other event; it comes back to this thread's
            // queue and is counted as lost itself if the queue is still full.
            tracing::warn!(
                dropped = lost,
                "{lost} log lines were dropped: standard error was not read fast enough"
            );
        }
    }
}

/// Writes out the lines queued so far, waiting at most [`EXIT_WAIT`]. For the exits that skip
/// `main`'s return (`std::process::exit`), and for `main` itself before its last word.
pub fn flush() {
    let Some(sink) = SINK.get() else { return };
    let deadline = Instant::now() + EXIT_WAIT;
    let (done, wait) = mpsc::channel();
    let mut msg = Msg::Flush(done);
    loop {
        match sink.tx.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Disconnected(_)) => return,
            Err(TrySendError::Full(back)) => {
                if Instant::now() >= deadline {
                    return;
                }
                msg = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    let _ = wait.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// One event's bytes, handed to the writer thread when the formatter is done with it.
pub struct Line<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        let len = buf.len();
        let shared = &self.sink.shared;
        if shared.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUED_BYTES {
            shared.queued.fetch_sub(len, Ordering::Relaxed);
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.sink.tx.try_send(Msg::Line(buf)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                shared.queued.fetch_sub(len, Ordering::Relaxed);
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // No writer thread: in place, as without one.
            Err(TrySendError::Disconnected(Msg::Line(buf))) => {
                shared.queued.fetch_sub(len, Ordering::Relaxed);
                let _ = std::io::stderr().write_all(&buf);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            sink: self,
            buf: Vec::new(),
        }
    }
}

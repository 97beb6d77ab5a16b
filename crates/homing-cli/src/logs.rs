//! Log lines must not stop the work when nobody reads them. Written by the thread that logged,
//! a line blocks that thread once standard error's pipe is full: a `homing worker` (one runtime
//! thread by default) whose log went to a pipe that was no longer read stopped after about 500
//! jobs at `HOMING_LOG=debug`, its jobs left running, its heartbeats with them, and a
//! multi-thread process stopped the same way once each of its threads had logged once more. A
//! container runtime's log driver that falls behind, or a supervisor that stops reading, is such
//! a pipe.
//!
//! So a line is written where it was made only when that cannot block: nothing of this process
//! is waiting to be written, and standard error is ready for it (a file always is; a pipe or a
//! terminal when it has room). That keeps the lines in order and on their way before a crash,
//! as before. Otherwise the line goes to a writer thread of its own: up to [`QUEUED_BYTES`] of
//! lines wait for it, beyond that lines are dropped and counted, and a warning says how many
//! (at most once a second, and before the exit) once the writer gets through. Before the
//! process exits, and before a panic's message, the queue is written out, waiting at most
//! [`EXIT_WAIT`] in all, so a standard error blocked for good cannot hold up the exit either.

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How many bytes of log lines may wait for the writer thread (about 8,000 lines of a busy
/// worker at `debug`).
const QUEUED_BYTES: usize = 1 << 20;
/// How long the exit waits, in all, for the queued lines to be written.
const EXIT_WAIT: Duration = Duration::from_secs(1);
/// The longest line written in place: a pipe that polls writable has room for at least this
/// much (one page), so a write of it does not block.
const IN_PLACE_MAX: usize = 4096;
/// How often, at most, the writer warns about dropped lines.
const WARN_EVERY: Duration = Duration::from_secs(1);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line sent before it is written.
    Flush(mpsc::Sender<()>),
}

struct Shared {
    /// Bytes handed to the writer thread and not yet written.
    queued: AtomicUsize,
    dropped: AtomicU64,
    /// Taken by a thread writing in place, so that two never share the room one poll saw.
    in_place: Mutex<()>,
    /// A flush gave up waiting: standard error is blocked, later exits do not wait again.
    stuck: AtomicBool,
}

/// The writer the log formatter is given: every event is one line, written by [`Line`]'s drop.
#[derive(Clone)]
pub struct Sink {
    tx: Option<Sender<Msg>>,
    shared: Arc<Shared>,
}

static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// Set on the writer thread: its own warning is written in place, outside the budget.
    static WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Starts the writer thread over standard error and returns the sink. Without a thread every
/// line is written in place, as it was before this module.
pub fn start() -> Sink {
    SINK.get_or_init(|| {
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            in_place: Mutex::new(()),
            stuck: AtomicBool::new(false),
        });
        // Unbounded as a channel: the byte budget is the bound, and a channel with a bound
        // allocates all its slots up front.
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let started = std::thread::Builder::new()
            .name("homing-log".into())
            .spawn(move || pump(rx, s));
        let tx = match started {
            Ok(_) => Some(tx),
            Err(e) => {
                eprintln!("homing: log lines are written in place: no thread for them ({e})");
                None
            }
        };
        Sink { tx, shared }
    })
    .clone()
}

/// A panic's message comes after the lines logged before it: the queue is written out first.
pub fn flush_before_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !WRITER.with(Cell::get) {
            flush();
        }
        previous(info);
    }));
}

fn pump(rx: Receiver<Msg>, shared: Arc<Shared>) {
    WRITER.with(|w| w.set(true));
    let mut err = std::io::stderr();
    let mut warned = Instant::now();
    for msg in rx {
        let flush = match msg {
            Msg::Line(line) => {
                let _ = err.write_all(&line);
                shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
                None
            }
            Msg::Flush(done) => Some(done),
        };
        let caught_up = shared.queued.load(Ordering::Relaxed) == 0;
        if flush.is_some() || caught_up || warned.elapsed() >= WARN_EVERY {
            let lost = shared.dropped.swap(0, Ordering::Relaxed);
            if lost > 0 {
                warned = Instant::now();
                // Through the formatter like any other event, and written in place on this
                // thread (WRITER), so neither the budget nor a full queue can lose it.
                tracing::warn!(
                    dropped = lost,
                    "{lost} log lines were dropped: standard error was not read fast enough"
                );
            }
        }
        if let Some(done) = flush {
            let _ = err.flush();
            let _ = done.send(());
        }
    }
}

/// Writes out the lines queued so far, waiting at most [`EXIT_WAIT`] (once: after a flush that
/// gave up, later ones return at once). For `main`'s end, the exits that skip it
/// (`std::process::exit`), and before a panic's message.
pub fn flush() {
    let Some(sink) = SINK.get() else { return };
    let Some(tx) = &sink.tx else { return };
    if sink.shared.stuck.load(Ordering::Relaxed) {
        return;
    }
    let (done, wait) = mpsc::channel();
    if tx.send(Msg::Flush(done)).is_err() {
        return;
    }
    if wait.recv_timeout(EXIT_WAIT).is_err() {
        sink.shared.stuck.store(true, Ordering::Relaxed);
    }
}

/// Whether a flush gave up: standard error is blocked, and a direct write to it would block too.
pub fn stuck() -> bool {
    SINK.get()
        .is_some_and(|s| s.shared.stuck.load(Ordering::Relaxed))
}

/// Whether standard error can take a write now without blocking (a file always can).
#[allow(unsafe_code)]
fn ready() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDERR_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a count of one, no wait.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & libc::POLLOUT != 0
}

/// One event's bytes, written or handed on when the formatter is done with it.
pub struct Line<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl Line<'_> {
    /// Writes the line here if that cannot block; gives it back otherwise.
    fn in_place(&self, buf: Vec<u8>) -> Option<Vec<u8>> {
        let shared = &self.sink.shared;
        if WRITER.with(Cell::get) || self.sink.tx.is_none() {
            let _ = std::io::stderr().write_all(&buf);
            return None;
        }
        // Behind a line still queued this one would come out first.
        if buf.len() > IN_PLACE_MAX || shared.queued.load(Ordering::Relaxed) > 0 {
            return Some(buf);
        }
        let Ok(_one) = shared.in_place.try_lock() else {
            return Some(buf);
        };
        if shared.queued.load(Ordering::Relaxed) > 0 || !ready() {
            return Some(buf);
        }
        let _ = std::io::stderr().write_all(&buf);
        None
    }
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
        let Some(buf) = self.in_place(buf) else {
            return;
        };
        let (Some(tx), shared) = (&self.sink.tx, &self.sink.shared) else {
            return;
        };
        let len = buf.len();
        if shared.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUED_BYTES {
            shared.queued.fetch_sub(len, Ordering::Relaxed);
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if tx.send(Msg::Line(buf)).is_err() {
            shared.queued.fetch_sub(len, Ordering::Relaxed);
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

//! Log lines must not stop the work when nobody reads them. Written by the thread that logged,
//! a line blocks that thread once standard error's pipe is full: a `homing worker` (one runtime
//! thread by default) whose log went to a pipe that was no longer read stopped after about 500
//! jobs at `HOMING_LOG=debug`, its jobs left running, its heartbeats with them, and a
//! multi-thread process stopped the same way once each of its threads had logged once more. A
//! container runtime's log driver that falls behind, or a supervisor that stops reading, is such
//! a pipe.
//!
//! So a line is written where it was made only in a way that cannot block: to a pipe or a
//! terminal through a non-blocking descriptor of this process's own (opened anew, so the
//! descriptor other processes share stays as it is), to a socket with a send that does not wait,
//! to a file as before (a file does not fill up). That keeps the lines in order and on their way
//! before a crash, as before. What cannot be written at once goes to a writer thread of its own:
//! up to [`QUEUED_BYTES`] of lines wait for it, beyond that lines are dropped and counted, and a
//! warning says how many (at most once a second, and before the exit) once the writer gets
//! through. While lines wait, later ones queue behind them, and the rest of a line that was only
//! partly written in place follows it before anything else (outside the budget, so no line is
//! cut). A panic's message, and a command's notes and errors to the user, take the same path.
//! Before the process exits the queue is written out, waiting at most [`EXIT_WAIT`], so a
//! standard error blocked for good cannot hold up the exit either.

use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How many bytes of log lines may wait for the writer thread (about 8,000 lines of a busy
/// worker at `debug`).
const QUEUED_BYTES: usize = 1 << 20;
/// How long an exit waits for the queued lines to be written.
const EXIT_WAIT: Duration = Duration::from_secs(1);
/// How often, at most, the writer warns about dropped lines.
const WARN_EVERY: Duration = Duration::from_secs(1);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line sent before it is written.
    Flush(mpsc::Sender<()>),
}

/// How a line is written where it was made.
enum Direct {
    /// A pipe or a terminal, opened anew without blocking.
    Fd(File),
    /// A socket (a journal's stream): `send` with `MSG_DONTWAIT`.
    Socket,
    /// A file, or anything else: written as before.
    Blocking,
    /// A pipe or terminal that could not be opened anew: every line goes to the writer thread.
    Never,
}

struct Shared {
    direct: Direct,
    /// Bytes handed to the writer thread and not yet written. A thread writes in place only
    /// while it is 0, so its lines never overtake its own queued ones.
    queued: AtomicUsize,
    dropped: AtomicU64,
    /// Held by whoever writes to standard error: a thread writing in place (which only tries
    /// it, and queues when it is taken), and the writer thread for each line and its warning,
    /// so the parts of one line never have another between them.
    in_place: Mutex<()>,
    /// The last flush gave up waiting: standard error is blocked, and exits do not wait again
    /// until the writer gets through.
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
    /// Set on the writer thread, which writes in place (it is the thread meant to wait).
    static WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Starts the writer thread over standard error and returns the sink. Without a thread every
/// line is written in place, as it was before this module.
pub fn start() -> Sink {
    SINK.get_or_init(|| {
        let shared = Arc::new(Shared {
            direct: direct(),
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

/// What standard error is, and so how to write to it without waiting.
#[allow(unsafe_code)]
fn direct() -> Direct {
    // SAFETY: fstat on a descriptor number with a zeroed, properly sized buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(libc::STDERR_FILENO, &mut st) } != 0 {
        return Direct::Blocking;
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO | libc::S_IFCHR => {
            use std::os::unix::fs::OpenOptionsExt;
            // A new open file description of the same pipe or terminal: O_NONBLOCK set on it
            // is this process's alone (setting it on descriptor 2 would change it for every
            // process that shares the pipe or terminal). O_NOCTTY: opening a terminal must not
            // make it the controlling one of a process that has none.
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                .open("/proc/self/fd/2")
            {
                Ok(f) => Direct::Fd(f),
                Err(_) => Direct::Never,
            }
        }
        libc::S_IFSOCK => Direct::Socket,
        _ => Direct::Blocking,
    }
}

/// A panic's message goes the way of the log lines: in place when that cannot block, else
/// behind the lines logged before it. (The standard hook writes to standard error and waits,
/// which would stop a worker whose stderr is not read at its first panicking job.)
pub fn route_panics() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let what = info.payload_as_str().unwrap_or("Box<dyn Any>");
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        let mut text = format!("thread '{name}' panicked at {at}:\n{what}\n");
        // RUST_BACKTRACE as the standard hook reads it (RUST_LIB_BACKTRACE is for errors).
        match std::env::var("RUST_BACKTRACE").as_deref() {
            Ok("0") | Err(_) => {}
            Ok(v) => {
                let trace = std::backtrace::Backtrace::force_capture();
                if v == "full" {
                    text.push_str(&format!("stack backtrace:\n{trace:#}\n"));
                } else {
                    text.push_str(&format!("stack backtrace:\n{trace}\n"));
                }
            }
        }
        write_line(text.into_bytes());
    }));
}

/// A line for the user on standard error (a note, a command's error), written as the log lines
/// are, and so in order with them and never waiting on a full pipe.
pub fn say(msg: std::fmt::Arguments<'_>) {
    write_line(format!("{msg}\n").into_bytes());
}

/// Writes one line (its bytes, newline included) as the log lines are written.
fn write_line(line: Vec<u8>) {
    match SINK.get() {
        Some(sink) => {
            let mut l = sink.make_writer();
            l.buf = line;
        }
        None => {
            let _ = std::io::stderr().write_all(&line);
        }
    }
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pump(rx: Receiver<Msg>, shared: Arc<Shared>) {
    WRITER.with(|w| w.set(true));
    let mut err = std::io::stderr();
    let mut warned = Instant::now();
    for msg in rx {
        let flush = match msg {
            Msg::Line(line) => {
                // Held while it writes, so that a write in place never lands between two calls
                // of a write this thread has begun.
                let _one = lock(&shared.in_place);
                let _ = err.write_all(&line);
                shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
                None
            }
            Msg::Flush(done) => Some(done),
        };
        let caught_up = shared.queued.load(Ordering::Relaxed) == 0;
        if caught_up {
            shared.stuck.store(false, Ordering::Relaxed);
        }
        if flush.is_some() || caught_up || warned.elapsed() >= WARN_EVERY {
            let lost = shared.dropped.swap(0, Ordering::Relaxed);
            if lost > 0 {
                warned = Instant::now();
                // Written by this thread as it formats it (WRITER), outside the budget, and
                // holding the lock a thread writing in place takes, so the two never mix.
                let _one = lock(&shared.in_place);
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

/// Writes out the lines queued so far, waiting at most [`EXIT_WAIT`] (none while an earlier
/// flush's wait is still unanswered). For `main`'s end and the exits that skip it
/// (`std::process::exit`).
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

impl Direct {
    /// Writes what it can of `buf` without waiting; returns how many bytes are done with
    /// (written, or refused for good: a closed pipe loses the line, as a write in place did).
    #[allow(unsafe_code)]
    fn write(&self, buf: &[u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let rest = &buf[done..];
            let wrote = match self {
                Direct::Fd(f) => {
                    let mut f: &File = f;
                    f.write(rest)
                }
                Direct::Socket => {
                    // SAFETY: a valid buffer and its length; the flags make it not wait and
                    // not raise SIGPIPE.
                    let n = unsafe {
                        libc::send(
                            libc::STDERR_FILENO,
                            rest.as_ptr().cast(),
                            rest.len(),
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        )
                    };
                    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
                }
                Direct::Blocking => {
                    let _ = std::io::stderr().write_all(rest);
                    return buf.len();
                }
                Direct::Never => return done,
            };
            match wrote {
                Ok(0) => return buf.len(),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return done,
                Err(_) => return buf.len(),
            }
        }
        done
    }
}

/// One event's bytes, written or handed on when the formatter is done with it.
pub struct Line<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl Line<'_> {
    /// Hands bytes to the writer thread. A whole line counts against the budget; the tail of a
    /// line already begun in place does not (dropping it would leave half a line, and the next
    /// glued to it).
    fn queue(&self, buf: Vec<u8>, whole: bool) {
        let (Some(tx), shared) = (&self.sink.tx, &self.sink.shared) else {
            return;
        };
        let len = buf.len();
        // Counted before the bytes leave `queued`: a writer that sees the queue empty then
        // also sees the count, and warns.
        if shared.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUED_BYTES && whole {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            shared.queued.fetch_sub(len, Ordering::Relaxed);
            return;
        }
        if tx.send(Msg::Line(buf)).is_err() {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            shared.queued.fetch_sub(len, Ordering::Relaxed);
        }
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
        let shared = &self.sink.shared;
        if WRITER.with(Cell::get) || self.sink.tx.is_none() {
            let _ = std::io::stderr().write_all(&buf);
            return;
        }
        // In place only behind nothing: a line still queued would come out after this one.
        if shared.queued.load(Ordering::Relaxed) == 0 {
            let one = match shared.in_place.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            if let Some(_one) = one {
                if shared.queued.load(Ordering::Relaxed) == 0 {
                    let n = shared.direct.write(&buf);
                    if n < buf.len() {
                        // Queued before the lock is released, so nothing comes between the
                        // part written and the rest.
                        self.queue(buf[n..].to_vec(), n == 0);
                    }
                    return;
                }
            }
        }
        self.queue(buf, true);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    /// A pipe (read end, non-blocking write end), as a reopened stderr would be.
    #[allow(unsafe_code)]
    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors, which are then owned by the Files.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (r, w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(fds[1], libc::F_GETFL) };
        assert_eq!(
            unsafe { libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK) },
            0
        );
        (r, w)
    }

    /// A full pipe takes what fits and then nothing, without waiting; once read, it takes a
    /// line whole again. (Blocking, this test would never end.)
    #[test]
    fn a_full_pipe_takes_what_fits_and_no_more() {
        let (mut r, w) = pipe();
        let direct = Direct::Fd(w);
        let big = vec![b'x'; 1 << 20];
        let n = direct.write(&big);
        assert!(n > 0 && n < big.len(), "{n} of {} bytes", big.len());
        assert_eq!(direct.write(b"one more line\n"), 0);
        let mut got = vec![0; n];
        r.read_exact(&mut got).unwrap();
        assert_eq!(direct.write(b"one more line\n"), 14);
    }
}

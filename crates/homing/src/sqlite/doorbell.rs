//! Doorbells for the embedded file: SQLite cannot block a reader until another process writes,
//! so a worker in another process would only see a new message at its next poll. Each process
//! that waits for messages binds a unix datagram socket in a directory next to the database file
//! (`<file>.doorbell/`); a process that has just committed a publish sends every socket there one
//! byte. A ring is a hint, never a message: one that is lost (a directory that cannot be created,
//! a path too long for a socket, a process frozen with its socket full) costs only the poll
//! interval the reservation keeps anyway, so correctness never depends on it (docs/fastpath.md).
//!
//! Two things keep a ring from being lost in the ordinary case:
//! - One thread per process and file reads the socket as soon as a byte arrives and wakes every
//!   waiter of the process through the same `Notify` an in-process publish uses. Waiters that
//!   read the socket themselves took the byte from each other (one ring woke one waiter), and a
//!   process busy running jobs left rings unread until its socket's queue was full.
//! - A datagram waiting in a receiver's queue is charged to the sending socket until it is read,
//!   so one process that does not read (frozen, stopped in a debugger) can use up the sender's
//!   buffer and make every later send fail with `EAGAIN`, to everyone. A send that fails so is
//!   retried once per ring from a fresh socket, whose buffer is empty.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

/// One process's doorbell for one database file.
pub(crate) struct Doorbell {
    dir: PathBuf,
    /// Woken for every ring from another process: the database's in-process `Notify`.
    wake: Arc<Notify>,
    /// This process's own socket and the thread reading it, made on the first wait; `None` when
    /// it could not be made, and then waiting falls back to polling.
    own: OnceLock<Option<Listener>>,
    /// An unbound socket to ring others with, made on the first ring.
    sender: Mutex<Option<UnixDatagram>>,
}

struct Listener {
    path: PathBuf,
    sock: Arc<UnixDatagram>,
    stop: Arc<AtomicBool>,
}

impl Doorbell {
    pub(crate) fn new(db: &Path, wake: Arc<Notify>) -> Self {
        let mut dir = db.as_os_str().to_owned();
        dir.push(".doorbell");
        Self {
            dir: PathBuf::from(dir),
            wake,
            own: OnceLock::new(),
            sender: Mutex::new(None),
        }
    }

    /// Rings every other process waiting on this file. Called after a commit that made
    /// messages ready; costs a directory listing and one datagram per waiting process.
    pub(crate) fn ring(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return; // nobody has ever waited on this file
        };
        let own = self.own.get().and_then(|o| o.as_ref()).map(|l| &l.path);
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let mut fresh = false;
        for entry in entries.flatten() {
            let path = entry.path();
            if Some(&path) == own {
                continue; // this process wakes its own waiters without a datagram
            }
            for attempt in 0..2 {
                if sender.is_none() {
                    match unbound() {
                        Ok(s) => *sender = Some(s),
                        Err(_) => return,
                    }
                }
                let Some(sock) = sender.as_ref() else { return };
                match sock.send_to(b"!", &path) {
                    // Nobody bound to it: its process is gone (killed, say). Whoever finds it
                    // first removes it; removing it twice is harmless.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        let _ = std::fs::remove_file(&path);
                    }
                    // Either this receiver's queue is full (it has rings to read already) or
                    // this socket's buffer is used up by datagrams a frozen receiver never read.
                    // The second would silence every later ring: try once from a fresh socket.
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock && attempt == 0 && !fresh =>
                    {
                        fresh = true;
                        *sender = None;
                        continue;
                    }
                    // Anything else costs the receiver a poll.
                    _ => {}
                }
                break;
            }
        }
    }

    /// Makes sure this process listens for rings from others (binding its socket and starting
    /// its reader on the first call): a ring then wakes the `Notify` given to [`Doorbell::new`].
    /// False when it cannot listen; the caller's poll then does the work.
    pub(crate) fn listen(&self) -> bool {
        self.own.get_or_init(|| self.bind()).is_some()
    }

    fn bind(&self) -> Option<Listener> {
        let path = self
            .dir
            .join(format!("{}-{:08x}", std::process::id(), fastrand::u32(..)));
        let bound = std::fs::create_dir_all(&self.dir)
            .and_then(|_| UnixDatagram::bind(&path))
            .and_then(|s| {
                let sock = Arc::new(s);
                let stop = Arc::new(AtomicBool::new(false));
                let (reader, stopped, wake) = (sock.clone(), stop.clone(), self.wake.clone());
                std::thread::Builder::new()
                    .name("homing-doorbell".into())
                    .spawn(move || read_rings(&reader, &stopped, &wake))?;
                Ok((sock, stop))
            });
        match bound {
            Ok((sock, stop)) => Some(Listener { path, sock, stop }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                tracing::debug!(dir = %self.dir.display(), error = %e, "no doorbell for this database file; waiting by polling");
                None
            }
        }
    }
}

fn unbound() -> std::io::Result<UnixDatagram> {
    let s = UnixDatagram::unbound()?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// The listener thread: blocks on the socket (no CPU while idle) and wakes every waiter of this
/// process per ring, reading whatever else queued meanwhile first, since one wake covers it.
fn read_rings(sock: &UnixDatagram, stop: &AtomicBool, wake: &Notify) {
    let mut buf = [0u8; 8];
    loop {
        let got = sock.recv(&mut buf);
        if stop.load(Ordering::Acquire) {
            return;
        }
        match got {
            Ok(_) => {
                if sock.set_nonblocking(true).is_ok() {
                    while sock.recv(&mut buf).is_ok() {}
                    if sock.set_nonblocking(false).is_err() {
                        return;
                    }
                }
                wake.notify_waiters();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!(error = %e, "the doorbell cannot be read; waiting by polling");
                return;
            }
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        if let Some(Some(l)) = self.own.get() {
            let _ = std::fs::remove_file(&l.path);
            // Wakes the reader's blocked `recv`, which sees `stop` and ends.
            l.stop.store(true, Ordering::Release);
            let _ = l.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

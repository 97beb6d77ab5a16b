//! Doorbells for the embedded file: SQLite cannot block a reader until another process writes,
//! so a worker in another process would only see a new message at its next poll. Each process
//! that waits for messages binds a unix datagram socket in a directory next to the database file
//! (`<file>.doorbell/`); a process that has just committed a publish sends every socket there one
//! byte. A ring is a hint, never a message: one that is lost (a full socket buffer, a directory
//! that cannot be created, a path too long for a socket) costs only the poll interval the
//! reservation keeps anyway, so correctness never depends on it (docs/fastpath.md).

use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// One process's doorbell for one database file.
pub(crate) struct Doorbell {
    dir: PathBuf,
    /// This process's own socket, bound on the first wait (it needs a runtime); `None` when it
    /// could not be bound, and then waiting falls back to polling.
    own: OnceLock<Option<(PathBuf, tokio::net::UnixDatagram)>>,
    /// An unbound socket to ring others with, made on the first ring.
    sender: Mutex<Option<StdDatagram>>,
}

impl Doorbell {
    pub(crate) fn new(db: &Path) -> Self {
        let mut dir = db.as_os_str().to_owned();
        dir.push(".doorbell");
        Self {
            dir: PathBuf::from(dir),
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
        let own = self.own.get().and_then(|o| o.as_ref()).map(|(p, _)| p);
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        if sender.is_none() {
            match StdDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|_| s)) {
                Ok(s) => *sender = Some(s),
                Err(_) => return,
            }
        }
        let Some(sock) = sender.as_ref() else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if Some(&path) == own {
                continue; // this process wakes its own waiters without a datagram
            }
            match sock.send_to(b"!", &path) {
                // Nobody bound to it: its process is gone (killed, say). Whoever finds it
                // first removes it; removing it twice is harmless.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    let _ = std::fs::remove_file(&path);
                }
                // A full buffer means the bell is already ringing; anything else costs a poll.
                _ => {}
            }
        }
    }

    /// Resolves when another process rings; never, when this process has no socket (the
    /// caller's poll then does the work).
    pub(crate) async fn rung(&self) {
        let Some((_, sock)) = self.own.get_or_init(|| self.bind()).as_ref() else {
            return std::future::pending().await;
        };
        let mut buf = [0u8; 8];
        if sock.recv(&mut buf).await.is_err() {
            // A socket that cannot be read (its runtime is gone) must not spin the caller.
            return std::future::pending().await;
        }
        // Several rings while nobody listened wake the waiter once.
        while sock.try_recv(&mut buf).is_ok() {}
    }

    fn bind(&self) -> Option<(PathBuf, tokio::net::UnixDatagram)> {
        let path = self
            .dir
            .join(format!("{}-{:08x}", std::process::id(), fastrand::u32(..)));
        let bound = std::fs::create_dir_all(&self.dir)
            .and_then(|_| std::os::unix::net::UnixDatagram::bind(&path))
            .and_then(|s| s.set_nonblocking(true).map(|_| s))
            .and_then(|s| {
                // A runtime built without its I/O driver (a library user's `enable_time()` only)
                // panics on registration; such a worker waits by polling instead of dying.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tokio::net::UnixDatagram::from_std(s)
                }))
                .unwrap_or_else(|_| Err(std::io::Error::other("the runtime has no I/O driver")))
            });
        match bound {
            Ok(sock) => Some((path, sock)),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                tracing::debug!(dir = %self.dir.display(), error = %e, "no doorbell for this database file; waiting by polling");
                None
            }
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        if let Some(Some((path, _))) = self.own.get() {
            let _ = std::fs::remove_file(path);
        }
    }
}

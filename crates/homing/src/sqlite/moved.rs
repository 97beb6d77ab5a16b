//! Notices that the file a process opened is no longer the one at its path: removed (`rm
//! homing.db*` to start over, a clean-up of a temporary directory) or replaced by another file.
//! SQLite goes on reading and writing the file it has open either way, so before this a server
//! kept accepting jobs into a file that no process started later could find and that was gone
//! at its next start, while workers and commands started since worked on a new, empty file at
//! the path: jobs accepted on either side never ran on the other.
//!
//! Calls look at the path at most once a second. Once it names another file, or none, this
//! process refuses every read and write (a transient refusal: callers keep what they hold and
//! try again, a producer gets 503, `/healthz` turns 503), and what the file holds is saved beside the path,
//! from the connection that still has it, for the operator to move back. The save waits
//! [`SETTLE`] first, so that the other processes on the same file (each looks within a second)
//! have stopped writing to it too.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a call looks at the path: a `stat`, about a microsecond.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long after noticing the save begins: two looks of every other process on the file.
pub(super) const SETTLE: Duration = Duration::from_secs(2);

/// The file a process opened, by device and inode, and whether its path still names it.
pub(super) struct Opened {
    dev: u64,
    ino: u64,
    since: Instant,
    /// Milliseconds after `since` of the last look.
    looked: AtomicU64,
    /// Why writes are refused, once the path names another file.
    moved: OnceLock<String>,
}

/// What a look found.
pub(super) enum Look<'a> {
    Same,
    /// The path no longer names the opened file; `first` for the one look that found it so.
    Moved {
        reason: &'a str,
        first: bool,
    },
}

impl Opened {
    /// The file now at `path`, which the caller has just opened; `None` when it cannot be
    /// looked at (then writes are never refused for this).
    pub(super) fn at(path: &Path) -> Option<Opened> {
        let m = std::fs::metadata(path).ok()?;
        Some(Opened {
            dev: m.dev(),
            ino: m.ino(),
            since: Instant::now(),
            looked: AtomicU64::new(0),
            moved: OnceLock::new(),
        })
    }

    #[cfg(test)]
    pub(super) fn ino(&self) -> u64 {
        self.ino
    }

    /// Why calls are refused, once a look has found the path naming another file.
    pub(super) fn reason(&self) -> Option<&str> {
        self.moved.get().map(String::as_str)
    }

    /// Where what the file holds is saved: beside the path, named after the file's inode so that
    /// every process on the same file picks the same name and only the first save lands.
    pub(super) fn saved_as(&self, path: &Path) -> PathBuf {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".removed-{}", self.ino));
        path.with_file_name(name)
    }

    /// Looks at `path` if the last look is [`LOOK_EVERY`] old (one caller at a time) or
    /// `at_once` (before opening a connection by the path, which would open whatever file is
    /// there now, creating an empty one if none is), else answers from the last look.
    pub(super) fn look(&self, path: &Path, at_once: bool) -> Look<'_> {
        if let Some(reason) = self.moved.get() {
            return Look::Moved {
                reason,
                first: false,
            };
        }
        let now = self.since.elapsed().as_millis() as u64;
        let last = self.looked.load(Ordering::Relaxed);
        if !at_once
            && (now < last + LOOK_EVERY.as_millis() as u64
                || self
                    .looked
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err())
        {
            return Look::Same;
        }
        let gone = match std::fs::metadata(path) {
            Ok(m) => m.dev() != self.dev || m.ino() != self.ino,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if !gone {
            return Look::Same;
        }
        let reason = format!(
            "the database file {} was removed or replaced while this process had it open; \
             what it holds is being saved as {} (this process's log says whether it was)",
            path.display(),
            self.saved_as(path).display(),
        );
        let first = self.moved.set(reason).is_ok();
        Look::Moved {
            reason: self.moved.get().map(String::as_str).unwrap_or_default(),
            first,
        }
    }
}

//! Turns SIGTERM, SIGINT and SIGHUP into a cancellation token, so every long-running command
//! shuts down gracefully the same way (docs/design.md section 4). SIGHUP is a hangup: the
//! terminal or ssh session a worker was started from went away; its default, an immediate
//! exit, left the worker's running jobs to be taken back as crashed.

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

fn listen(kind: SignalKind, name: &str) -> Option<Signal> {
    match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {name}");
            None
        }
    }
}

/// Whether SIGHUP was ignored when the process started (`nohup`, or a supervisor that set it
/// so): listening would override that, and a hangup would stop a process asked to outlive it.
#[allow(unsafe_code)]
fn hangups_ignored() -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`, a
    // zeroed struct of the right type.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The next signal from `s`, or never when there is no listener.
async fn next_of(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    // Registered before the task runs, so a signal that comes at once is not missed.
    let mut term = listen(SignalKind::terminate(), "SIGTERM");
    let mut hup = if hangups_ignored() {
        None
    } else {
        listen(SignalKind::hangup(), "SIGHUP")
    };
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = next_of(&mut term) => "SIGTERM",
            _ = next_of(&mut hup) => "SIGHUP",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        };
        tracing::info!("{name} received: shutting down");
        t.cancel();
        // A second SIGTERM or SIGINT means "now". Not a second SIGHUP: a hangup can come twice
        // (from the shell, then the terminal), and the second must not cut the graceful stop.
        tokio::select! {
            _ = next_of(&mut term) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::warn!("second signal: exiting immediately");
        crate::logs::flush();
        std::process::exit(130);
    });
    token
}

/// Sends SIGTERM to a child process (graceful stop), e.g. the bench's workers.
#[allow(unsafe_code)]
pub fn terminate(pid: u32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

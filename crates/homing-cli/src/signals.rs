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

/// The next of the signals that stop the process: its name.
async fn next(term: &mut Signal, hup: &mut Signal) -> &'static str {
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let (Some(mut term), Some(mut hup)) = (
            listen(SignalKind::terminate(), "SIGTERM"),
            listen(SignalKind::hangup(), "SIGHUP"),
        ) else {
            return;
        };
        let name = next(&mut term, &mut hup).await;
        tracing::info!("{name} received: shutting down");
        t.cancel();
        // A second signal means "now".
        next(&mut term, &mut hup).await;
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

//! Turns SIGTERM and SIGINT into a cancellation token, so every long-running command shuts down
//! gracefully the same way (docs/design.md section 4).

use tokio_util::sync::CancellationToken;

pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received: shutting down"),
        }
        t.cancel();
        // A second signal means "now".
        tokio::select! {
            _ = term.recv() => {}
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

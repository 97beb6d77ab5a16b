//! One TLS crypto provider for the whole process. rustls needs one chosen: reqwest (HTTP tasks,
//! webhooks, the pipelines' calls) asks for the process-wide default and panics when there is
//! none, while redis (`rediss://`) takes the only provider compiled in and fails when there are
//! two. homing builds rustls with ring alone (sqlx names ring itself) and installs it here.

/// Installs ring as the process's rustls provider, unless one is installed already (by an earlier
/// call, or by an application embedding homing, whose choice stands). Call it before building a
/// `reqwest::Client`; calling it again is harmless.
pub fn install_crypto_provider() {
    // Err means a provider is already in place: keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

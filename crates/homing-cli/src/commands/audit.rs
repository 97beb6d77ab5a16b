//! The audit entries of the CLI's operator writes (docs/access.md, "The audit log"): bulk
//! actions, single-job retry/cancel, queue pause/resume/limits, schedules and workflows go to
//! the store directly, so each records its own entry in the same log as the HTTP API's.
//! Written after the write is done or has failed; an entry the store cannot take is a warning,
//! never the command's failure (as in the API).

use homing::store::audit::NewAudit;
use homing::store::Store;

/// A failure for something that does not exist (a schedule's name): recorded as a 404.
#[derive(Debug)]
pub struct NotFound(pub String);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFound {}

/// Who ran the command: `cli:` and the local user (`$USER`, else the numeric uid). Only a name:
/// the store's URL and its credentials are never part of it.
pub fn actor() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.trim().is_empty() => format!("cli:{user}"),
        _ => format!("cli:uid={}", uid()),
    }
}

#[allow(unsafe_code)]
fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The status an entry records for a failed command: what the API answers for the same failure
/// (404 unknown, 400 invalid, 409 conflict, 503 unavailable), else 500.
pub fn failure(e: &anyhow::Error) -> u16 {
    if e.downcast_ref::<NotFound>().is_some() {
        return 404;
    }
    match e.downcast_ref::<homing::Error>() {
        Some(homing::Error::NotFound(_) | homing::Error::WorkflowNotFound(_)) => 404,
        Some(homing::Error::Invalid(_)) => 400,
        Some(homing::Error::Conflict { .. }) => 409,
        Some(homing::Error::Unavailable { .. }) => 503,
        _ => 500,
    }
}

/// Records one entry: `action` (`cli jobs retry`) on `target` (`state=failed&task=x`), with
/// `count` for a bulk action's jobs changed.
pub async fn record(
    store: &dyn Store,
    action: &str,
    target: &str,
    status: u16,
    count: Option<u64>,
) {
    let entry = NewAudit {
        actor: actor(),
        role: "admin".into(),
        action: action.into(),
        target: target.into(),
        status,
        count,
    };
    if let Err(err) = store.record_audit(entry, homing::time::now()).await {
        tracing::warn!(error = %err, %action, "could not record an audit entry");
    }
}

/// Records a single write's outcome and hands it back unchanged.
pub async fn audited<T, E: Into<anyhow::Error>>(
    store: &dyn Store,
    action: &str,
    target: &str,
    outcome: Result<T, E>,
) -> anyhow::Result<T> {
    let outcome = outcome.map_err(Into::into);
    let status = outcome.as_ref().err().map_or(200, failure);
    record(store, action, target, status, None).await;
    outcome
}

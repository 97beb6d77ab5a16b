//! Operator configuration that is not a flag: API tokens and webhook subscriptions. Both are
//! secrets (a Discord webhook URL carries its token), so they come from the environment or a file
//! (`HOMING_CONFIG=path.json` with `{"api_tokens": [...], "webhooks": [...]}`), never from the
//! command line where `ps` would show them, and are never logged in full.
//!
//! Sources add up: `HOMING_API_TOKEN` plus the file's `api_tokens`; the file's `webhooks` plus
//! `HOMING_WEBHOOKS` (a JSON array of subscriptions).
//!
//! The file may also declare periodic schedules (`"schedules": [{"name", "task", "cron" or
//! "every", ...}]`, the body of `PUT /v1/schedules/{name}` plus its name), checked when the file
//! is read and set in the store by every process at start ([`Config::reconcile_schedules`]).

use anyhow::Context as _;
use serde::Deserialize;
use std::sync::Arc;

use homing::events::{validate_all, Subscription};
use homing::schedule::ScheduleDef;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    api_tokens: Vec<String>,
    #[serde(default)]
    webhooks: Vec<Subscription>,
    #[serde(default)]
    schedules: Vec<serde_json::Value>,
}

/// One schedule of the file: `{"name": …}` plus the fields of `PUT /v1/schedules/{name}`.
fn schedule_from(mut v: serde_json::Value) -> Result<ScheduleDef, String> {
    let name = v
        .as_object_mut()
        .and_then(|o| o.remove("name"))
        .and_then(|n| n.as_str().map(String::from))
        .ok_or("each schedule needs a \"name\"")?;
    let body: crate::api::schedules::PutSchedule =
        serde_json::from_value(v).map_err(|e| format!("schedule '{name}': {e}"))?;
    let def = body
        .into_def(name.clone())
        .map_err(|e| format!("schedule '{name}': {e}"))?;
    homing::client::check_schedule(&def).map_err(|e| format!("schedule '{name}': {e}"))?;
    Ok(def)
}

/// The loaded configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Any of these tokens opens the API; empty means no authentication.
    pub api_tokens: Vec<Arc<str>>,
    pub webhooks: Arc<Vec<Subscription>>,
    /// Schedules declared in the file, set at every start.
    pub schedules: Vec<ScheduleDef>,
}

impl Config {
    /// Reads `HOMING_CONFIG`, `HOMING_API_TOKEN` and `HOMING_WEBHOOKS`.
    pub fn from_env() -> anyhow::Result<Config> {
        let mut file = File::default();
        if let Some(path) = std::env::var_os("HOMING_CONFIG").filter(|p| !p.is_empty()) {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read HOMING_CONFIG {}", path.to_string_lossy()))?;
            // serde's message names the field, never echoes a URL or token value.
            file = serde_json::from_str(&text).with_context(|| {
                format!(
                    "HOMING_CONFIG {} is not a valid config",
                    path.to_string_lossy()
                )
            })?;
        }
        let mut tokens = file.api_tokens;
        // An empty token is almost always a mistake (an unset shell variable, a template left
        // blank); taking it as "no authentication" would open the API silently, so refuse.
        if tokens.iter().any(|t| t.trim().is_empty()) {
            anyhow::bail!(
                "HOMING_CONFIG lists an empty API token: remove it, or give a real token (an empty token would turn authentication off)"
            );
        }
        if let Some(t) = std::env::var_os("HOMING_API_TOKEN") {
            let t = t
                .into_string()
                .map_err(|_| anyhow::anyhow!("HOMING_API_TOKEN is not valid UTF-8"))?;
            if t.trim().is_empty() {
                anyhow::bail!(
                    "HOMING_API_TOKEN is set but empty: unset it to run without authentication, or give a real token"
                );
            }
            tokens.push(t);
        }
        let mut webhooks = file.webhooks;
        if let Ok(text) = std::env::var("HOMING_WEBHOOKS") {
            if !text.trim().is_empty() {
                let more: Vec<Subscription> = serde_json::from_str(&text).context(
                    "HOMING_WEBHOOKS must be a JSON array of {name, url, format, events}",
                )?;
                webhooks.extend(more);
            }
        }
        validate_all(&webhooks).map_err(|e| anyhow::anyhow!("webhook configuration: {e}"))?;
        let mut schedules = Vec::with_capacity(file.schedules.len());
        for v in file.schedules {
            let def = schedule_from(v).map_err(|e| anyhow::anyhow!("HOMING_CONFIG: {e}"))?;
            if schedules.iter().any(|s: &ScheduleDef| s.name == def.name) {
                anyhow::bail!("HOMING_CONFIG: schedule '{}' is declared twice", def.name);
            }
            schedules.push(def);
        }
        Ok(Config {
            api_tokens: tokens.into_iter().map(Arc::from).collect(),
            webhooks: Arc::new(webhooks),
            schedules,
        })
    }

    /// Sets the file's schedules in the store. A schedule whose cron or interval is unchanged
    /// keeps its progress, so every process may do this at every start; a schedule removed
    /// from the file stays until `homing schedules delete` (the store does not record where a
    /// schedule came from).
    pub async fn reconcile_schedules(
        &self,
        store: &dyn homing::store::Store,
    ) -> anyhow::Result<()> {
        for def in &self.schedules {
            store
                .put_schedule(def, homing::time::now())
                .await
                .with_context(|| format!("setting schedule '{}' from HOMING_CONFIG", def.name))?;
        }
        if !self.schedules.is_empty() {
            tracing::info!(
                schedules = self.schedules.len(),
                "schedules from HOMING_CONFIG set"
            );
        }
        Ok(())
    }

    pub fn subscribers(&self) -> Vec<homing::events::Subscriber> {
        self.webhooks.iter().map(|s| s.subscriber()).collect()
    }
}

/// Where this process's own HTTP calls may go (`builtin.http`, webhooks, callbacks): see
/// `homing::egress`. `HOMING_HTTP_ALLOW` and `HOMING_HTTP_DENY` are comma-separated lists
/// (`loopback`, `private`, addresses, CIDR networks). When `HOMING_HTTP_ALLOW` is unset, loopback
/// is allowed with the embedded SQLite store — one machine, where the service homing drives
/// (an inference server, the README's tour) listens on 127.0.0.1 next to it — and refused with
/// PostgreSQL, the shared deployment where a producer must not reach a host's local services.
pub fn egress_policy(store_url: &str) -> anyhow::Result<homing::egress::Policy> {
    let allow = match std::env::var("HOMING_HTTP_ALLOW") {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) if store_url.starts_with("sqlite:") => {
            "loopback".to_string()
        }
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(e) => anyhow::bail!("HOMING_HTTP_ALLOW: {e}"),
    };
    let deny = match std::env::var("HOMING_HTTP_DENY") {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(e) => anyhow::bail!("HOMING_HTTP_DENY: {e}"),
    };
    homing::egress::Policy::parse(&allow, &deny)
        .map_err(|e| anyhow::anyhow!("HOMING_HTTP_ALLOW / HOMING_HTTP_DENY: {e}"))
}

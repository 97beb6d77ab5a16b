//! Operator configuration that is not a flag: API tokens and webhook subscriptions. Both are
//! secrets (a Discord webhook URL carries its token), so they come from the environment or a file
//! (`HOMING_CONFIG=path.json` with `{"api_tokens": [...], "webhooks": [...]}`), never from the
//! command line where `ps` would show them, and are never logged in full.
//!
//! Sources add up: `HOMING_API_TOKEN` plus the file's `api_tokens`; the file's `webhooks` plus
//! `HOMING_WEBHOOKS` (a JSON array of subscriptions).

use anyhow::Context as _;
use serde::Deserialize;
use std::sync::Arc;

use homing::events::{validate_all, Subscription};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    api_tokens: Vec<String>,
    #[serde(default)]
    webhooks: Vec<Subscription>,
}

/// The loaded configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Any of these tokens opens the API; empty means no authentication.
    pub api_tokens: Vec<Arc<str>>,
    pub webhooks: Arc<Vec<Subscription>>,
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
        Ok(Config {
            api_tokens: tokens.into_iter().map(Arc::from).collect(),
            webhooks: Arc::new(webhooks),
        })
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

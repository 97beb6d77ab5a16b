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
        if let Ok(t) = std::env::var("HOMING_API_TOKEN") {
            tokens.push(t);
        }
        tokens.retain(|t| !t.is_empty());
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

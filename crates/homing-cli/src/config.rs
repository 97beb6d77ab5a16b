//! Operator configuration that is not a flag: API tokens and webhook subscriptions. Both are
//! secrets (a Discord webhook URL carries its token), so they come from the environment or a file
//! (`HOMING_CONFIG=path.json` with `{"api_tokens": [...], "webhooks": [...]}`), never from the
//! command line where `ps` would show them, and are never logged in full.
//!
//! Sources add up: `HOMING_API_TOKEN` plus the file's `api_tokens`; the file's `webhooks` plus
//! `HOMING_WEBHOOKS` (a JSON array of subscriptions).
//!
//! A token has a role (docs/access.md): `admin` may do everything, `read` only the dashboard and
//! `GET` routes. The file lists tokens as `{"token", "role", "name"}` or as a bare string, which
//! stays `admin` as it always was; `HOMING_API_TOKEN` is `admin`. The name is what the audit log
//! records, never the token.
//!
//! The file may also declare periodic schedules (`"schedules": [{"name", "task", "cron" or
//! "every", ...}]`, the body of `PUT /v1/schedules/{name}` plus its name), checked when the file
//! is read and set in the store by every process at start ([`Config::reconcile_schedules`]).
//! Likewise queue limits (`"queues": {"bgm": {"concurrency": 1, "rate": "10/1s", "key_arg":
//! "user_id"}}`, each the body of `PUT /v1/queues/{name}`), set by [`Config::reconcile_queues`].

use anyhow::Context as _;
use serde::Deserialize;
use std::sync::Arc;

use homing::events::{validate_all, Subscription};
use homing::schedule::ScheduleDef;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    api_tokens: Vec<serde_json::Value>,
    #[serde(default)]
    webhooks: Vec<Subscription>,
    #[serde(default)]
    schedules: Vec<serde_json::Value>,
    /// Queue name → the body of `PUT /v1/queues/{name}`, read by [`queues_from`].
    #[serde(default)]
    queues: serde_json::Value,
}

/// One token of the file: a bare string (an unnamed `admin` token, as before roles existed) or
/// `{"token", "role", "name"}`.
#[derive(Debug)]
enum TokenEntry {
    Bare(String),
    Full(FullToken),
}

impl TokenEntry {
    /// Reads the `i`-th entry, with an error that says which entry and what is wrong with it.
    /// serde's messages name fields and roles, not token values.
    fn read(i: usize, v: serde_json::Value) -> anyhow::Result<TokenEntry> {
        match v {
            serde_json::Value::String(t) => Ok(TokenEntry::Bare(t)),
            v @ serde_json::Value::Object(_) => serde_json::from_value(v)
                .map(TokenEntry::Full)
                .map_err(|e| anyhow::anyhow!("HOMING_CONFIG: api_tokens[{i}]: {e} (give {{\"token\", \"role\": \"read\" or \"admin\", \"name\"}})")),
            _ => anyhow::bail!(
                "HOMING_CONFIG: api_tokens[{i}] must be a token string or {{\"token\", \"role\", \"name\"}}"
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FullToken {
    token: String,
    role: Role,
    #[serde(default)]
    name: Option<String>,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The dashboard and every `GET` route.
    Read,
    /// Everything, including the remote worker protocol.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// One API token with its role and the name the audit log shows for it.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub token: Arc<str>,
    pub role: Role,
    pub name: Arc<str>,
}

/// Longest token name: it is shown in the dashboard and stored with every audit entry.
const MAX_TOKEN_NAME: usize = 64;

/// Turns the file's entries and `HOMING_API_TOKEN` into tokens, refusing empty tokens, bad
/// names, and a token or name given twice (two roles for one token would make the role depend
/// on the order of comparison; two tokens with one name would make the audit log ambiguous).
fn tokens_from(
    entries: Vec<serde_json::Value>,
    env: Option<String>,
) -> anyhow::Result<Vec<ApiToken>> {
    let mut out: Vec<ApiToken> = Vec::with_capacity(entries.len() + 1);
    for (i, e) in entries.into_iter().enumerate() {
        let (token, role, name) = match TokenEntry::read(i, e)? {
            TokenEntry::Bare(t) => (t, Role::Admin, format!("token-{}", i + 1)),
            TokenEntry::Full(f) => {
                let name = f.name.unwrap_or_else(|| format!("token-{}", i + 1));
                (f.token, f.role, name)
            }
        };
        // An empty token is almost always a mistake (an unset shell variable, a template left
        // blank); taking it as "no authentication" would open the API silently, so refuse.
        if token.trim().is_empty() {
            anyhow::bail!(
                "HOMING_CONFIG lists an empty API token: remove it, or give a real token (an empty token would turn authentication off)"
            );
        }
        out.push(ApiToken {
            token: token.into(),
            role,
            name: name.into(),
        });
    }
    if let Some(t) = env {
        if t.trim().is_empty() {
            anyhow::bail!(
                "HOMING_API_TOKEN is set but empty: unset it to run without authentication, or give a real token"
            );
        }
        out.push(ApiToken {
            token: t.into(),
            role: Role::Admin,
            name: "HOMING_API_TOKEN".into(),
        });
    }
    for (i, t) in out.iter().enumerate() {
        let ok = !t.name.is_empty()
            && t.name.len() <= MAX_TOKEN_NAME
            && t.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:@-".contains(c));
        if !ok {
            anyhow::bail!(
                "HOMING_CONFIG: API token name '{}' must be 1-{MAX_TOKEN_NAME} characters of letters, digits and _.:@-",
                t.name.escape_debug()
            );
        }
        if out[..i].iter().any(|o| o.name == t.name) {
            anyhow::bail!("HOMING_CONFIG: two API tokens are named '{}'", t.name);
        }
        if out[..i].iter().any(|o| o.token == t.token) {
            anyhow::bail!(
                "HOMING_CONFIG: the API token named '{}' is given twice (HOMING_API_TOKEN counts too)",
                t.name
            );
        }
    }
    Ok(out)
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

/// The file's `"queues"`: each name checked as a producer's queue name, each body as the body
/// of `PUT /v1/queues/{name}` (the same struct, so the same fields and ranges), with an error
/// naming the queue and the field.
fn queues_from(
    queues: serde_json::Value,
) -> Result<Vec<(String, homing::limit::QueueLimits)>, String> {
    let queues = match queues {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Object(m) => m,
        _ => return Err(
            "queues must be a map of queue name to limits, e.g. {\"bgm\": {\"concurrency\": 1}}"
                .into(),
        ),
    };
    let mut out = Vec::with_capacity(queues.len());
    for (name, body) in queues {
        homing::validate::producer_queue(&name).map_err(|e| format!("queues.{name}: {e}"))?;
        if !body.is_object() {
            return Err(format!(
                "queues.{name} must be an object like {{\"concurrency\": 1, \"rate\": \"10/1s\", \"key_arg\": \"user_id\"}}"
            ));
        }
        let limits = serde_json::from_value::<crate::api::queues::PutQueue>(body)
            .map_err(|e| e.to_string())
            .and_then(|b| b.into_limits())
            .map_err(|e| format!("queues.{name}: {e}"))?;
        out.push((name, limits));
    }
    Ok(out)
}

/// The loaded configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Any of these tokens opens the API, as far as its role allows; empty means no
    /// authentication (everyone is `admin`).
    pub api_tokens: Vec<ApiToken>,
    pub webhooks: Arc<Vec<Subscription>>,
    /// Schedules declared in the file, set at every start.
    pub schedules: Vec<ScheduleDef>,
    /// Queue limits declared in the file, set at every start.
    pub queues: Vec<(String, homing::limit::QueueLimits)>,
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
            // Its schedules' args are stored: an integer the reader would round is refused.
            homing::validate::exact_integers(text.as_bytes())
                .map_err(|e| anyhow::anyhow!("HOMING_CONFIG {}: {e}", path.to_string_lossy()))?;
        }
        let env_token = match std::env::var_os("HOMING_API_TOKEN") {
            Some(t) => Some(
                t.into_string()
                    .map_err(|_| anyhow::anyhow!("HOMING_API_TOKEN is not valid UTF-8"))?,
            ),
            None => None,
        };
        let tokens = tokens_from(file.api_tokens, env_token)?;
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
        let queues = queues_from(file.queues).map_err(|e| anyhow::anyhow!("HOMING_CONFIG: {e}"))?;
        Ok(Config {
            api_tokens: tokens,
            webhooks: Arc::new(webhooks),
            schedules,
            queues,
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

    /// Sets the file's queue limits in the store, replacing a queue's previous ones, and only
    /// where they differ: a change unparks the queue's held jobs (the reconciler publishes
    /// them), which a restart with the same file should not do. A queue removed from the file
    /// keeps its limits until `homing queues limit Q --clear`, as schedules do.
    pub async fn reconcile_queues(&self, store: &dyn homing::store::Store) -> anyhow::Result<()> {
        if self.queues.is_empty() {
            return Ok(());
        }
        let stored = store.queue_settings().await?;
        let mut changed = 0;
        for (name, limits) in &self.queues {
            let now = stored.iter().find(|q| &q.queue == name).map(|q| &q.limits);
            if now == Some(limits) || (now.is_none() && !limits.is_limited()) {
                continue;
            }
            store
                .set_limits(name, limits, homing::time::now())
                .await
                .with_context(|| {
                    format!("setting the limits of queue '{name}' from HOMING_CONFIG")
                })?;
            changed += 1;
        }
        tracing::info!(
            queues = self.queues.len(),
            changed,
            "queue limits from HOMING_CONFIG set"
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<serde_json::Value> {
        serde_json::from_str::<File>(text).unwrap().api_tokens
    }

    fn queues(text: &str) -> Result<Vec<(String, homing::limit::QueueLimits)>, String> {
        queues_from(
            serde_json::from_str::<File>(text)
                .map_err(|e| e.to_string())?
                .queues,
        )
    }

    #[test]
    fn queue_limits_are_read_like_the_put_body() {
        let q = queues(
            r#"{"queues": {"bgm": {"concurrency": 1}, "mail": {"rate": "10/1s", "key_arg": "user_id"}, "free": {}}}"#,
        )
        .unwrap();
        let get = |n: &str| q.iter().find(|(name, _)| name == n).unwrap().1.clone();
        assert_eq!(get("bgm").concurrency, Some(1));
        assert_eq!(get("mail").rate.unwrap().to_string(), "10/1s");
        assert_eq!(get("mail").key_arg.as_deref(), Some("user_id"));
        assert!(!get("free").is_limited());
        for (text, names) in [
            (
                r#"{"queues": {"bgm": {"concurrency": 0}}}"#,
                ["queues.bgm", "concurrency"],
            ),
            (
                r#"{"queues": {"bgm": {"rate": "ten"}}}"#,
                ["queues.bgm", "rate"],
            ),
            (
                r#"{"queues": {"bgm": {"paused": true}}}"#,
                ["queues.bgm", "paused"],
            ),
            (
                r#"{"queues": {"bgm": {"key_arg": "u"}}}"#,
                ["queues.bgm", "key_arg"],
            ),
            (r#"{"queues": {"bgm": 1}}"#, ["queues.bgm", "object"]),
            (
                r#"{"queues": {"homing.x": {"concurrency": 1}}}"#,
                ["queues.homing.x", "homing"],
            ),
            (r#"{"queues": [1]}"#, ["queues", "map"]),
        ] {
            let e = queues(text).expect_err(text);
            for n in names {
                assert!(e.contains(n), "{text}: {e} should name {n}");
            }
        }
    }

    #[test]
    fn bare_strings_stay_admin_and_entries_carry_role_and_name() {
        let t = tokens_from(
            parse(r#"{"api_tokens": ["old-admin", {"token": "r1", "role": "read", "name": "ops-bob"}, {"token": "a2", "role": "admin"}]}"#),
            Some("from-env".into()),
        )
        .unwrap();
        let got: Vec<(&str, Role, &str)> =
            t.iter().map(|t| (&*t.token, t.role, &*t.name)).collect();
        assert_eq!(
            got,
            vec![
                ("old-admin", Role::Admin, "token-1"),
                ("r1", Role::Read, "ops-bob"),
                ("a2", Role::Admin, "token-3"),
                ("from-env", Role::Admin, "HOMING_API_TOKEN"),
            ]
        );
    }

    #[test]
    fn bad_token_lists_are_refused() {
        for (text, env) in [
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "root"}]}"#,
                None,
            ),
            (r#"{"api_tokens": [{"token": "sekrit-a"}]}"#, None),
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "read", "extra": 1}]}"#,
                None,
            ),
            (r#"{"api_tokens": [5]}"#, None),
            (r#"{"api_tokens": [" "]}"#, None),
            (r#"{"api_tokens": []}"#, Some(" ")),
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "read", "name": "x"}, {"token": "sekrit-b", "role": "read", "name": "x"}]}"#,
                None,
            ),
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "read", "name": "x"}, "sekrit-a"]}"#,
                None,
            ),
            (r#"{"api_tokens": ["sekrit-a"]}"#, Some("sekrit-a")),
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "read", "name": "bad name"}]}"#,
                None,
            ),
            (
                r#"{"api_tokens": [{"token": "sekrit-a", "role": "read", "name": ""}]}"#,
                None,
            ),
        ] {
            let r = tokens_from(parse(text), env.map(String::from));
            let e = r.expect_err(text).to_string();
            assert!(!e.contains("sekrit"), "never echoes a token: {e}");
        }
    }
}

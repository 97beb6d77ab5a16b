//! Connections to the Redis servers Celery uses (its broker and its result backend). Celery
//! configurations name them in kombu's URL forms, which differ from redis-rs's for unix sockets
//! (`redis+socket:///path`, `socket:///path`, `?virtual_host=N`): the same string a Django
//! settings file holds must work here unchanged.

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion};
use std::time::Duration;

use crate::broker::redis::err;
use crate::error::{Error, Result};
use crate::redact::redact_url;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connected, auto-reconnecting connection to one Redis server.
#[derive(Clone)]
pub struct Conn {
    client: ::redis::Client,
    manager: std::sync::Arc<tokio::sync::OnceCell<ConnectionManager>>,
    /// The address without credentials, for logs and errors.
    pub display: String,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// Rewrites kombu's URL spellings into redis-rs's.
fn normalise(url: &str) -> String {
    let url = url
        .strip_prefix("redis+socket://")
        .or_else(|| url.strip_prefix("socket://"))
        .map(|rest| format!("redis+unix://{rest}"))
        .unwrap_or_else(|| url.to_string());
    url.replace("virtual_host=", "db=")
}

impl Conn {
    /// Parses the URL; connects on first use, so a server that is not up yet is not an error.
    pub fn open(url: &str) -> Result<Self> {
        let info = normalise(url)
            .as_str()
            .into_connection_info()
            .map_err(|e| {
                Error::Invalid(format!(
                    "invalid Celery Redis URL '{}': {e}",
                    redact_url(url)
                ))
            })?;
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP2);
        let info = info.set_redis_settings(redis);
        let db = info.redis_settings().db();
        let display = match info.addr() {
            ConnectionAddr::Tcp(h, p) => format!("redis://{h}:{p}/{db}"),
            ConnectionAddr::TcpTls { host, port, .. } => {
                format!("rediss://{host}:{port}/{db}")
            }
            ConnectionAddr::Unix(p) => format!("redis+unix://{}?db={db}", p.display()),
            // A new transport in a later redis-rs: name it without details rather than guess.
            _ => format!("redis (db {db})"),
        };
        let client = ::redis::Client::open(info)
            .map_err(|e| Error::Invalid(format!("invalid Celery Redis URL {display}: {e}")))?;
        Ok(Self {
            client,
            manager: Default::default(),
            display,
        })
    }

    pub async fn get(&self) -> Result<ConnectionManager> {
        self.manager
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(0);
                ConnectionManager::new_with_config(self.client.clone(), config)
                    .await
                    .map_err(err)
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kombu_url_forms() {
        assert_eq!(
            normalise("redis+socket:///run/r.sock?virtual_host=2"),
            "redis+unix:///run/r.sock?db=2"
        );
        assert_eq!(normalise("socket:///r.sock"), "redis+unix:///r.sock");
        let c = Conn::open("redis://:pw@127.0.0.1:6379/3").unwrap();
        assert_eq!(c.display, "redis://127.0.0.1:6379/3");
        let c = Conn::open("redis+socket:///tmp/x.sock?virtual_host=1").unwrap();
        assert_eq!(c.display, "redis+unix:///tmp/x.sock?db=1");
        assert!(Conn::open("redis://:pw@h:port/0").is_err());
    }
}

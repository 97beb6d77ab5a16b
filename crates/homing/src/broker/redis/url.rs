//! Reads a Redis broker URL: the connection itself is redis-rs's business (`redis://`,
//! `rediss://`, `redis+unix://`, `unix://`, with credentials and database), homing adds one query
//! parameter, `prefix`, the key namespace, so several deployments (or test cases) can share one
//! server. The password never leaves this module except inside the connection info.

use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use super::keys::{valid_prefix, DEFAULT_PREFIX};
use crate::error::{Error, Result};

/// A parsed broker URL.
pub struct BrokerUrl {
    pub info: ConnectionInfo,
    pub prefix: String,
    /// Where the broker connects, without credentials: safe for logs and errors.
    pub display: String,
}

pub fn parse(url: &str) -> Result<BrokerUrl> {
    let (url, prefix) = take_prefix(url)?;
    let info = url.as_str().into_connection_info().map_err(|e| {
        Error::Invalid(format!(
            "invalid Redis URL '{}': {e}",
            crate::redact::redact_url(&url)
        ))
    })?;
    // The reply parsers expect RESP2 shapes; a `?protocol=resp3` must not change them.
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP2);
    let info = info.set_redis_settings(redis);
    let db = info.redis_settings().db();
    let display = match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}/{db}"),
        ConnectionAddr::TcpTls { host, port, .. } => {
            format!("rediss://{host}:{port}/{db}")
        }
        ConnectionAddr::Unix(path) => {
            format!("redis+unix://{}?db={db}", path.display())
        }
        // A new transport in a later redis-rs: name it without details rather than guess.
        _ => format!("redis (db {db})"),
    };
    Ok(BrokerUrl {
        info,
        display: format!("{display} (prefix {prefix})"),
        prefix,
    })
}

/// Splits `prefix=NAME` off the query string, leaving every other parameter (and a `#insecure`
/// fragment) for redis-rs.
fn take_prefix(url: &str) -> Result<(String, String)> {
    let (rest, fragment) = match url.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (url, None),
    };
    let (base, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut kept = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("prefix=") {
            Some(p) => prefix = p.to_string(),
            None => kept.push(pair),
        }
    }
    if !valid_prefix(&prefix) {
        return Err(Error::Invalid(format!(
            "invalid Redis key prefix '{prefix}': use 1-64 letters, digits, '-', '_', '.' or ':'"
        )));
    }
    let mut out = base.to_string();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok((out, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_url_with_password_and_prefix() {
        let u = parse("redis://:s3cret@127.0.0.1:6390/2?prefix=t1").unwrap();
        assert_eq!(u.prefix, "t1");
        assert_eq!(u.info.redis_settings().password(), Some("s3cret"));
        assert_eq!(u.info.redis_settings().db(), 2);
        assert!(!u.display.contains("s3cret"), "{}", u.display);
        assert!(u.display.contains("127.0.0.1:6390"));
    }

    #[test]
    fn unix_urls_and_defaults() {
        let u = parse("redis+unix:///tmp/r.sock?db=3").unwrap();
        assert_eq!(u.prefix, "homing");
        assert_eq!(u.info.redis_settings().db(), 3);
        assert!(matches!(u.info.addr(), ConnectionAddr::Unix(_)));
        let u = parse("unix:///tmp/r.sock?prefix=x&pass=pw").unwrap();
        assert_eq!(u.prefix, "x");
        assert_eq!(u.info.redis_settings().password(), Some("pw"));
        assert!(!u.display.contains("pw"));
    }

    #[test]
    fn tls_keeps_its_fragment() {
        let u = parse("rediss://h:6380/0?prefix=p#insecure").unwrap();
        assert!(matches!(
            u.info.addr(),
            ConnectionAddr::TcpTls { insecure: true, .. }
        ));
    }

    #[test]
    fn bad_prefix_or_url_is_invalid_input() {
        assert!(matches!(
            parse("redis://h/0?prefix=a{b}"),
            Err(Error::Invalid(_))
        ));
        let e = parse("redis://:pw@h:notaport/0").err().expect("rejected");
        assert!(matches!(e, Error::Invalid(_)));
        assert!(!e.to_string().contains("pw"), "{e}");
    }
}

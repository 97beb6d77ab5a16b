//! Reads a Redis broker URL: the connection itself is redis-rs's business (`redis://`,
//! `rediss://`, `redis+unix://`, `unix://`, with credentials and database), homing adds one query
//! parameter, `prefix`, the key namespace, so several deployments (or test cases) can share one
//! server. The password never leaves this module except inside the connection info.
//!
//! A Redis Cluster is named by `redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/0]`
//! (`rediss+cluster://` over TLS): a comma-separated list of seed nodes, any few masters or
//! replicas of the cluster; the client learns the rest of the topology from them. A cluster has
//! only database 0.

use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use super::keys::{valid_prefix, DEFAULT_PREFIX};
use crate::error::{Error, Result};

/// What a broker URL connects to.
// Parsed once per broker: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    Single(ConnectionInfo),
    /// The seed nodes of a Redis Cluster.
    Cluster(Vec<ConnectionInfo>),
}

/// The URL schemes that name a Redis Cluster, and the scheme of each seed node.
const CLUSTER_SCHEMES: [(&str, &str); 2] = [
    ("redis+cluster://", "redis://"),
    ("rediss+cluster://", "rediss://"),
];

/// A parsed broker URL.
pub struct BrokerUrl {
    pub target: Target,
    pub prefix: String,
    /// Where the broker connects, without credentials: safe for logs and errors.
    pub display: String,
}

pub fn parse(url: &str) -> Result<BrokerUrl> {
    let (url, prefix) = take_prefix(url)?;
    if let Some((cluster, node)) = CLUSTER_SCHEMES.iter().find(|(s, _)| url.starts_with(s)) {
        return parse_cluster(&url[cluster.len()..], node, prefix);
    }
    let info = one_node(&url)?;
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
        target: Target::Single(info),
        display: format!("{display} (prefix {prefix})"),
        prefix,
    })
}

/// The seed list of a cluster URL (after its scheme): each `HOST:PORT` becomes a node URL of
/// scheme `node` with the same credentials, path, query and fragment.
fn parse_cluster(rest: &str, node: &str, prefix: String) -> Result<BrokerUrl> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(Error::Invalid(format!(
            "invalid Redis Cluster URL '{}': expected redis+cluster://HOST:PORT[,HOST:PORT...], \
             with no empty seed node",
            crate::redact::redact_url(&format!("{node}{rest}"))
        )));
    }
    let mut infos = Vec::with_capacity(hosts.len());
    for h in &hosts {
        let info = one_node(&format!("{node}{userinfo}{h}{tail}"))?;
        if info.redis_settings().db() != 0 {
            return Err(Error::Invalid(format!(
                "invalid Redis Cluster URL: a cluster has only database 0, not {}",
                info.redis_settings().db()
            )));
        }
        if !matches!(
            info.addr(),
            ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }
        ) {
            return Err(Error::Invalid(
                "invalid Redis Cluster URL: seed nodes are HOST:PORT".to_string(),
            ));
        }
        infos.push(info);
    }
    let display = format!(
        "{}{} (cluster, prefix {prefix})",
        node.replace("://", "+cluster://"),
        hosts.join(",")
    );
    Ok(BrokerUrl {
        target: Target::Cluster(infos),
        display,
        prefix,
    })
}

/// The connection info of one server, speaking RESP2.
fn one_node(url: &str) -> Result<ConnectionInfo> {
    let info = url.into_connection_info().map_err(|e| {
        Error::Invalid(format!(
            "invalid Redis URL '{}': {e}",
            crate::redact::redact_url(url)
        ))
    })?;
    // The reply parsers expect RESP2 shapes; a `?protocol=resp3` must not change them.
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP2);
    Ok(info.set_redis_settings(redis))
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

    impl BrokerUrl {
        fn info(&self) -> &ConnectionInfo {
            match &self.target {
                Target::Single(i) => i,
                Target::Cluster(_) => panic!("a cluster URL"),
            }
        }
    }

    fn seeds(u: &BrokerUrl) -> &[ConnectionInfo] {
        match &u.target {
            Target::Cluster(s) => s,
            Target::Single(_) => panic!("not a cluster URL"),
        }
    }

    #[test]
    fn cluster_url_lists_seed_nodes_with_shared_credentials() {
        let u = parse("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001/0?prefix=c1").unwrap();
        assert_eq!(u.prefix, "c1");
        let s = seeds(&u);
        assert_eq!(s.len(), 2);
        assert!(matches!(s[1].addr(), ConnectionAddr::Tcp(h, 7001) if h == "127.0.0.1"));
        assert!(s
            .iter()
            .all(|i| i.redis_settings().password() == Some("pw")));
        assert!(!u.display.contains("pw"), "{}", u.display);
        assert!(u
            .display
            .contains("redis+cluster://127.0.0.1:7000,127.0.0.1:7001"));
        let u = parse("rediss+cluster://h1:7000,h2:7000#insecure").unwrap();
        assert!(seeds(&u)
            .iter()
            .all(|i| matches!(i.addr(), ConnectionAddr::TcpTls { insecure: true, .. })));
    }

    #[test]
    fn bad_cluster_urls_are_invalid_input() {
        for bad in [
            "redis+cluster://h1:7000,,h2:7000",
            "redis+cluster://",
            "redis+cluster://h1:7000/3",
            "redis+cluster://:pw@h1:notaport",
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(matches!(e, Error::Invalid(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }

    #[test]
    fn tcp_url_with_password_and_prefix() {
        let u = parse("redis://:s3cret@127.0.0.1:6390/2?prefix=t1").unwrap();
        assert_eq!(u.prefix, "t1");
        assert_eq!(u.info().redis_settings().password(), Some("s3cret"));
        assert_eq!(u.info().redis_settings().db(), 2);
        assert!(!u.display.contains("s3cret"), "{}", u.display);
        assert!(u.display.contains("127.0.0.1:6390"));
    }

    #[test]
    fn unix_urls_and_defaults() {
        let u = parse("redis+unix:///tmp/r.sock?db=3").unwrap();
        assert_eq!(u.prefix, "homing");
        assert_eq!(u.info().redis_settings().db(), 3);
        assert!(matches!(u.info().addr(), ConnectionAddr::Unix(_)));
        let u = parse("unix:///tmp/r.sock?prefix=x&pass=pw").unwrap();
        assert_eq!(u.prefix, "x");
        assert_eq!(u.info().redis_settings().password(), Some("pw"));
        assert!(!u.display.contains("pw"));
    }

    #[test]
    fn tls_keeps_its_fragment() {
        let u = parse("rediss://h:6380/0?prefix=p#insecure").unwrap();
        assert!(matches!(
            u.info().addr(),
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

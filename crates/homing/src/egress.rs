//! Where homing's own outgoing HTTP may go: `builtin.http`, webhook deliveries and job
//! callbacks. Producers choose those URLs, so without a policy anyone who can enqueue can make a
//! worker call the cloud's metadata service (and read its credentials), the admin port of a
//! service on the same host, or anything on the private network (server-side request forgery).
//!
//! The stance: public addresses are allowed; link-local addresses and the cloud metadata
//! services (`169.254.0.0/16`, `fe80::/10`, `fd00:ec2::254`, `100.100.100.200`), unspecified,
//! multicast and broadcast addresses are refused unless an allow entry names them by address;
//! loopback and private ranges (`127.0.0.0/8`, `::1`, `10/8`, `172.16/12`, `192.168/16`,
//! `100.64/10`, `fc00::/7`) are refused unless allowed (`loopback`, `private`, or a CIDR); a deny
//! entry beats everything. The check is made on the *resolved* addresses at connect time (every
//! address a name resolves to must pass, so a name that answers with one public and one internal
//! address is refused), on literal addresses before connecting, and again at every redirect hop;
//! proxies from the environment are not used, since a proxy would connect on our behalf where
//! this check cannot see.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A network in CIDR notation: an address and how many leading bits of it count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Net {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or network (CIDR)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{s}' has an invalid prefix length (0 to {max})"))?,
        };
        Ok(Net {
            addr: canonical(addr),
            prefix,
        })
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:169.254.169.254`) reach the IPv4 host: judge them as it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

fn nets(list: &[&str]) -> Vec<Net> {
    list.iter()
        .map(|s| s.parse().expect("a built-in network list is valid"))
        .collect()
}

/// Refused unless an allow entry names them by address: link-local (where the cloud metadata
/// services live), the metadata services themselves, and addresses that are not one host.
const RESERVED: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "0.0.0.0/8",
    "::/128",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "ff00::/8",
];
const LOOPBACK: &[&str] = &["127.0.0.0/8", "::1/128"];
const PRIVATE: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];

/// The allow and deny lists; see the module documentation for how they combine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Networks allowed by address: the only way past [`RESERVED`].
    allow: Vec<Net>,
    /// The `loopback` and `private` keywords: open those classes, never a reserved address
    /// inside them (`fd00:ec2::254` is in `fc00::/7`).
    allow_loopback: bool,
    allow_private: bool,
    deny: Vec<Net>,
}

/// A refused destination. Its text names the address and how to allow it, never the URL
/// (which may carry a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Denied {}

impl Policy {
    /// Reads comma-separated lists: allow entries are `loopback`, `private` or a CIDR/address;
    /// deny entries are a CIDR/address (or `loopback`/`private`).
    pub fn parse(allow: &str, deny: &str) -> Result<Policy, String> {
        fn entries(s: &str) -> impl Iterator<Item = &str> {
            s.split(',').map(str::trim).filter(|e| !e.is_empty())
        }
        let mut p = Policy::default();
        for entry in entries(allow) {
            match entry {
                "loopback" => p.allow_loopback = true,
                "private" => p.allow_private = true,
                _ => p
                    .allow
                    .push(entry.parse().map_err(|e| format!("allow list: {e}"))?),
            }
        }
        for entry in entries(deny) {
            match entry {
                "loopback" => p.deny.extend(nets(LOOPBACK)),
                "private" => p.deny.extend(nets(PRIVATE)),
                _ => p
                    .deny
                    .push(entry.parse().map_err(|e| format!("deny list: {e}"))?),
            }
        }
        Ok(p)
    }

    /// Whether `ip` may be called; `Err` says why not.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Denied> {
        let ip = canonical(ip);
        let refuse = |why: &str| Err(Denied(format!("outgoing HTTP to {ip} is refused: {why}")));
        if self.deny.iter().any(|n| n.contains(ip)) {
            return refuse("it is on the deny list (HOMING_HTTP_DENY)");
        }
        if self.allow.iter().any(|n| n.contains(ip)) {
            return Ok(());
        }
        if nets(RESERVED).iter().any(|n| n.contains(ip)) {
            return refuse("a link-local, cloud metadata or non-host address");
        }
        if nets(LOOPBACK).iter().any(|n| n.contains(ip)) && !self.allow_loopback {
            return refuse("a loopback address (allow with HOMING_HTTP_ALLOW=loopback)");
        }
        if nets(PRIVATE).iter().any(|n| n.contains(ip)) && !self.allow_private {
            return refuse(
                "a private address (allow with HOMING_HTTP_ALLOW=private or its network)",
            );
        }
        Ok(())
    }

    /// The checks that need no DNS: the scheme, an address written in the URL, and `localhost`
    /// names. Enough to refuse an obviously internal callback URL at enqueue; names are checked
    /// again, on what they resolve to, when the request is made.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Denied> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Denied(format!(
                "unsupported url scheme '{}' (http or https only)",
                url.scheme()
            )));
        }
        let Some(host) = url.host_str() else {
            return Err(Denied("the url has no host".into()));
        };
        // IPv6 literals come bracketed, as written in the URL.
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return self.check_ip(ip);
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") {
            return self.check_ip(IpAddr::from([127, 0, 0, 1]));
        }
        Ok(())
    }
}

/// Refuses, at enqueue, a callback URL that this process's policy refuses without DNS (see
/// [`Policy::check_url`]); the delivery checks the resolved address again.
pub fn check_callback_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid callback_url: {e}"))?;
    policy()
        .check_url(&parsed)
        .map_err(|d| format!("callback_url refused: {d}"))
}

static INSTALLED: OnceLock<Arc<Policy>> = OnceLock::new();

/// Sets this process's policy (the `homing` binary does so from its configuration before any
/// task runs). Returns `false` when one was already in force; the first one stays.
pub fn install(policy: Policy) -> bool {
    INSTALLED.set(Arc::new(policy)).is_ok()
}

/// This process's policy: the installed one, else the strictest ([`Policy::default`]: public
/// addresses only).
pub fn policy() -> Arc<Policy> {
    INSTALLED
        .get_or_init(|| Arc::new(Policy::default()))
        .clone()
}

/// Resolves names with the system resolver, then refuses the lot if any address is refused.
struct CheckedResolver(Arc<Policy>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                policy.check_ip(a.ip())?;
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Most redirects followed, as browsers and reqwest's default do.
const MAX_REDIRECTS: usize = 10;

/// An HTTP client whose every connection and redirect passes `policy`. Requests must still be
/// checked with [`Policy::check_url`] first: a literal address is connected to without DNS.
pub fn client(policy: Arc<Policy>, builder: reqwest::ClientBuilder) -> reqwest::Client {
    // reqwest builds its TLS on the process's rustls provider, which must exist first.
    crate::tls::install_crypto_provider();
    let hops = policy.clone();
    builder
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver(policy)))
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(Denied(format!("more than {MAX_REDIRECTS} redirects")));
            }
            match hops.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(denied) => attempt.error(denied),
            }
        }))
        .build()
        .expect("an HTTP client with these settings")
}

/// The refusal behind a failed request, if a policy check caused it.
pub fn denial<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Denied> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(d) = err.downcast_ref::<Denied>() {
            return Some(d);
        }
        cur = err.source();
    }
    None
}

/// The connect timeout homing's HTTP clients share.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_allows_public_addresses_only() {
        let p = Policy::default();
        assert!(p.check_ip(ip("93.184.216.34")).is_ok());
        assert!(p.check_ip(ip("2606:2800:220:1::1")).is_ok());
        for bad in [
            "169.254.169.254",
            "fd00:ec2::254",
            "100.100.100.200",
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "0.0.0.0",
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            "fe80::1",
        ] {
            assert!(p.check_ip(ip(bad)).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn allow_and_deny_entries_combine() {
        let p = Policy::parse("loopback, 10.9.0.0/16", "127.0.0.2").unwrap();
        assert!(p.check_ip(ip("127.0.0.1")).is_ok());
        assert!(p.check_ip(ip("::1")).is_ok());
        assert!(p.check_ip(ip("127.0.0.2")).is_err(), "deny beats allow");
        assert!(p.check_ip(ip("10.9.3.4")).is_ok());
        assert!(p.check_ip(ip("10.8.3.4")).is_err());
        // `private` does not open link-local or the metadata service.
        let p = Policy::parse("private", "").unwrap();
        assert!(p.check_ip(ip("192.168.0.7")).is_ok());
        assert!(p.check_ip(ip("fd00:ec2::254")).is_err());
        assert!(p.check_ip(ip("169.254.169.254")).is_err());
        // Named by address, even a link-local address can be allowed.
        let p = Policy::parse("169.254.10.0/24", "").unwrap();
        assert!(p.check_ip(ip("169.254.10.3")).is_ok());
        assert!(p.check_ip(ip("169.254.169.254")).is_err());
        // A deny list can close public space too.
        let p = Policy::parse("", "0.0.0.0/0").unwrap();
        assert!(p.check_ip(ip("93.184.216.34")).is_err());
    }

    #[test]
    fn bad_entries_are_reported() {
        assert!(Policy::parse("10.0.0.0/33", "").is_err());
        assert!(Policy::parse("intranet", "").is_err());
        assert!(Policy::parse("", "::1/129").is_err());
    }

    #[test]
    fn urls_are_checked_without_dns() {
        let p = Policy::default();
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(p
            .check_url(&url("http://169.254.169.254/latest/meta-data"))
            .is_err());
        assert!(p.check_url(&url("http://[::1]:8080/")).is_err());
        assert!(p.check_url(&url("http://LocalHost./x")).is_err());
        assert!(p.check_url(&url("http://api.localhost/x")).is_err());
        assert!(p.check_url(&url("ftp://example.com/")).is_err());
        assert!(p.check_url(&url("https://example.com/hook")).is_ok());
        let p = Policy::parse("loopback", "").unwrap();
        assert!(p.check_url(&url("http://localhost:8787/healthz")).is_ok());
    }

    /// A name is judged by what it resolves to: `localhost` reaches the resolver here (no URL
    /// check first) and is refused there, before any connection.
    #[tokio::test]
    async fn names_are_checked_on_their_resolved_addresses() {
        let strict = client(Arc::new(Policy::default()), reqwest::Client::builder());
        let err = strict
            .get("http://localhost:9/")
            .send()
            .await
            .expect_err("refused");
        let d = denial(&err).expect("refused by the policy, not a connection error");
        assert!(d.0.contains("loopback"), "{d}");
        let open = client(
            Arc::new(Policy::parse("loopback", "").unwrap()),
            reqwest::Client::builder(),
        );
        let err = open
            .get("http://localhost:9/")
            .send()
            .await
            .expect_err("nothing listens on port 9");
        assert!(
            denial(&err).is_none(),
            "allowed, so only the connection fails"
        );
    }
}

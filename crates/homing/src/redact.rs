//! Secrets out of URLs before they reach a log line, an error message or an API response.
//!
//! A leaf module (it depends on nothing else in the crate) so that the backends, the broker and
//! the stores can all redact without depending on each other. URLs are read with a real URL
//! parser, because the hand-made splitting this replaces got the corner cases wrong: a password
//! containing `@` leaked its tail, and a password passed as a query parameter leaked whole.

/// Query parameters whose value is a secret, compared case-insensitively with `-` read as `_`.
/// Any parameter whose name ends in `password`, `secret`, `token` or `key` is one too.
const SECRET_PARAMS: &[&str] = &[
    "pass",
    "pwd",
    "passwd",
    "auth",
    "authorization",
    "credentials",
    "sig",
    "signature",
    "apikey",
];

const SECRET_SUFFIXES: &[&str] = &["password", "secret", "token", "key"];

const MASK: &str = "***";

fn is_secret_param(raw_name: &str) -> bool {
    // The name as the server will read it: percent- and plus-decoded.
    let name: String = url::form_urlencoded::parse(raw_name.as_bytes())
        .map(|(k, _)| k.into_owned())
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
        .replace('-', "_");
    SECRET_PARAMS.contains(&name.as_str()) || SECRET_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// A raw query string with every secret parameter's value replaced by `***`; the other
/// parameters are kept byte for byte. `None` when nothing was secret.
fn redact_query(query: &str) -> Option<String> {
    let mut changed = false;
    let parts: Vec<String> = query
        .split('&')
        .map(|pair| {
            let name = pair.split_once('=').map_or(pair, |(n, _)| n);
            if !name.is_empty() && is_secret_param(name) {
                changed = true;
                format!("{name}={MASK}")
            } else {
                pair.to_string()
            }
        })
        .collect();
    changed.then(|| parts.join("&"))
}

/// A backend URL (`postgres://`, `redis://`, `rediss://`, `redis+unix://`, `unix://`,
/// `sqlite://`, a Celery broker…) fit to log: its password, and the value of any query parameter
/// that looks like a secret (`password`, `pass`, `token`, `api_key`, `sslpassword`…), become
/// `***`. The user name, host, port, path and other parameters stay, so the message still says
/// where the process tried to connect. A URL without secrets comes back unchanged.
pub fn redact_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return redact_unparsed(raw);
    };
    let mut changed = false;
    if url.password().is_some() {
        // Cannot fail: a URL with a password has a host.
        changed |= url.set_password(Some(MASK)).is_ok();
    }
    if let Some(q) = url.query().and_then(redact_query) {
        url.set_query(Some(&q));
        changed = true;
    }
    if changed {
        url.to_string()
    } else {
        raw.to_string()
    }
}

/// What is left to show of a string the URL parser refused (a bad port, say): everything before
/// the last `@` of the authority could be credentials, and a query could hold secrets.
fn redact_unparsed(raw: &str) -> String {
    let (scheme, rest) = match raw.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, raw),
    };
    let (rest, had_query) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], true),
        None => (rest, false),
    };
    let rest = match rest.rsplit_once('@') {
        Some((_, host)) => format!("{MASK}@{host}"),
        None => rest.to_string(),
    };
    let tail = if had_query { "?…" } else { "" };
    match scheme {
        Some(s) => format!("{s}://{rest}{tail}"),
        None => format!("{rest}{tail}"),
    }
}

/// A URL that is a secret as a whole (a webhook whose path or query holds its token), reduced to
/// what is safe to show: `scheme://host[:port]`, then `/…` when anything followed. Credentials
/// are dropped.
pub fn redact_secret_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(url) if url.host_str().is_some() => {
            let host = url.host_str().unwrap_or_default();
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            let more = !matches!(url.path(), "" | "/")
                || url.query().is_some()
                || url.fragment().is_some();
            let tail = if more { "/…" } else { "" };
            format!("{}://{host}{port}{tail}", url.scheme())
        }
        _ => {
            let (scheme, rest) = raw.split_once("://").unwrap_or(("", raw));
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..end];
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let tail = if end < rest.len() { "/…" } else { "" };
            if scheme.is_empty() {
                format!("{host}{tail}")
            } else {
                format!("{scheme}://{host}{tail}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(url: &str, want: &str, secrets: &[&str]) {
        let got = redact_url(url);
        assert_eq!(got, want, "redact_url({url:?})");
        for s in secrets {
            assert!(!got.contains(s), "{got:?} shows {s:?}");
        }
    }

    #[test]
    fn passwords_in_the_authority() {
        check(
            "redis://:s3cret@host:6379/0",
            "redis://:***@host:6379/0",
            &["s3cret"],
        );
        check("postgres://u:p@h/db", "postgres://u:***@h/db", &[]);
        check(
            "rediss://user:s3cret@h:6380/0?prefix=p#insecure",
            "rediss://user:***@h:6380/0?prefix=p#insecure",
            &["s3cret"],
        );
    }

    #[test]
    fn a_password_containing_at_signs() {
        // The old splitter cut at the first '@' and printed `***@ss@host…`.
        check(
            "postgres://u:p@ss@db.example:5432/jobs",
            "postgres://u:***@db.example:5432/jobs",
            &["ss@", "p@ss"],
        );
        check(
            "redis://:a@b@c@127.0.0.1:6390/2",
            "redis://:***@127.0.0.1:6390/2",
            &["a@b", "b@c"],
        );
    }

    #[test]
    fn secrets_in_the_query() {
        check(
            "postgres://u@h/db?password=QPASS",
            "postgres://u@h/db?password=***",
            &["QPASS"],
        );
        check(
            "postgresql://h/db?sslmode=require&sslpassword=KEYPW&application_name=x",
            "postgresql://h/db?sslmode=require&sslpassword=***&application_name=x",
            &["KEYPW"],
        );
        for name in [
            "pass",
            "pwd",
            "secret",
            "token",
            "key",
            "api_key",
            "API-KEY",
            "access_token",
            "Password",
            "pass%77ord",
        ] {
            let got = redact_url(&format!("redis://h:1/0?prefix=p&{name}=TOPSECRET&db=1"));
            assert!(!got.contains("TOPSECRET"), "{name}: {got}");
            assert!(got.contains("prefix=p") && got.contains("db=1"), "{got}");
        }
    }

    #[test]
    fn unix_socket_and_sqlite_forms() {
        check(
            "redis+unix:///tmp/r.sock?db=3&pass=pw1",
            "redis+unix:///tmp/r.sock?db=3&pass=***",
            &["pw1"],
        );
        check(
            "unix:///tmp/r.sock?password=pw2",
            "unix:///tmp/r.sock?password=***",
            &["pw2"],
        );
        check("sqlite://a.db", "sqlite://a.db", &[]);
        check(
            "sqlite://homing-data/homing.db",
            "sqlite://homing-data/homing.db",
            &[],
        );
        check("sqlite:///var/lib/h.db", "sqlite:///var/lib/h.db", &[]);
        check(
            "sqlite:///var/lib/h.db?key=DBKEY",
            "sqlite:///var/lib/h.db?key=***",
            &["DBKEY"],
        );
    }

    #[test]
    fn urls_without_secrets_are_unchanged() {
        for u in [
            "postgres://u@h/db",
            "redis://h:6379/0?prefix=a:b",
            "sqlite://dir with space/x.db",
            "garbage",
            "",
        ] {
            assert_eq!(redact_url(u), u);
        }
    }

    #[test]
    fn unparseable_urls_hide_what_could_be_secret() {
        check(
            "redis://:pw@h:notaport/0",
            "redis://***@h:notaport/0",
            &["pw"],
        );
        check(
            "postgres://u:x@y@h:bad/db?password=Q",
            "postgres://***@h:bad/db?…",
            &["x@y", "Q"],
        );
    }

    #[test]
    fn secret_urls_show_only_their_host() {
        assert_eq!(
            redact_secret_url("https://discord.example/api/webhooks/123/tok?x=1"),
            "https://discord.example/…"
        );
        assert_eq!(
            redact_secret_url("http://user:pw@127.0.0.1:9000"),
            "http://127.0.0.1:9000"
        );
        assert_eq!(
            redact_secret_url("http://user:p@ss@hooks.example:8080/t"),
            "http://hooks.example:8080/…"
        );
        assert_eq!(redact_secret_url("http://h?token=T"), "http://h/…");
        assert_eq!(redact_secret_url("http://[::1]:9/x"), "http://[::1]:9/…");
    }
}

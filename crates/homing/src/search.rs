//! Job search (docs/operate.md): the operator's question "where is that job?" answered by id or
//! id prefix, task, queue, state, creation time, and the content of its args.
//!
//! This module is pure: it checks what a caller typed and turns it into bounds and literals the
//! stores bind as parameters. Nothing a caller types is ever spliced into SQL: an id prefix
//! becomes two UUID bounds, a JSON path becomes a list of checked keys and indexes, a substring is
//! matched with `instr`/`strpos` (no `LIKE`, so `%` and `_` are plain characters), and a value is
//! compared with the stored JSON text of the element. Every refusal is a one-line reason.

use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobState};
use crate::time::Micros;

/// The longest args substring or JSON value accepted (bytes): a search, not an upload.
pub const MAX_TEXT: usize = 1024;
/// The longest JSON path accepted (characters) and its deepest nesting.
pub const MAX_PATH: usize = 256;
pub const MAX_PATH_DEPTH: usize = 16;

/// One step of a JSON path into a job's args.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathStep {
    Key(String),
    Index(u32),
}

/// A checked search. Every field is optional; all given ones must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSearch {
    pub state: Option<JobState>,
    pub queue: Option<String>,
    pub task: Option<String>,
    /// Inclusive UUID bounds of an id prefix (equal for a whole id).
    pub id_range: Option<(JobId, JobId)>,
    /// `created_at >= from` (µs).
    pub created_from: Option<Micros>,
    /// `created_at < to` (µs).
    pub created_to: Option<Micros>,
    /// The element at this path of the args, as JSON text, equals `args_value`.
    pub args_path: Option<Vec<PathStep>>,
    /// Compact JSON text (serde_json's form, the form args are stored in).
    pub args_value: Option<String>,
    /// The args' JSON text contains this, byte for byte.
    pub args_contains: Option<String>,
}

/// What a caller typed, before checking (the API's query string, the CLI's flags).
#[derive(Debug, Clone, Default)]
pub struct RawSearch<'a> {
    pub id: Option<&'a str>,
    pub state: Option<&'a str>,
    pub queue: Option<&'a str>,
    pub task: Option<&'a str>,
    pub created_from: Option<&'a str>,
    pub created_to: Option<&'a str>,
    pub args_path: Option<&'a str>,
    pub args_value: Option<&'a str>,
    pub args_contains: Option<&'a str>,
}

fn given(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

impl JobSearch {
    /// Checks every field; the error is a one-line reason naming the field.
    pub fn parse(raw: &RawSearch<'_>) -> Result<JobSearch, String> {
        let mut s = JobSearch {
            state: given(raw.state)
                .map(|v| v.parse::<JobState>())
                .transpose()?,
            ..Default::default()
        };
        for (name, v, out) in [
            ("queue", raw.queue, &mut s.queue),
            ("task", raw.task, &mut s.task),
        ] {
            if let Some(v) = given(v) {
                if v.len() > 200 || v.contains('\0') {
                    return Err(format!("{name} must be at most 200 bytes, without NUL"));
                }
                *out = Some(v.to_string());
            }
        }
        if let Some(id) = given(raw.id) {
            s.id_range = Some(id_range(id)?);
        }
        s.created_from = given(raw.created_from)
            .map(|v| parse_time("created_from", v))
            .transpose()?;
        s.created_to = given(raw.created_to)
            .map(|v| parse_time("created_to", v))
            .transpose()?;
        if let (Some(a), Some(b)) = (s.created_from, s.created_to) {
            if a >= b {
                return Err("created_from must be before created_to".into());
            }
        }
        match (given(raw.args_path), raw.args_value) {
            (Some(p), Some(v)) => {
                s.args_path = Some(parse_path(p)?);
                s.args_value = Some(json_value(v)?);
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err("args_path needs args_value (the JSON value to compare with)".into())
            }
            (None, Some(_)) => return Err("args_value needs args_path".into()),
        }
        if let Some(c) = given(raw.args_contains) {
            if c.len() > MAX_TEXT || c.contains('\0') {
                return Err(format!(
                    "args_contains must be at most {MAX_TEXT} bytes, without NUL"
                ));
            }
            s.args_contains = Some(c.to_string());
        }
        Ok(s)
    }

    /// The path as SQLite's JSON path text (`$."a"[0]`); keys are checked to need no escaping.
    pub fn sqlite_path(&self) -> Option<String> {
        self.args_path.as_ref().map(|steps| {
            let mut p = String::from("$");
            for s in steps {
                match s {
                    PathStep::Key(k) => p += &format!(".\"{k}\""),
                    PathStep::Index(i) => p += &format!("[{i}]"),
                }
            }
            p
        })
    }

    /// The path as PostgreSQL's `#>` text array (`{a,0}`), bound as a `text[]`.
    pub fn postgres_path(&self) -> Option<Vec<String>> {
        self.args_path.as_ref().map(|steps| {
            steps
                .iter()
                .map(|s| match s {
                    PathStep::Key(k) => k.clone(),
                    PathStep::Index(i) => i.to_string(),
                })
                .collect()
        })
    }
}

/// An id or id prefix (hex digits, dashes anywhere ignored, any case) as inclusive UUID bounds:
/// the prefix padded with `0`s and with `f`s. A range on the primary key, so it needs no index
/// of its own and no `LIKE`.
pub fn id_range(prefix: &str) -> Result<(JobId, JobId), String> {
    let hex: String = prefix.chars().filter(|c| *c != '-').collect();
    if hex.is_empty() || hex.len() > 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "id must be a job id or its first hex digits (1-32 of 0-9a-f, dashes allowed), not '{}'",
            prefix.chars().take(40).collect::<String>()
        ));
    }
    let hex = hex.to_ascii_lowercase();
    let lo = format!("{hex:0<32}");
    let hi = format!("{hex:f<32}");
    let parse = |s: &str| JobId::parse_str(s).map_err(|e| format!("id: {e}"));
    Ok((parse(&lo)?, parse(&hi)?))
}

/// A time as RFC 3339 (`2026-12-01T00:00:00Z`) or microseconds since the epoch.
fn parse_time(name: &str, v: &str) -> Result<Micros, String> {
    if let Ok(n) = v.parse::<i64>() {
        return Ok(n);
    }
    let ts: jiff::Timestamp = v.parse().map_err(|_| {
        format!("{name} must be an RFC 3339 time (2026-12-01T00:00:00Z) or microseconds since the epoch")
    })?;
    Ok(ts.as_microsecond())
}

/// `a.b[0].c`: keys of letters, digits, `_` and `-`, array indexes in brackets.
pub fn parse_path(p: &str) -> Result<Vec<PathStep>, String> {
    let bad = |why: &str| {
        format!(
            "args_path '{}' {why}; write keys separated by dots and indexes in brackets, like items[0].sku",
            p.chars().take(60).collect::<String>()
        )
    };
    if p.len() > MAX_PATH {
        return Err(bad(&format!("is longer than {MAX_PATH} characters")));
    }
    let p = p.strip_prefix("$.").unwrap_or(p);
    let mut steps = Vec::new();
    for (n, part) in p.split('.').enumerate() {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        // Only a path's first part may start with an index (`[2].a`).
        if key.is_empty() && (n != 0 || rest.is_empty()) {
            return Err(bad("has an empty key"));
        }
        if !key.is_empty() {
            if !key
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
            {
                return Err(bad(
                    "has a key with a character other than letters, digits, _ and -",
                ));
            }
            steps.push(PathStep::Key(key.to_string()));
        }
        while !rest.is_empty() {
            let Some(close) = rest.find(']') else {
                return Err(bad("has an unclosed ["));
            };
            let n: u32 = rest[1..close]
                .parse()
                .map_err(|_| bad("has an index that is not a number"))?;
            steps.push(PathStep::Index(n));
            rest = &rest[close + 1..];
            if !rest.is_empty() && !rest.starts_with('[') {
                return Err(bad("has text after ]"));
            }
        }
    }
    if steps.is_empty() {
        return Err(bad("is empty"));
    }
    if steps.len() > MAX_PATH_DEPTH {
        return Err(bad(&format!("is deeper than {MAX_PATH_DEPTH}")));
    }
    Ok(steps)
}

/// The value compared with: a JSON scalar (`"bob"`, `42`, `true`, `null`); text that is not
/// JSON is taken as a string, so `bob` finds `"bob"`. Returned in serde_json's compact form, the
/// form args are stored in.
pub fn json_value(v: &str) -> Result<String, String> {
    if v.len() > MAX_TEXT {
        return Err(format!("args_value must be at most {MAX_TEXT} bytes"));
    }
    let value = match serde_json::from_str::<serde_json::Value>(v) {
        Ok(x) => {
            // Compared as a double, it would match nothing stored.
            crate::validate::exact_integers(v.as_bytes())
                .map_err(|e| format!("args_value: {e}"))?;
            x
        }
        Err(_) => serde_json::Value::String(v.to_string()),
    };
    if value.is_object() || value.is_array() {
        return Err("args_value must be a string, number, true, false or null".into());
    }
    if value.as_str().is_some_and(|s| s.contains('\0')) {
        return Err("args_value must not contain NUL".into());
    }
    serde_json::to_string(&value).map_err(|e| format!("args_value: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_prefixes_become_bounds() {
        let (lo, hi) = id_range("0193AB").unwrap();
        assert_eq!(lo.to_string(), "0193ab00-0000-0000-0000-000000000000");
        assert_eq!(hi.to_string(), "0193abff-ffff-ffff-ffff-ffffffffffff");
        let whole = "0193ab12-3456-7890-abcd-ef0123456789";
        assert_eq!(
            id_range(whole).unwrap(),
            (whole.parse().unwrap(), whole.parse().unwrap())
        );
        for bad in ["", "xyz", "%", "0193_", &"a".repeat(33), "' OR 1=1 --"] {
            assert!(id_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_parse_or_are_refused() {
        use PathStep::*;
        assert_eq!(
            parse_path("items[0].sku").unwrap(),
            vec![Key("items".into()), Index(0), Key("sku".into())]
        );
        assert_eq!(parse_path("$.a").unwrap(), vec![Key("a".into())]);
        assert_eq!(parse_path("[2][3]").unwrap(), vec![Index(2), Index(3)]);
        for bad in [
            "",
            ".",
            "a..b",
            "a.",
            "a[",
            "a[x]",
            "a[-1]",
            "a]b",
            "a[0]b",
            "a\"b",
            "a'b",
            "a b",
            "a;DROP",
            "a[99999999999]",
        ] {
            assert!(parse_path(bad).is_err(), "{bad:?}");
        }
        assert!(parse_path("a.".repeat(17).trim_end_matches('.')).is_err());
        assert!(parse_path(&"a".repeat(300)).is_err());
        let s = JobSearch {
            args_path: Some(parse_path("a[1].b").unwrap()),
            ..Default::default()
        };
        assert_eq!(s.sqlite_path().unwrap(), "$.\"a\"[1].\"b\"");
        assert_eq!(s.postgres_path().unwrap(), vec!["a", "1", "b"]);
    }

    #[test]
    fn values_are_scalars_in_stored_form() {
        assert_eq!(json_value("\"bob\"").unwrap(), "\"bob\"");
        assert_eq!(json_value("bob").unwrap(), "\"bob\"");
        assert_eq!(json_value("42").unwrap(), "42");
        assert_eq!(json_value("true").unwrap(), "true");
        assert_eq!(json_value("100%_x").unwrap(), "\"100%_x\"");
        assert!(json_value("{\"a\":1}").is_err());
        assert!(json_value("[1]").is_err());
        // Compared as the double it would be read as, it would match nothing: refused.
        let e = json_value("123456789012345678901234567890").unwrap_err();
        assert!(e.contains("does not fit in 64 bits"), "{e}");
        assert_eq!(
            json_value("18446744073709551615").unwrap(),
            "18446744073709551615"
        );
        assert!(json_value(&"x".repeat(MAX_TEXT + 1)).is_err());
        assert!(json_value("\"a\\u0000b\"").is_err());
    }

    #[test]
    fn raw_searches_are_checked() {
        let ok = JobSearch::parse(&RawSearch {
            state: Some("failed"),
            created_from: Some("2026-01-01T00:00:00Z"),
            created_to: Some("1800000000000000"),
            args_contains: Some("50%_off"),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.created_from, Some(1_767_225_600_000_000));
        assert_eq!(ok.args_contains.as_deref(), Some("50%_off"));
        for bad in [
            RawSearch {
                state: Some("nope"),
                ..Default::default()
            },
            RawSearch {
                created_from: Some("yesterday"),
                ..Default::default()
            },
            RawSearch {
                created_from: Some("20"),
                created_to: Some("10"),
                ..Default::default()
            },
            RawSearch {
                args_path: Some("a"),
                ..Default::default()
            },
            RawSearch {
                args_value: Some("1"),
                ..Default::default()
            },
            RawSearch {
                args_contains: Some("a\0"),
                ..Default::default()
            },
            RawSearch {
                queue: Some(&"q".repeat(201)),
                ..Default::default()
            },
        ] {
            assert!(JobSearch::parse(&bad).is_err(), "{bad:?}");
        }
    }
}

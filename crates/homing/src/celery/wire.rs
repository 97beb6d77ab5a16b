//! Celery's wire format, both ways: decoding a kombu envelope carrying a Celery protocol v2
//! message into what homing needs to make a job of it, and encoding one that a stock Celery
//! worker runs. Only the JSON serializer is accepted: a pickle body would run arbitrary code on
//! decode, and homing cannot run Python objects anyway.
//!
//! The shapes (checked against the Celery and kombu releases pinned in `scripts/celery-venv`):
//! the envelope is a JSON object `{body, content-encoding, content-type, headers, properties}`;
//! `properties.body_encoding` is `base64`; the body decodes to `[args, kwargs, embed]` where
//! `embed` holds the canvas (`callbacks`, `errbacks`, `chain`, `chord`); the headers carry `task`,
//! `id`, `eta`, `expires` (ISO 8601 or null), `retries`, `root_id`, `parent_id`, `ignore_result`.
//! Anything that does not fit is a [`Malformed`] with a reason, never a panic.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::job::JobId;
use crate::time::Micros;

/// The most bytes of an envelope kept in a dead record, so garbage cannot bloat the store.
pub const MAX_KEPT_PAYLOAD: usize = 64 * 1024;

/// A Celery task message, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: String,
    pub task: String,
    pub args: Vec<Value>,
    pub kwargs: Map<String, Value>,
    pub eta: Option<Micros>,
    pub expires: Option<Micros>,
    pub retries: u32,
    pub ignore_result: bool,
    pub root_id: Option<String>,
    pub parent_id: Option<String>,
    pub priority: u8,
}

/// Why an envelope cannot be run, with whatever identity could still be read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed {
    pub reason: String,
    pub id: Option<String>,
    pub task: Option<String>,
}

impl Malformed {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            id: None,
            task: None,
        }
    }
}

impl Message {
    /// The homing job input: kwargs alone, or `{"args": [...], "kwargs": {...}}` when there are
    /// positional arguments (docs/design.md section 9).
    pub fn input(&self) -> Value {
        if self.args.is_empty() {
            Value::Object(self.kwargs.clone())
        } else {
            json!({ "args": self.args, "kwargs": self.kwargs })
        }
    }

    pub fn job_id(&self) -> JobId {
        job_id(&self.id)
    }
}

/// The homing job id of a Celery task id: the id itself when it is a UUID (Celery's default),
/// else a name-based UUID of it, so the same task id always names the same job.
pub fn job_id(task_id: &str) -> JobId {
    task_id
        .parse()
        .unwrap_or_else(|_| uuid::Uuid::new_v5(&NAMESPACE, task_id.as_bytes()))
}

/// The namespace of name-based job ids made from Celery task ids or envelopes.
const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6b1c_5d0e_4a53_4f2b_9c1e_3f7a_c0e1_1e55);

/// A stable job id for an envelope that has no usable task id: the same bytes, the same id, so a
/// garbage message put back after a crash is recorded once.
pub fn garbage_id(payload: &[u8]) -> JobId {
    uuid::Uuid::new_v5(&NAMESPACE, payload)
}

fn text<'a>(v: &'a Value, what: &str) -> Result<Option<&'a str>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        other => Err(format!(
            "header '{what}' must be a string or null, not {other}"
        )),
    }
}

/// Decodes one envelope as kombu's Redis transport stores it.
pub fn decode(payload: &[u8]) -> Result<Message, Malformed> {
    let env: Value = serde_json::from_slice(payload)
        .map_err(|e| Malformed::new(format!("the envelope is not JSON: {e}")))?;
    let Value::Object(env) = env else {
        return Err(Malformed::new("the envelope is not a JSON object"));
    };
    let headers = match env.get("headers") {
        Some(Value::Object(h)) => h.clone(),
        _ => return Err(Malformed::new("the envelope has no headers object")),
    };
    let id = headers
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let task = headers
        .get("task")
        .and_then(Value::as_str)
        .map(str::to_string);
    let fail = |reason: String| Malformed {
        reason,
        id: id.clone(),
        task: task.clone(),
    };
    let (Some(id_s), Some(task_s)) = (id.clone(), task.clone()) else {
        return Err(fail(
            "headers lack 'task' or 'id': not a Celery protocol 2 message (protocol 1 is not supported)"
                .into(),
        ));
    };
    if id_s.is_empty() || id_s.len() > 200 {
        return Err(fail("the task id must be 1-200 bytes".into()));
    }
    if let Err(e) = crate::client::validate_name("task", &task_s) {
        return Err(fail(e.to_string()));
    }
    let content_type = env.get("content-type").and_then(Value::as_str);
    if content_type != Some("application/json") {
        return Err(fail(format!(
            "content type {} is not supported: only the JSON serializer is (pickle and others are refused)",
            content_type.map_or("(none)".to_string(), |c| format!("'{c}'"))
        )));
    }
    if let Some(enc) = env.get("content-encoding").and_then(Value::as_str) {
        if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("utf8") {
            return Err(fail(format!("content encoding '{enc}' is not supported")));
        }
    }
    let props = env.get("properties").and_then(Value::as_object);
    let body_encoding = props
        .and_then(|p| p.get("body_encoding"))
        .and_then(Value::as_str);
    let Some(Value::String(body)) = env.get("body") else {
        return Err(fail("the envelope's body is not a string".into()));
    };
    let body = match body_encoding {
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(body.as_bytes())
            .map_err(|e| fail(format!("the body is not valid base64: {e}")))?,
        None => body.clone().into_bytes(),
        Some(other) => return Err(fail(format!("body encoding '{other}' is not supported"))),
    };
    let body_text = body;
    let body: Value = serde_json::from_slice(&body_text)
        .map_err(|e| fail(format!("the body is not JSON: {e}")))?;
    // Read as a double, such an integer would reach the task changed.
    crate::validate::exact_integers(&body_text).map_err(|e| fail(format!("the body: {e}")))?;
    let Value::Array(parts) = body else {
        return Err(fail(
            "the body is not a JSON array [args, kwargs, embed]".into(),
        ));
    };
    if parts.len() != 3 {
        return Err(fail(format!(
            "the body has {} parts; protocol 2 has three: [args, kwargs, embed]",
            parts.len()
        )));
    }
    let mut parts = parts.into_iter();
    let Some(Value::Array(args)) = parts.next() else {
        return Err(fail("the body's args are not an array".into()));
    };
    let kwargs = match parts.next() {
        Some(Value::Object(k)) => k,
        Some(Value::Null) => Map::new(),
        _ => return Err(fail("the body's kwargs are not an object".into())),
    };
    match parts.next() {
        Some(Value::Object(embed)) => {
            let canvas: Vec<&str> = ["callbacks", "errbacks", "chain", "chord"]
                .into_iter()
                .filter(|k| embed.get(*k).is_some_and(|v| !v.is_null()))
                .collect();
            if !canvas.is_empty() {
                return Err(fail(format!(
                    "canvas ({}) is not supported: run this workflow on Python workers",
                    canvas.join(", ")
                )));
            }
        }
        Some(Value::Null) => {}
        _ => return Err(fail("the body's embed part is not an object".into())),
    }
    let time = |name: &str| -> Result<Option<Micros>, Malformed> {
        match text(headers.get(name).unwrap_or(&Value::Null), name).map_err(&fail)? {
            None => Ok(None),
            Some(s) => parse_iso8601(s)
                .map(Some)
                .ok_or_else(|| fail(format!("header '{name}' is not an ISO 8601 time: {s:?}"))),
        }
    };
    let eta = time("eta")?;
    let expires = time("expires")?;
    let retries = match headers.get("retries") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| fail(format!("header 'retries' is not a count: {v}")))?,
    };
    let opt_text = |name: &str| -> Result<Option<String>, Malformed> {
        Ok(text(headers.get(name).unwrap_or(&Value::Null), name)
            .map_err(&fail)?
            .map(str::to_string))
    };
    let root_id = opt_text("root_id")?;
    let parent_id = opt_text("parent_id")?;
    let ignore_result = headers
        .get("ignore_result")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let priority = props
        .and_then(|p| p.get("priority"))
        .and_then(Value::as_u64)
        .map_or(0, |p| p.min(9) as u8);
    Ok(Message {
        id: id_s,
        task: task_s,
        args,
        kwargs,
        eta,
        expires,
        retries,
        ignore_result,
        root_id,
        parent_id,
        priority,
    })
}

/// A Celery message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub id: String,
    pub task: String,
    pub queue: String,
    pub args: Vec<Value>,
    pub kwargs: Map<String, Value>,
    pub eta: Option<Micros>,
    pub expires: Option<Micros>,
    pub priority: u8,
}

/// A random UUID in the textual form Celery gives task ids.
pub fn new_task_id() -> String {
    uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes())
        .into_uuid()
        .to_string()
}

/// The envelope a Celery producer would have written for `m` (protocol 2, JSON, base64 body).
pub fn encode(m: &Outgoing, origin: &str) -> String {
    let body = json!([
        m.args,
        m.kwargs,
        {"callbacks": null, "errbacks": null, "chain": null, "chord": null}
    ]);
    let argsrepr = serde_json::to_string(&m.args).unwrap_or_default();
    let kwargsrepr = serde_json::to_string(&m.kwargs).unwrap_or_default();
    let env = json!({
        "body": base64::engine::general_purpose::STANDARD.encode(body.to_string()),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": m.task,
            "id": m.id,
            "shadow": null,
            "eta": m.eta.map(format_iso8601),
            "expires": m.expires.map(format_iso8601),
            "group": null,
            "group_index": null,
            "retries": 0,
            "timelimit": [null, null],
            "root_id": m.id,
            "parent_id": null,
            "argsrepr": argsrepr,
            "kwargsrepr": kwargsrepr,
            "origin": origin,
            "ignore_result": false,
        },
        "properties": {
            "correlation_id": m.id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": m.queue},
            "priority": m.priority.min(9),
            "body_encoding": "base64",
            "delivery_tag": new_task_id(),
        },
    });
    env.to_string()
}

/// Formats a time as Python's `datetime.isoformat()` does for an aware UTC time.
pub fn format_iso8601(t: Micros) -> String {
    let t = t.clamp(0, crate::time::LAST_PRINTABLE);
    let st = std::time::UNIX_EPOCH + std::time::Duration::from_micros(t as u64);
    let s = humantime::format_rfc3339_micros(st).to_string();
    format!("{}+00:00", s.trim_end_matches('Z'))
}

/// Parses ISO 8601 as Celery writes it: `YYYY-MM-DDTHH:MM:SS[.ffffff][Z|±HH:MM]`; a time
/// without an offset is read as UTC (Celery's default `enable_utc`).
pub fn parse_iso8601(s: &str) -> Option<Micros> {
    let s = s.trim();
    if !s.is_ascii() || s.len() < 19 || s.len() > 40 {
        return None;
    }
    let (base, offset_secs) = if let Some(b) = s.strip_suffix('Z') {
        (b, 0i64)
    } else {
        let tail = &s[19..];
        match tail.rfind(['+', '-']) {
            Some(i) => {
                let at = 19 + i;
                let (b, off) = s.split_at(at);
                let sign = if off.starts_with('-') { -1 } else { 1 };
                let digits = off[1..].replace(':', "");
                if digits.len() != 4 || !digits.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                let h: i64 = digits[..2].parse().ok()?;
                let m: i64 = digits[2..].parse().ok()?;
                (b, sign * (h * 3600 + m * 60))
            }
            None => (s, 0),
        }
    };
    let st = humantime::parse_rfc3339_weak(base).ok()?;
    let local = i64::try_from(st.duration_since(std::time::UNIX_EPOCH).ok()?.as_micros()).ok()?;
    Some(local - offset_secs * 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An envelope exactly as Celery 5.4 / kombu 5.4 wrote it for
    /// `send_task('demo.add', args=[1, 2], kwargs={'x': 3}, queue='ocr', countdown=5,
    /// expires=60, priority=7)`.
    const REAL: &str = r#"{"body": "W1sxLCAyXSwgeyJ4IjogM30sIHsiY2FsbGJhY2tzIjogbnVsbCwgImVycmJhY2tzIjogbnVsbCwgImNoYWluIjogbnVsbCwgImNob3JkIjogbnVsbH1d", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"lang": "py", "task": "demo.add", "id": "1037f2aa-ab5e-4598-8fa9-8b11acd878e7", "shadow": null, "eta": "2026-11-29T11:59:59.778618+00:00", "expires": "2026-11-29T12:00:54.778618+00:00", "group": null, "group_index": null, "retries": 0, "timelimit": [null, null], "root_id": "1037f2aa-ab5e-4598-8fa9-8b11acd878e7", "parent_id": null, "argsrepr": "[1, 2]", "kwargsrepr": "{'x': 3}", "origin": "gen9270@vm", "ignore_result": false, "replaced_task_nesting": 0, "stamped_headers": null, "stamps": {}}, "properties": {"correlation_id": "1037f2aa-ab5e-4598-8fa9-8b11acd878e7", "reply_to": "d73ff81a-672d-38f3-a4f7-96b66c47e906", "delivery_mode": 2, "expiration": "60000", "delivery_info": {"exchange": "", "routing_key": "ocr"}, "priority": 7, "body_encoding": "base64", "delivery_tag": "7a2cb5b6-ecbf-482f-9385-30164a66253d"}}"#;

    #[test]
    fn decodes_a_real_celery_message() {
        let m = decode(REAL.as_bytes()).unwrap();
        assert_eq!(m.task, "demo.add");
        assert_eq!(m.id, "1037f2aa-ab5e-4598-8fa9-8b11acd878e7");
        assert_eq!(m.job_id().to_string(), m.id);
        assert_eq!(m.input(), json!({"args": [1, 2], "kwargs": {"x": 3}}));
        assert_eq!(m.priority, 7);
        assert_eq!(
            m.eta.map(format_iso8601).as_deref(),
            Some("2026-11-29T11:59:59.778618+00:00")
        );
        assert_eq!(m.expires.unwrap() - m.eta.unwrap(), 55_000_000);
        assert_eq!(m.root_id.as_deref(), Some(m.id.as_str()));
        assert!(!m.ignore_result);
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let mut kwargs = Map::new();
        kwargs.insert("name".into(), json!("한글"));
        let out = Outgoing {
            id: new_task_id(),
            task: "tasks.add".into(),
            queue: "q".into(),
            args: vec![],
            kwargs,
            eta: Some(1_700_000_000_123_456),
            expires: None,
            priority: 3,
        };
        let m = decode(encode(&out, "test@host").as_bytes()).unwrap();
        assert_eq!(m.id, out.id);
        assert_eq!(m.input(), json!({"name": "한글"}));
        assert_eq!(m.eta, out.eta);
        assert_eq!(m.priority, 3);
        assert!(out.id.parse::<uuid::Uuid>().unwrap().get_version_num() == 4);
    }

    #[test]
    fn iso_times_with_offsets() {
        let utc = parse_iso8601("2024-01-02T03:04:05.5+00:00").unwrap();
        assert_eq!(parse_iso8601("2024-01-02T03:04:05.500Z"), Some(utc));
        assert_eq!(parse_iso8601("2024-01-02T03:04:05.5"), Some(utc));
        assert_eq!(
            parse_iso8601("2024-01-02T12:04:05.5+09:00"),
            Some(utc),
            "KST"
        );
        assert_eq!(parse_iso8601("2024-01-01T22:04:05.5-05:00"), Some(utc));
        for bad in [
            "",
            "tomorrow",
            "2024-01-02",
            "2024-01-02T03:04:05+9",
            "2024-01-02T03:04:05+ab:cd",
        ] {
            assert_eq!(parse_iso8601(bad), None, "{bad}");
        }
    }

    #[test]
    fn malformed_envelopes_say_why() {
        let mut env: Value = serde_json::from_str(REAL).unwrap();
        let reason = |env: &Value| decode(env.to_string().as_bytes()).unwrap_err().reason;

        let mut e = env.clone();
        e["body"] = json!("%%% not base64");
        assert!(reason(&e).contains("base64"), "{}", reason(&e));

        let mut e = env.clone();
        e["body"] = json!(base64::engine::general_purpose::STANDARD.encode("[1, 2"));
        assert!(reason(&e).contains("not JSON"), "{}", reason(&e));

        let mut e = env.clone();
        e["content-type"] = json!("application/x-python-serialize");
        let r = decode(e.to_string().as_bytes()).unwrap_err();
        assert!(r.reason.contains("pickle"), "{}", r.reason);
        assert_eq!(
            r.id.as_deref(),
            Some("1037f2aa-ab5e-4598-8fa9-8b11acd878e7")
        );
        assert_eq!(r.task.as_deref(), Some("demo.add"));

        let mut e = env.clone();
        e["body"] = json!(base64::engine::general_purpose::STANDARD
            .encode("[[123456789012345678901234567890], {}, {}]"));
        let r = reason(&e);
        assert!(
            r.contains("the integer 123456789012345678901234567890 does not fit in 64 bits"),
            "{r}"
        );

        env["headers"]["eta"] = json!("soon");
        assert!(reason(&env).contains("eta"), "{}", reason(&env));
        assert!(decode(b"\xff\xfe").unwrap_err().reason.contains("not JSON"));
    }

    #[test]
    fn non_uuid_task_ids_get_stable_job_ids() {
        assert_eq!(job_id("order-42"), job_id("order-42"));
        assert_ne!(job_id("order-42"), job_id("order-43"));
    }

    /// Random and corrupted envelopes never panic the decoder.
    #[test]
    fn fuzz_random_and_mutated_envelopes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let seeds: Vec<Vec<u8>> = vec![
            REAL.as_bytes().to_vec(),
            encode(
                &Outgoing {
                    id: "x".into(),
                    task: "t".into(),
                    queue: "q".into(),
                    args: vec![json!(1), json!({"a": [null, 2.5]})],
                    kwargs: Map::new(),
                    eta: None,
                    expires: Some(0),
                    priority: 9,
                },
                "o",
            )
            .into_bytes(),
        ];
        let mut decoded = 0;
        for i in 0..20_000 {
            let mut b = seeds[i % seeds.len()].clone();
            match rng.u8(0..5) {
                0 => {
                    for _ in 0..rng.usize(1..8) {
                        let at = rng.usize(..b.len());
                        b[at] = rng.u8(..);
                    }
                }
                1 => b.truncate(rng.usize(..b.len())),
                2 => {
                    let at = rng.usize(..b.len());
                    b.insert(at, rng.choice(*b"{}[]\",:0\\ ").unwrap());
                }
                3 => b = (0..rng.usize(..200)).map(|_| rng.u8(..)).collect(),
                _ => {
                    // Valid JSON envelope with a random body, so the body decoder is reached.
                    let mut env: Value = serde_json::from_slice(&seeds[0]).unwrap();
                    let junk: Vec<u8> = (0..rng.usize(..64)).map(|_| rng.u8(..)).collect();
                    env["body"] = json!(base64::engine::general_purpose::STANDARD.encode(junk));
                    b = env.to_string().into_bytes();
                }
            }
            if decode(&b).is_ok() {
                decoded += 1;
            }
        }
        assert!(decoded < 20_000);
    }
}

/// Property tests: whatever bytes or envelope shapes arrive, the decoder answers (a message or
/// a reason) without panicking, and what it accepts survives an encode → decode round trip.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A header value: usually plausible, often not.
    fn header(plausible: &'static [&'static str]) -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(plausible).prop_map(Value::from),
            json_leaf(),
            ".{0,300}".prop_map(Value::from),
        ]
    }

    fn envelope() -> impl Strategy<Value = Vec<u8>> {
        let body = prop_oneof![
            (json_value(), json_value(), json_value())
                .prop_map(|(a, k, e)| json!([a, k, e]).to_string().into_bytes()),
            (prop::collection::vec(json_value(), 0..4), any::<bool>()).prop_map(|(a, deep)| {
                let args = if deep {
                    crate::validate::nested(130, json!(1))
                } else {
                    Value::from(a)
                };
                format!("[{args}, {{}}, null]").into_bytes()
            }),
            prop::collection::vec(any::<u8>(), 0..64),
        ];
        (
            body,
            any::<bool>(),
            header(&["1037f2aa-ab5e-4598-8fa9-8b11acd878e7", "order-42", ""]),
            header(&["tasks.add", "builtin.webhook", "a b", "x/y"]),
            header(&[
                "2026-11-29T11:59:59.778618+00:00",
                "1970-01-01T00:00:00+01:00",
                "9999-12-31T23:59:59Z",
                "9999-12-31T23:59:59-05:00",
            ]),
            header(&["application/json", "application/x-python-serialize"]),
            json_leaf(),
            json_leaf(),
        )
            .prop_map(|(body, b64, id, task, eta, ctype, retries, priority)| {
                let body_text = if b64 {
                    base64::engine::general_purpose::STANDARD.encode(&body)
                } else {
                    String::from_utf8_lossy(&body).into_owned()
                };
                json!({
                    "body": body_text,
                    "content-type": ctype,
                    "content-encoding": "utf-8",
                    "headers": {"id": id, "task": task, "eta": eta, "expires": eta.clone(),
                                "retries": retries, "root_id": id.clone(), "parent_id": null},
                    "properties": {"body_encoding": if b64 { json!("base64") } else { json!(null) },
                                   "priority": priority},
                })
                .to_string()
                .into_bytes()
            })
    }

    /// Equal JSON, floats within one part in 10¹⁵: serde_json (without its slower
    /// `float_roundtrip` parser) may read a printed float back one unit in the last place off.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
                let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    fn check_round_trip(m: &Message) {
        assert!(!m.id.is_empty() && m.id.len() <= 200);
        assert!(
            crate::validate::name("task", &m.task).is_ok(),
            "{:?}",
            m.task
        );
        let out = Outgoing {
            id: m.id.clone(),
            task: m.task.clone(),
            queue: "q".into(),
            args: m.args.clone(),
            kwargs: m.kwargs.clone(),
            eta: m
                .eta
                .filter(|t| (0..=crate::time::LAST_PRINTABLE).contains(t)),
            expires: None,
            priority: m.priority,
        };
        let again = decode(encode(&out, "prop").as_bytes()).expect("re-encoded message decodes");
        assert_eq!(again.id, m.id);
        assert_eq!(again.task, m.task);
        assert!(same(
            &Value::from(again.args.clone()),
            &Value::from(m.args.clone())
        ));
        assert!(same(
            &Value::Object(again.kwargs),
            &Value::Object(m.kwargs.clone())
        ));
        assert_eq!(again.eta, out.eta);
        assert_eq!(again.priority, m.priority);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&b);
        }

        #[test]
        fn envelopes_decode_or_say_why(env in envelope()) {
            match decode(&env) {
                Ok(m) => check_round_trip(&m),
                Err(e) => prop_assert!(!e.reason.is_empty()),
            }
        }
    }
}

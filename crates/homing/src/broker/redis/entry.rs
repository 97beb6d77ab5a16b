//! Turns raw stream replies into deliveries and dead letters. Anyone with access to Redis can
//! `XADD` anything to a queue stream, so nothing here trusts the fields: an entry that does not
//! name a job still becomes a [`Delivery`] (with `job: Err(reason)`), which the worker
//! dead-letters. Only a reply whose *shape* is not what Redis sends is an error.
//!
//! Replies are read as [`::redis::Value`] rather than through redis-rs's typed stream replies,
//! because those need field names to be UTF-8 and would reject the whole batch (leaving its
//! entries reserved by nobody who will ever process them) on one binary field.

use ::redis::Value;

use crate::broker::{DeadLetter, Delivery};
use crate::job::JobId;

/// The field of a message that names its job.
pub const JOB_FIELD: &str = "job";

/// One stream entry as Redis returned it. `fields` is `None` for an entry that was deleted
/// while still pending (Redis reports such entries with a nil body). `count` is how many times
/// it was delivered, part of its delivery's tag.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: String,
    pub count: u64,
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl Entry {
    /// The delivery of this entry of `queue`'s stream of priority band `band`.
    pub fn into_delivery(self, queue: &str, band: i8) -> Delivery {
        let job = match &self.fields {
            None => Err("the message was deleted from the stream".to_string()),
            Some(fields) => job_of(fields),
        };
        Delivery {
            tag: Tag {
                id: self.id,
                count: self.count,
                band,
            }
            .to_string(),
            queue: queue.to_string(),
            job,
        }
    }
}

/// A delivery's tag: `<entry id>.<delivery count>` for a message of priority band 0, and
/// `<entry id>.<delivery count>.<band>` for one of another band (which names the stream the entry
/// is in; tags made before bands existed are band 0). The count changes every time the message
/// changes hands, so an old delivery's tag never matches the message's current owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    pub id: String,
    pub count: u64,
    pub band: i8,
}

impl Tag {
    /// `None` for anything that is not a tag this broker made (it then names nothing here).
    pub fn parse(tag: &str) -> Option<Tag> {
        let (id, rest) = tag.split_once('.')?;
        let (count, band) = match rest.split_once('.') {
            None => (rest, 0),
            Some((count, text)) => {
                // Only the spelling `Display` writes, so one delivery has one tag.
                let band: i8 = text.parse().ok()?;
                if band == 0 || !super::keys::BANDS.contains(&band) || band.to_string() != text {
                    return None;
                }
                (count, band)
            }
        };
        if !is_entry_id(id)
            || count.is_empty()
            || count.len() > 19
            || !count.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some(Tag {
            id: id.to_string(),
            count: count.parse().ok()?,
            band,
        })
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.band == 0 {
            write!(f, "{}.{}", self.id, self.count)
        } else {
            write!(f, "{}.{}.{}", self.id, self.count, self.band)
        }
    }
}

/// The job an entry names: exactly one `job` field holding a job id. Extra fields are allowed
/// (a newer producer may add some); anything else is a reason to dead-letter.
pub fn job_of(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<JobId, String> {
    let mut jobs = fields.iter().filter(|(k, _)| k == JOB_FIELD.as_bytes());
    let (Some((_, v)), None) = (jobs.next(), jobs.next()) else {
        return Err(format!(
            "undecodable message {}: expected exactly one '{JOB_FIELD}' field",
            describe(fields)
        ));
    };
    let text = std::str::from_utf8(v)
        .map_err(|_| format!("undecodable message {}: job is not UTF-8", describe(fields)))?;
    text.trim()
        .parse::<JobId>()
        .map_err(|e| format!("undecodable message {}: {e}", describe(fields)))
}

/// A short, printable rendering of an entry's fields for error messages.
fn describe(fields: &[(Vec<u8>, Vec<u8>)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&format!(
            "{:?}: {:?}",
            String::from_utf8_lossy(k),
            String::from_utf8_lossy(v)
        ));
        if s.len() > 200 {
            cut(&mut s, 200);
            s.push('…');
            break;
        }
    }
    s.push('}');
    s
}

fn shape(what: &str, v: &Value) -> String {
    let mut s = format!("unexpected reply shape for {what}: {v:?}");
    cut(&mut s, 300);
    s
}

/// Shortens `s` to at most `max` bytes on a character boundary (`String::truncate` panics
/// inside a character, and these texts hold whatever bytes someone wrote to Redis).
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
}

pub fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Okay => Some(b"OK".to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes().to_vec()),
        _ => None,
    }
}

pub fn string(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => string(other)?.parse().ok(),
    }
}

/// The items of an array reply (`nil` reads as empty).
pub fn items(v: Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) | Value::Set(items) => Ok(items),
        other => Err(shape("an array", &other)),
    }
}

/// `{{id, {field, value, ...} | nil}, ...}`: the body of `XRANGE`, `XREVRANGE`, and of each
/// stream in `XREADGROUP … >` (a first delivery: count 1).
pub fn entries(v: Value) -> Result<Vec<Entry>, String> {
    items(v)?.into_iter().map(|e| entry(e, false)).collect()
}

/// `{{id, count, {field, value, ...}}, ...}`: what the scripts return for pending entries.
pub fn counted_entries(v: Value) -> Result<Vec<Entry>, String> {
    items(v)?.into_iter().map(|e| entry(e, true)).collect()
}

/// `{{id, count, {field, value, ...}, i}, ...}`: what the `RESERVE` script returns, `i` being the
/// 1-based position of the entry's stream among the script's keys.
pub fn indexed_entries(v: Value) -> Result<Vec<(usize, Entry)>, String> {
    items(v)?
        .into_iter()
        .map(|row| {
            // The reply's text goes into the error only when it is wrong: every reserved entry
            // passes here, and describing each one cost the worker's thread more than reading it.
            let read = match &row {
                Value::Array(parts) | Value::Set(parts) if parts.len() == 4 => int(&parts[3])
                    .and_then(|i| usize::try_from(i).ok())
                    .zip(entry_of(&parts[..3], true)),
                _ => None,
            };
            read.ok_or_else(|| shape("a reserved entry", &row))
        })
        .collect()
}

fn entry(v: Value, counted: bool) -> Result<Entry, String> {
    let read = match &v {
        Value::Nil => None,
        Value::Array(parts) | Value::Set(parts) => entry_of(parts, counted),
        _ => None,
    };
    read.ok_or_else(|| shape("a stream entry", &v))
}

/// An entry from its parts (`id`, the delivery count when `counted`, the fields), or `None`
/// when they are not what Redis sends.
fn entry_of(parts: &[Value], counted: bool) -> Option<Entry> {
    let mut parts = parts.iter();
    let id = string(parts.next()?)?;
    let count = if counted {
        int(parts.next()?)?.max(0) as u64
    } else {
        1
    };
    let fields = match parts.next() {
        None | Some(Value::Nil) => None,
        Some(Value::Map(pairs)) => Some(
            pairs
                .iter()
                .map(|(k, v)| (bytes(k).unwrap_or_default(), bytes(v).unwrap_or_default()))
                .collect(),
        ),
        Some(Value::Array(flat) | Value::Set(flat)) => Some(
            flat.chunks_exact(2)
                .map(|kv| {
                    (
                        bytes(&kv[0]).unwrap_or_default(),
                        bytes(&kv[1]).unwrap_or_default(),
                    )
                })
                .collect(),
        ),
        Some(_) => return None,
    };
    Some(Entry { id, count, fields })
}

/// The reply of `XREADGROUP … STREAMS k1 k2 …`: for each stream key that had entries, its
/// entries. `nil` (the block timed out) is no entries.
pub fn read_reply(v: Value) -> Result<Vec<(String, Vec<Entry>)>, String> {
    let streams: Vec<(Value, Value)> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs,
        Value::Array(list) => list
            .into_iter()
            .map(|s| match s {
                Value::Array(kv) | Value::Set(kv) if kv.len() >= 2 => {
                    let mut kv = kv.into_iter();
                    Ok((
                        kv.next().unwrap_or(Value::Nil),
                        kv.next().unwrap_or(Value::Nil),
                    ))
                }
                other => Err(shape("a stream", &other)),
            })
            .collect::<Result<_, String>>()?,
        other => return Err(shape("XREADGROUP", &other)),
    };
    streams
        .into_iter()
        .map(|(k, v)| {
            let key = string(&k).ok_or_else(|| shape("a stream key", &k))?;
            Ok((key, entries(v)?))
        })
        .collect()
}

/// A dead-letter stream entry, as written by the `DEAD_LETTER` script.
pub fn dead_letter(e: Entry) -> DeadLetter {
    let mut dl = DeadLetter {
        queue: String::new(),
        payload: String::new(),
        reason: String::new(),
        at: 0,
    };
    for (k, v) in e.fields.unwrap_or_default() {
        let v = String::from_utf8_lossy(&v).into_owned();
        match k.as_slice() {
            b"queue" => dl.queue = v,
            b"payload" => dl.payload = v,
            b"reason" => dl.reason = v,
            b"at" => dl.at = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    dl
}

/// Whether `id` looks like a stream entry id (`<ms>-<seq>`), so scripts never receive something
/// Redis would reject.
pub fn is_entry_id(id: &str) -> bool {
    match id.split_once('-') {
        Some((ms, seq)) => {
            !ms.is_empty()
                && !seq.is_empty()
                && ms.bytes().all(|b| b.is_ascii_digit())
                && seq.bytes().all(|b| b.is_ascii_digit())
                && ms.len() <= 20
                && seq.len() <= 20
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    #[test]
    fn a_job_field_decodes() {
        let id = crate::job::new_job_id();
        let fields = vec![(b"job".to_vec(), id.to_string().into_bytes())];
        assert_eq!(job_of(&fields), Ok(id));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for fields in [
            vec![],
            vec![(b"job".to_vec(), b"not-a-uuid".to_vec())],
            vec![(b"job".to_vec(), vec![0xff, 0xfe])],
            vec![(vec![0xff], vec![0x00])],
            vec![
                (b"job".to_vec(), b"a".to_vec()),
                (b"job".to_vec(), b"b".to_vec()),
            ],
        ] {
            let e = job_of(&fields).unwrap_err();
            assert!(e.starts_with("undecodable message"), "{e}");
        }
    }

    #[test]
    fn read_reply_keeps_binary_fields() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"k"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk(b"1-0"),
                    Value::Array(vec![bulk(&[0xff]), bulk(b"x")]),
                ]),
                Value::Array(vec![bulk(b"2-0"), Value::Nil]),
            ]),
        ])]);
        let got = read_reply(reply).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "k");
        assert_eq!(got[0].1[0].fields, Some(vec![(vec![0xff], b"x".to_vec())]));
        assert_eq!(got[0].1[1].fields, None);
        let d = got[0].1[1].clone().into_delivery("q", 0);
        assert!(d.job.is_err());
        assert_eq!(d.tag, "2-0.1", "a first delivery has count 1");
        assert_eq!(read_reply(Value::Nil).unwrap(), vec![]);
        assert!(read_reply(Value::Int(3)).is_err());
    }

    #[test]
    fn reserved_entries_decode_and_a_bad_row_is_shown_in_its_error() {
        let row = |id: &[u8], count: Value, fields: Value, i: i64| {
            Value::Array(vec![bulk(id), count, fields, Value::Int(i)])
        };
        let reply = Value::Array(vec![
            row(
                b"1-0",
                Value::Int(3),
                Value::Array(vec![bulk(b"job"), bulk(b"x")]),
                2,
            ),
            row(b"2-0", bulk(b"1"), Value::Nil, 1),
        ]);
        let got = indexed_entries(reply).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 2);
        assert_eq!(
            got[0].1,
            Entry {
                id: "1-0".into(),
                count: 3,
                fields: Some(vec![(b"job".to_vec(), b"x".to_vec())]),
            }
        );
        assert_eq!((got[1].0, got[1].1.count, &got[1].1.fields), (1, 1, &None));

        let bad = [
            // three parts, an index that is no number, a count that is no number, fields that
            // are neither a list nor a map, a row that is not a list
            Value::Array(vec![bulk(b"1-0"), Value::Int(1), Value::Nil]),
            row(b"1-0", Value::Int(1), Value::Nil, -1),
            row(b"1-0", bulk(b"many"), Value::Nil, 1),
            row(b"1-0", Value::Int(1), Value::Int(7), 1),
            bulk(b"1-0"),
        ];
        for b in bad {
            let e = indexed_entries(Value::Array(vec![b.clone()])).unwrap_err();
            assert!(
                e.starts_with("unexpected reply shape for a reserved entry"),
                "{e}"
            );
            assert!(e.contains("1-0"), "the row is shown: {e}");
        }
        assert!(counted_entries(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(entries(Value::Array(vec![Value::Array(vec![
            bulk(b"1-0"),
            Value::Int(7)
        ])]))
        .is_err());
    }

    #[test]
    fn tags_round_trip_and_reject_garbage() {
        let t = Tag::parse("1700000000000-3.2").unwrap();
        assert_eq!((t.id.as_str(), t.count, t.band), ("1700000000000-3", 2, 0));
        assert_eq!(t.to_string(), "1700000000000-3.2");
        let t = Tag::parse("1700000000000-3.2.-3").unwrap();
        assert_eq!((t.id.as_str(), t.count, t.band), ("1700000000000-3", 2, -3));
        assert_eq!(t.to_string(), "1700000000000-3.2.-3");
        assert_eq!(Tag::parse("1-0.1.2").unwrap().band, 2);
        for bad in [
            "1700000000000-3",
            "x-1.1",
            "1-1.",
            "1-1.x",
            "17.1",
            "",
            "1-1.+1",
            "1-1.1.0",
            "1-1.1.4",
            "1-1.1.+2",
            "1-1.1.02",
            "1-1.1.",
            "1-1.1.2.3",
        ] {
            assert_eq!(Tag::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn entry_ids_are_checked() {
        assert!(is_entry_id("1700000000000-0"));
        assert!(!is_entry_id("17"));
        assert!(!is_entry_id("a-b"));
        assert!(!is_entry_id("-1"));
        assert!(!is_entry_id("1-"));
    }
}

/// Property tests: whatever Redis (or someone writing to it) returns, decoding answers entries
/// or a reason without panicking, and every entry becomes a delivery whose tag parses back.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            prop::collection::vec(any::<u8>(), 0..48).prop_map(Value::BulkString),
            // Plausible ids and job fields, so the deeper paths are reached.
            prop::sample::select(vec!["1-0", "1700000000000-3", "job", "x-1"])
                .prop_map(|s| Value::BulkString(s.as_bytes().to_vec())),
            Just(Value::BulkString(
                b"0190f5a2-8c7e-7b1a-9d3e-2f4a6b8c0d1e".to_vec()
            )),
            ".{0,80}".prop_map(Value::SimpleString),
            any::<f64>().prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
        ]
    }

    fn reply() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
                prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
            ]
        })
    }

    fn check(e: Entry) {
        let _ = dead_letter(e.clone());
        for band in crate::broker::redis::keys::BANDS {
            let d = e.clone().into_delivery("q", band);
            // Counts come from Redis integers (at most 19 digits), so every tag of a real id
            // parses.
            if is_entry_id(&e.id) {
                assert_eq!(
                    Tag::parse(&d.tag).map(|t| (t.id, t.count, t.band)),
                    Some((e.id.clone(), e.count, band))
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn any_reply_decodes_or_says_why(v in reply()) {
            if let Ok(streams) = read_reply(v.clone()) {
                for (_, es) in streams {
                    es.into_iter().for_each(check);
                }
            }
            if let Ok(es) = entries(v.clone()) {
                es.into_iter().for_each(check);
            }
            if let Ok(es) = counted_entries(v.clone()) {
                es.into_iter().for_each(check);
            }
            if let Ok(es) = indexed_entries(v) {
                es.into_iter().for_each(|(_, e)| check(e));
            }
        }

        #[test]
        fn any_fields_name_a_job_or_say_why(
            fields in prop::collection::vec(
                (prop_oneof![Just(b"job".to_vec()), prop::collection::vec(any::<u8>(), 0..8)],
                 prop_oneof![
                     Just(b"0190f5a2-8c7e-7b1a-9d3e-2f4a6b8c0d1e".to_vec()),
                     prop::collection::vec(any::<u8>(), 0..300),
                     ".{0,300}".prop_map(String::into_bytes),
                 ]),
                0..5,
            )
        ) {
            match job_of(&fields) {
                Ok(_) => prop_assert_eq!(fields.iter().filter(|(k, _)| k == b"job").count(), 1),
                Err(e) => prop_assert!(e.starts_with("undecodable message")),
            }
        }

        #[test]
        fn tags_parse_or_not_without_panicking(s in ".{0,60}") {
            if let Some(t) = Tag::parse(&s) {
                prop_assert_eq!(t.to_string().len() <= s.len() + 20, true);
            }
        }
    }
}

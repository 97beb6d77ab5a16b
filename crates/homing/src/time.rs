//! Time as homing sees it: microseconds since the Unix epoch, behind a [`Clock`] so that
//! time-dependent logic (backoff, due dates, heartbeat expiry) can be tested without sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch. Stored as an integer in every backend so that comparisons
/// (due dates, expiry) are exact and cheap.
pub type Micros = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Micros;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        now()
    }
}

/// A clock that only moves when told to; for tests of time-dependent logic.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start: Micros) -> Self {
        Self(Arc::new(AtomicI64::new(start)))
    }
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(micros(by), Ordering::SeqCst);
    }
    pub fn set(&self, to: Micros) {
        self.0.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

/// The current wall-clock time.
pub fn now() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as Micros)
        .unwrap_or(0)
}

/// A duration in microseconds, saturating.
pub fn micros(d: Duration) -> Micros {
    d.as_micros().min(i64::MAX as u128) as Micros
}

/// The last instant RFC 3339 can write (9999-12-31T23:59:59.999999Z); the formatter panics
/// past it, so later times (a handler's absurd snooze) print as this one.
pub const LAST_PRINTABLE: Micros = 253_402_300_799_999_999;

/// Formats a timestamp as RFC 3339 UTC with millisecond precision; times before 1970 or after
/// year 9999 are shown at those bounds.
pub fn rfc3339(t: Micros) -> String {
    let st = UNIX_EPOCH + Duration::from_micros(t.clamp(0, LAST_PRINTABLE) as u64);
    humantime::format_rfc3339_millis(st).to_string()
}

/// Parses an RFC 3339 UTC timestamp (as [`rfc3339`] prints it).
pub fn parse_rfc3339(s: &str) -> Option<Micros> {
    let st = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()?;
    Some(micros(st.duration_since(UNIX_EPOCH).ok()?))
}

/// The longest duration homing reads anywhere (100 years): beyond any useful setting, and far
/// below where arithmetic on it (microseconds in an `i64`, `Instant + d`) could overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses a human duration such as `500ms`, `2s`, `5m`, `1h 30m`. A bare number is seconds.
/// Never panics: negative, non-finite and longer-than-[`MAX_DURATION`] values are errors.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = if let Ok(secs) = s.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!(
                "invalid duration '{s}': must be a non-negative number"
            ));
        }
        // Checked before converting: Duration::from_secs_f64 panics past u64::MAX seconds.
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(too_long(s));
        }
        Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("invalid duration '{s}' ({e}); use forms like 500ms, 2s, 5m"))?
    };
    if d > MAX_DURATION {
        return Err(too_long(s));
    }
    Ok(d)
}

fn too_long(s: &str) -> String {
    format!("invalid duration '{s}': at most 100 years")
}

/// Parses a duration (as [`parse_duration`]) that must lie between `min` and `max`, inclusive:
/// the one parser behind every duration a user types (CLI flags, environment variables).
pub fn parse_duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min || d > max {
        return Err(format!(
            "'{}' is out of range: must be between {} and {}",
            s.trim(),
            format_duration(min),
            format_duration(max)
        ));
    }
    Ok(d)
}

/// A duration as `parse_duration` reads it back (`0s` for zero).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Serde helpers for `Option<Micros>` as RFC 3339 strings.
pub mod opt_rfc3339 {
    use super::Micros;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Micros>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(t) => s.serialize_str(&super::rfc3339(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Micros>, D::Error> {
        let v: Option<String> = Option::deserialize(d)?;
        match v {
            None => Ok(None),
            Some(s) => super::parse_rfc3339(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("invalid timestamp '{s}'"))),
        }
    }
}

/// Serde helpers for `Micros` as an RFC 3339 string.
pub mod as_rfc3339 {
    use super::Micros;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Micros, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::rfc3339(*v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Micros, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_rfc3339(&s).ok_or_else(|| serde::de::Error::custom("invalid timestamp"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_the_cli_documents() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn hostile_durations_are_errors_not_panics() {
        for bad in [
            "1e30",
            "-1e30",
            "inf",
            "NaN",
            "18446744073709551615s",
            "99999999999999999999999999s",
            "3154000000",
            "-5s",
            "",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_duration("100y").ok(),
            None,
            "just past 100 years of 365 days"
        );
        assert!(parse_duration("36500d").is_ok());
        let (lo, hi) = (Duration::from_millis(50), Duration::from_secs(3600));
        assert!(parse_duration_in("1s", lo, hi).is_ok());
        assert!(parse_duration_in("0s", lo, hi)
            .unwrap_err()
            .contains("between 50ms and 1h"));
        assert!(parse_duration_in("2h", lo, hi).is_err());
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn rfc3339_round_trips() {
        let t = 1_700_000_000_123_000;
        let s = rfc3339(t);
        assert_eq!(s, "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_rfc3339(&s), Some(t));
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(10);
        assert_eq!(c.now(), 10);
        c.advance(Duration::from_millis(1));
        assert_eq!(c.now(), 1010);
    }
}

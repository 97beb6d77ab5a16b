//! Cluster-wide limits of a queue (docs/limits.md): at most N jobs running at once, at most N
//! starts per period, either for the whole queue or per key computed from a job's arguments.
//!
//! This module is the pure half: what a limit is, how a job's key is computed, and whether a
//! start is admitted given what the store counted inside the start's transaction. The stores
//! count (running jobs, recorded starts) and apply; [`crate::transition::start_gated`] turns a
//! refusal into a park, so an over-limit job stays `queued` without spending anything.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

use crate::time::Micros;

/// The largest concurrency or rate count accepted: far above any real limit, and small enough
/// that counts fit every integer type the stores use.
pub const MAX_COUNT: u32 = 1_000_000;
/// The shortest and longest rate period accepted.
pub const MIN_PERIOD: Duration = Duration::from_millis(10);
pub const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// A key argument's name is at most this long (it is stored with the queue).
pub const MAX_KEY_ARG: usize = 200;
/// A key whose JSON text is longer than this is stored as a hash of it, so that any argument
/// value can be a key without growing the index.
const MAX_KEY_TEXT: usize = 128;

/// At most `count` starts in each window of `period`, windows aligned to the Unix epoch
/// ([`window_of`]): `10/1s` admits ten starts in each whole second of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
}

impl Rate {
    /// The period in microseconds (at most a day, so it fits).
    pub fn period_micros(&self) -> Micros {
        self.period.as_micros() as Micros
    }

    /// Parses `COUNT/PERIOD`, e.g. `10/1s`, `100/1m`, `5/500ms`; a bare unit is one of it
    /// (`10/s`, `100/m`, `1000/h`), the way Celery's `rate_limit` is written.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let s = s.trim();
        let Some((count, period)) = s.split_once('/') else {
            return Err(format!(
                "invalid rate '{s}': use COUNT/PERIOD, e.g. 10/1s or 100/1m"
            ));
        };
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("invalid rate '{s}': the count must be a whole number"))?;
        let period = period.trim();
        // Only a unit alone: `10/e3` must not become the number 1e3, nor `10/m30s` 1m30s.
        let unit_alone = !period.is_empty() && period.chars().all(|c| c.is_ascii_alphabetic());
        let period = if unit_alone {
            crate::time::parse_duration(&format!("1{period}")).map_err(|_| {
                format!(
                    "invalid rate '{s}': unknown unit '{period}'; use a duration such as 1s, \
                     500ms or 1m, or a unit alone (s, m, h)"
                )
            })?
        } else {
            crate::time::parse_duration(period).map_err(|e| format!("invalid rate '{s}': {e}"))?
        };
        let r = Rate { count, period };
        r.check()?;
        Ok(r)
    }

    fn check(&self) -> Result<(), String> {
        if self.count == 0 || self.count > MAX_COUNT {
            return Err(format!(
                "a rate's count must be between 1 and {MAX_COUNT}, not {}",
                self.count
            ));
        }
        if self.period < MIN_PERIOD || self.period > MAX_PERIOD {
            return Err(format!(
                "a rate's period must be between {} and {}",
                crate::time::format_duration(MIN_PERIOD),
                crate::time::format_duration(MAX_PERIOD)
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.count,
            crate::time::format_duration(self.period)
        )
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        let s = String::deserialize(d)?;
        Rate::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A queue's limits; all absent means unlimited. With `key_arg`, each limit applies per key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// At most this many of the queue's (or key's) jobs running at once, across every worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most this many starts of the queue's (or key's) jobs per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Partition the limits by the JSON value of this top-level argument of a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_arg: Option<String>,
}

impl QueueLimits {
    /// Whether any limit applies (a key alone limits nothing).
    pub fn is_limited(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }

    /// The one validation of limits, at every door (CLI, HTTP, config, Rust).
    pub fn check(&self) -> Result<(), String> {
        if let Some(n) = self.concurrency {
            if n == 0 || n > MAX_COUNT {
                return Err(format!(
                    "concurrency must be between 1 and {MAX_COUNT}, not {n}"
                ));
            }
        }
        if let Some(r) = &self.rate {
            r.check()?;
        }
        if let Some(k) = &self.key_arg {
            if k.is_empty() || k.len() > MAX_KEY_ARG || k.chars().any(char::is_control) {
                return Err(format!(
                    "key_arg must be an argument name of 1 to {MAX_KEY_ARG} characters without control characters"
                ));
            }
            if !self.is_limited() {
                return Err("key_arg needs a concurrency or a rate to partition".into());
            }
        }
        Ok(())
    }

    /// The key a job with these `args` is limited under: `None` for a queue-wide limit, else
    /// the JSON text of the key argument (`null` when the job has none), hashed when long.
    pub fn key_of(&self, args: &serde_json::Value) -> Option<String> {
        let arg = self.key_arg.as_deref()?;
        let text = args
            .get(arg)
            .map(|v| v.to_string())
            .unwrap_or_else(|| "null".into());
        Some(if text.len() > MAX_KEY_TEXT {
            format!("#{}", crate::unique::key("limit", arg, &text))
        } else {
            text
        })
    }
}

/// What the store counted for one job's queue (or key) inside the start's transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Jobs of the queue (key) running now, including those this transaction started.
    pub running: u64,
    /// Starts counted for the queue (key) in the rate's current window ([`counted`]),
    /// including those this transaction granted.
    pub recent_starts: u64,
}

/// How many more starts the limits admit now (`u64::MAX` when unlimited).
pub fn room(limits: &QueueLimits, usage: Usage) -> u64 {
    let by_concurrency = limits
        .concurrency
        .map_or(u64::MAX, |n| u64::from(n).saturating_sub(usage.running));
    let by_rate = limits.rate.map_or(u64::MAX, |r| {
        u64::from(r.count).saturating_sub(usage.recent_starts)
    });
    by_concurrency.min(by_rate)
}

/// Whether one more start is admitted: the grant is made in the start's transaction, after the
/// store counted under the queue's lock, so two starts never both take the last slot.
pub fn admits(limits: &QueueLimits, usage: Usage) -> bool {
    room(limits, usage) > 0
}

/// The start of the rate window holding `now`: the last multiple of the period since the Unix
/// epoch at or before it. Windows are fixed and aligned, so a store keeps one counter per
/// (queue, key) instead of a row per start (docs/limits.md, "Rate windows").
pub fn window_of(rate: &Rate, now: Micros) -> Micros {
    now - now.rem_euclid(rate.period_micros().max(1))
}

/// How many starts count against `rate` at `now`, given the stored counter `(window, count)`:
/// its count while its window is `now`'s, none once a newer window has opened, and "full"
/// (`u64::MAX`) if the counter is already in a later window than `now`'s. That last case is a
/// start whose clock lags the process that opened the later window: it is parked (and started
/// again by a later pass) rather than counted in a window its start time is not in, so every
/// granted start's `started_at` lies in the window that counted it, and no window counts more
/// than COUNT.
pub fn counted(rate: &Rate, stored: Option<(Micros, i64)>, now: Micros) -> u64 {
    let current = window_of(rate, now);
    match stored {
        Some((w, n)) if w == current => n.max(0) as u64,
        Some((w, _)) if w > current => u64::MAX,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(c: Option<u32>, r: Option<&str>, k: Option<&str>) -> QueueLimits {
        QueueLimits {
            concurrency: c,
            rate: r.map(|r| Rate::parse(r).unwrap()),
            key_arg: k.map(String::from),
        }
    }

    #[test]
    fn rates_parse_and_print_back() {
        let r = Rate::parse("10/1s").unwrap();
        assert_eq!((r.count, r.period), (10, Duration::from_secs(1)));
        assert_eq!(r.to_string(), "10/1s");
        assert_eq!(Rate::parse(&r.to_string()).unwrap(), r);
        // A bare unit is one of it, as Celery users write rates.
        for (text, count, secs) in [("10/s", 10, 1), ("100/m", 100, 60), ("5 / h", 5, 3600)] {
            let r = Rate::parse(text).unwrap();
            assert_eq!(
                (r.count, r.period),
                (count, Duration::from_secs(secs)),
                "{text}"
            );
        }
        for bad in ["10/ms", "10/x", "10/s1", "10/e3", "10/e-2", "10/m30s"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        for bad in [
            "10",
            "0/1s",
            "x/1s",
            "10/",
            "10/0s",
            "10/5ms",
            "10/2d",
            "-1/1s",
            "2000000/1s",
        ] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checks_refuse_what_cannot_be_a_limit() {
        assert!(limits(Some(0), None, None).check().is_err());
        assert!(limits(Some(MAX_COUNT + 1), None, None).check().is_err());
        assert!(limits(None, None, Some("user")).check().is_err());
        assert!(limits(Some(1), None, Some("")).check().is_err());
        assert!(limits(Some(1), None, Some("a\nb")).check().is_err());
        assert!(limits(Some(2), Some("5/1s"), Some("user")).check().is_ok());
        assert!(QueueLimits::default().check().is_ok());
    }

    #[test]
    fn room_is_the_tighter_of_both_limits() {
        let l = limits(Some(2), Some("3/1s"), None);
        let u = |running, recent_starts| Usage {
            running,
            recent_starts,
        };
        assert_eq!(room(&l, u(0, 0)), 2);
        assert_eq!(room(&l, u(1, 2)), 1);
        assert_eq!(room(&l, u(0, 3)), 0);
        assert_eq!(room(&l, u(5, 0)), 0);
        assert!(!admits(&l, u(2, 0)));
        assert!(admits(&QueueLimits::default(), u(1_000, 1_000)));
    }

    #[test]
    fn rate_windows_are_aligned_to_the_epoch_and_roll_over() {
        let r = Rate::parse("10/1s").unwrap();
        assert_eq!(window_of(&r, 0), 0);
        assert_eq!(window_of(&r, 999_999), 0);
        assert_eq!(window_of(&r, 1_000_000), 1_000_000);
        assert_eq!(window_of(&r, 2_345_678), 2_000_000);
        let m = Rate::parse("5/1m").unwrap();
        assert_eq!(window_of(&m, 125_000_000), 120_000_000);
        // The counter's window is current: its count holds; an older one counts nothing.
        assert_eq!(counted(&r, Some((2_000_000, 7)), 2_500_000), 7);
        assert_eq!(counted(&r, Some((1_000_000, 7)), 2_500_000), 0);
        assert_eq!(counted(&r, None, 2_500_000), 0);
        // A lagging clock finds the later window another process opened: no room for it.
        assert_eq!(counted(&r, Some((3_000_000, 4)), 2_500_000), u64::MAX);
        assert!(!admits(
            &QueueLimits {
                rate: Some(r),
                ..Default::default()
            },
            Usage {
                running: 0,
                recent_starts: counted(&r, Some((3_000_000, 0)), 2_500_000)
            }
        ));
    }

    #[test]
    fn keys_are_the_arguments_json_value() {
        let l = limits(Some(1), None, Some("user_id"));
        assert_eq!(l.key_of(&json!({"user_id": 7})).as_deref(), Some("7"));
        assert_eq!(l.key_of(&json!({"user_id": "7"})).as_deref(), Some("\"7\""));
        assert_eq!(l.key_of(&json!({"other": 1})).as_deref(), Some("null"));
        assert_eq!(l.key_of(&json!([1, 2])).as_deref(), Some("null"));
        let long = l.key_of(&json!({"user_id": "x".repeat(500)})).unwrap();
        assert!(long.starts_with('#') && long.len() < 40);
        assert_eq!(
            limits(Some(1), None, None).key_of(&json!({"user_id": 7})),
            None
        );
    }
}

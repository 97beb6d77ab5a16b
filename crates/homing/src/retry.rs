//! Retry delays: how long a job waits after a handler error before it runs again. The delay is
//! turned into a stored due date by the store, never a sleep in a worker.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How the delay before retry `n` (0-based: the first retry is `n = 0`) is chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum RetryPolicy {
    /// The same delay every time (the seeds' "every 30 s").
    Fixed {
        #[serde(with = "ms")]
        delay: Duration,
    },
    /// `base × 2ⁿ`, ± `jitter` (a fraction), capped at `max`.
    Exponential {
        #[serde(with = "ms")]
        base: Duration,
        #[serde(with = "ms")]
        max: Duration,
        jitter: f64,
    },
}

impl Default for RetryPolicy {
    /// 10 s × 2ⁿ ± 10 %, capped at 10 minutes (docs/design.md section 6).
    fn default() -> Self {
        RetryPolicy::Exponential {
            base: Duration::from_secs(10),
            max: Duration::from_secs(600),
            jitter: 0.1,
        }
    }
}

/// Default number of retries after the first run (so at most 4 runs that end in an error).
pub const DEFAULT_MAX_RETRIES: u32 = 3;

impl RetryPolicy {
    pub fn fixed(delay: Duration) -> Self {
        RetryPolicy::Fixed { delay }
    }

    /// The delay before retry number `n` (0-based); `unit` in `[0, 1)` picks the jitter, so the
    /// function stays pure and testable.
    pub fn delay_with(&self, n: u32, unit: f64) -> Duration {
        match *self {
            RetryPolicy::Fixed { delay } => delay,
            RetryPolicy::Exponential { base, max, jitter } => {
                let exp = base.as_secs_f64() * 2f64.powi(n.min(62) as i32);
                let capped = exp.min(max.as_secs_f64());
                let j = jitter.clamp(0.0, 1.0);
                let factor = 1.0 + j * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
                Duration::from_secs_f64((capped * factor).max(0.0))
            }
        }
    }

    /// Checks that every delay is at most `max` and the jitter a fraction in `[0, 1]`.
    pub fn validate(&self, max: Duration) -> Result<(), String> {
        let ok = match *self {
            RetryPolicy::Fixed { delay } => delay <= max,
            RetryPolicy::Exponential {
                base,
                max: cap,
                jitter,
            } => base <= max && cap <= max && jitter.is_finite() && (0.0..=1.0).contains(&jitter),
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "retry_policy: delays may be at most {} and jitter must be between 0 and 1",
                humantime::format_duration(max)
            ))
        }
    }

    /// The delay before retry number `n`, with random jitter.
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_with(n, fastrand::f64())
    }
}

mod ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Millis(u64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Millis(ms) => Ok(Duration::from_millis(ms)),
            Repr::Text(s) => crate::time::parse_duration(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_with_bounded_jitter_and_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_with(0, 0.5), Duration::from_secs(10));
        assert_eq!(p.delay_with(1, 0.5), Duration::from_secs(20));
        assert_eq!(p.delay_with(2, 0.5), Duration::from_secs(40));
        assert_eq!(p.delay_with(20, 0.5), Duration::from_secs(600));
        let lo = p.delay_with(0, 0.0).as_secs_f64();
        let hi = p.delay_with(0, 0.999_999).as_secs_f64();
        assert!((8.99..=9.01).contains(&lo), "{lo}");
        assert!((10.99..=11.01).contains(&hi), "{hi}");
        for _ in 0..100 {
            let d = p.delay(3).as_secs_f64();
            assert!((72.0..=88.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn fixed_is_fixed() {
        let p = RetryPolicy::fixed(Duration::from_secs(30));
        assert_eq!(p.delay(0), Duration::from_secs(30));
        assert_eq!(p.delay(5), Duration::from_secs(30));
    }

    #[test]
    fn policies_serialise_with_milliseconds_or_text() {
        let p: RetryPolicy =
            serde_json::from_value(serde_json::json!({"kind": "fixed", "delay": "30s"})).unwrap();
        assert_eq!(p, RetryPolicy::fixed(Duration::from_secs(30)));
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v, serde_json::json!({"kind": "fixed", "delay": 30000}));
    }
}

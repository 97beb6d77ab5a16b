//! Unique jobs (`unique_for`, docs/limits.md): which stored jobs count as "the same job" and for
//! how long. Both stores decide inside the insert's transaction, under their write
//! serialisation (SQLite's write lock; on PostgreSQL a transaction-scoped advisory lock on
//! [`lock_key`]), so concurrent enqueues of one job create it once.
//!
//! Two jobs are the same when their task, queue and args are equal, args compared as the
//! stored JSON text (serde_json writes object keys sorted, so equal values have equal text).
//! The stored `unique_key` is only an index over that triple: a hash, so that a 1 MiB args
//! value is not indexed; a hash collision costs a comparison, never a wrong answer, because
//! the stores compare the triple itself.
//!
//! A leaf: plain functions on strings and times.

use crate::time::Micros;

/// The stored index key of (task, queue, args text): FNV-1a, 64 bits, as 16 hex digits. Written
/// out here rather than taken from std, whose hasher may change between Rust releases while
/// stored keys must not.
pub fn key(task: &str, queue: &str, args: &str) -> String {
    format!("{:016x}", fnv1a(task, queue, args))
}

/// The advisory lock under which PostgreSQL decides an enqueue of this triple.
pub fn lock_key(task: &str, queue: &str, args: &str) -> i64 {
    fnv1a(task, queue, args) as i64
}

fn fnv1a(task: &str, queue: &str, args: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [task, queue, args] {
        // A separator that no name contains, so ("ab", "c") and ("a", "bc") differ.
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The oldest `finished_at` that still makes a finished job the same as one enqueued at `now`
/// with window `window`: finished at or after it.
pub fn finished_since(now: Micros, window: std::time::Duration) -> Micros {
    now.saturating_sub(crate::time::micros(window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_separate_their_parts() {
        // A stored key must never change: this value is what every store holds for the triple.
        assert_eq!(key("t", "q", "{}"), "13311b191055f674");
        assert_ne!(key("ab", "c", "{}"), key("a", "bc", "{}"));
        assert_ne!(key("t", "q", "{\"a\":1}"), key("t", "q", "{\"a\":2}"));
        assert_eq!(key("t", "q", "{}").len(), 16);
        assert_eq!(lock_key("t", "q", "{}") as u64, 0x1331_1b19_1055_f674);
    }

    #[test]
    fn the_window_reaches_back_from_now() {
        let d = std::time::Duration::from_secs(2);
        assert_eq!(finished_since(10_000_000, d), 8_000_000);
        assert_eq!(finished_since(i64::MIN + 1, d), i64::MIN);
    }
}

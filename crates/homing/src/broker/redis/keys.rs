//! Every Redis key the broker touches, built here and nowhere else, so the key layout can be read
//! (and changed) in one place.
//!
//! Layout, for the default namespace `homing`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `homing:{q:<queue>}:stream` | stream | the queue's messages; consumer group [`GROUP`] |
//! | `homing:{q:<queue>}:dead` | stream | the queue's dead letters |
//! | `homing:queues` | set | every queue name ever published to or reserved from |
//! | `homing:{w}:workers` | set | every registered worker (consumer) name |
//! | `homing:{w}:hb:<worker>` | string with a TTL | the worker's heartbeat |
//! | `homing:marker` | string | proves the server kept its data (see `check_marker`) |
//!
//! The `{…}` parts are Redis Cluster hash tags: a queue's two streams share one slot, so a Lua
//! script may touch both; all worker keys share another, so "forget this worker unless its
//! heartbeat is back" is one atomic script. Nothing else needs to be co-located, and no script
//! touches keys of two different tags.

/// The consumer group every queue stream has. One group per stream: every worker competes for
/// the same messages.
pub const GROUP: &str = "homing";

/// The consumer that owns requeued entries until a reservation claims them. Worker names are
/// `<name>-<pid>-<hex>`, so none can be this.
pub const REQUEUED: &str = "~requeued";

/// The default key namespace.
pub const DEFAULT_PREFIX: &str = "homing";

/// Key builder for one namespace (the `?prefix=` of the broker URL).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` must satisfy [`valid_prefix`].
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn stream(&self, queue: &str) -> String {
        format!("{}:{{q:{queue}}}:stream", self.prefix)
    }

    pub fn dead(&self, queue: &str) -> String {
        format!("{}:{{q:{queue}}}:dead", self.prefix)
    }

    pub fn queues(&self) -> String {
        format!("{}:queues", self.prefix)
    }

    pub fn workers(&self) -> String {
        format!("{}:{{w}}:workers", self.prefix)
    }

    pub fn heartbeat(&self, worker: &str) -> String {
        format!("{}:{{w}}:hb:{worker}", self.prefix)
    }

    pub fn marker(&self) -> String {
        format!("{}:marker", self.prefix)
    }
}

/// A namespace may not contain braces (they would change the hash tags above), whitespace or
/// control characters.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(key: &str) -> &str {
        let open = key.find('{').expect("hash tag");
        let close = key[open..].find('}').expect("closed") + open;
        &key[open + 1..close]
    }

    #[test]
    fn a_queue_s_keys_share_one_slot() {
        let k = Keys::new("homing");
        assert_eq!(k.stream("ocr"), "homing:{q:ocr}:stream");
        assert_eq!(tag(&k.stream("ocr")), tag(&k.dead("ocr")));
        assert_ne!(tag(&k.stream("ocr")), tag(&k.stream("bgm")));
    }

    #[test]
    fn worker_keys_share_one_slot() {
        let k = Keys::new("t1");
        assert_eq!(tag(&k.workers()), tag(&k.heartbeat("w-1")));
        assert!(k.heartbeat("w-1").starts_with("t1:"));
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(valid_prefix("homing"));
        assert!(valid_prefix("t-01.case_2:x"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("a{b}"));
        assert!(!valid_prefix("a b"));
    }
}

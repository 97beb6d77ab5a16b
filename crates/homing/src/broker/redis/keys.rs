//! Every Redis key the broker touches, built here and nowhere else, so the key layout can be read
//! (and changed) in one place.
//!
//! Layout, for the default namespace `homing`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `homing:{q:<queue>}:stream` | stream | the queue's messages of priority 0 (band 0); consumer group [`GROUP`] |
//! | `homing:{q:<queue>}:stream:p<band>` | stream | the queue's messages of one other priority band (`p+1` … `p+3`, `p-1` … `p-3`, see [`band`]); the same group |
//! | `homing:{q:<queue>}:dead` | stream | the queue's dead letters |
//! | `homing:queues` | set | every queue name ever published to or reserved from |
//! | `homing:{w}:workers` | set | every registered worker (consumer) name |
//! | `homing:{w}:hb:<worker>` | string with a TTL | the worker's heartbeat |
//! | `homing:marker` | string | proves the server kept its data (see `check_marker`) |
//! | `homing:{q:<queue>}:marker` | string | Redis Cluster only: proves the queue's master kept its data |
//! | `{homing:queues}:marker` | string | Redis Cluster only: the same for the master holding `homing:queues` (the tag is that key's whole name, so both share a slot) |
//!
//! The `{…}` parts are Redis Cluster hash tags: a queue's streams share one slot, so a Lua
//! script may touch all of them; all worker keys share another, so "forget this worker unless its
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

/// The priority bands, highest first: reservations read them in this order. Band 0 (priority 0,
/// the default) is the queue's original stream, so a queue that never sees a priority uses one
/// stream as before.
pub const BANDS: [i8; 7] = [3, 2, 1, 0, -1, -2, -3];

/// The band of a job's priority (validated to -1000..=1000, but any `i32` maps somewhere):
/// 0 alone is band 0; then by order of magnitude on either side: 1..=9 is band 1, 10..=99 band 2,
/// 100 and more band 3 (and the same below zero). Within a band messages are FIFO, so priorities
/// 3 and 7 start in enqueue order on Redis while 7 and 70 start in priority order.
pub fn band(priority: i32) -> i8 {
    let magnitude = match priority.unsigned_abs() {
        0 => 0,
        1..=9 => 1,
        10..=99 => 2,
        _ => 3,
    };
    if priority < 0 {
        -magnitude
    } else {
        magnitude
    }
}

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

    /// The stream of one priority band of a queue; band 0 is [`Self::stream`].
    pub fn band_stream(&self, queue: &str, band: i8) -> String {
        if band == 0 {
            self.stream(queue)
        } else {
            format!("{}:p{band:+}", self.stream(queue))
        }
    }

    /// Every band stream of a queue, in [`BANDS`] order (highest first).
    pub fn streams(&self, queue: &str) -> Vec<String> {
        BANDS.iter().map(|b| self.band_stream(queue, *b)).collect()
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

    /// The data-loss marker of one queue, in the queue's slot (used on a cluster).
    pub fn queue_marker(&self, queue: &str) -> String {
        format!("{}:{{q:{queue}}}:marker", self.prefix)
    }

    /// The data-loss marker in the slot of [`Self::queues`] (used on a cluster): a key whose
    /// hash tag is another key's whole name hashes like that key.
    pub fn queues_marker(&self) -> String {
        format!("{{{}}}:marker", self.queues())
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
    fn a_queue_s_band_streams_share_its_slot() {
        let k = Keys::new("homing");
        assert_eq!(k.band_stream("ocr", 0), "homing:{q:ocr}:stream");
        assert_eq!(k.band_stream("ocr", 2), "homing:{q:ocr}:stream:p+2");
        assert_eq!(k.band_stream("ocr", -3), "homing:{q:ocr}:stream:p-3");
        let all = k.streams("ocr");
        assert_eq!(all.len(), BANDS.len());
        assert_eq!(
            all.iter().collect::<std::collections::HashSet<_>>().len(),
            BANDS.len()
        );
        assert!(all.iter().all(|s| tag(s) == tag(&k.dead("ocr"))));
    }

    #[test]
    fn priorities_map_to_ordered_bands() {
        assert_eq!(band(0), 0);
        assert_eq!(
            (band(1), band(9), band(10), band(99), band(100)),
            (1, 1, 2, 2, 3)
        );
        assert_eq!(
            (band(-1), band(-9), band(-10), band(-100)),
            (-1, -1, -2, -3)
        );
        assert_eq!((band(i32::MAX), band(i32::MIN)), (3, -3));
        // A higher priority never lands in a lower band, and every band is one of BANDS.
        for p in -1001..1001 {
            assert!(band(p) <= band(p + 1));
            assert!(BANDS.contains(&band(p)));
        }
        assert!(BANDS.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn markers_share_the_slot_of_what_they_guard() {
        use ::redis::cluster_routing::Slot;
        let k = Keys::new("homing");
        assert_eq!(tag(&k.queue_marker("ocr")), tag(&k.stream("ocr")));
        assert_eq!(Slot::for_key(k.queues_marker()), Slot::for_key(k.queues()));
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

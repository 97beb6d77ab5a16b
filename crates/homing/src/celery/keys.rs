//! Every Redis key the Celery bridge reads or writes, built here and nowhere else. Two families
//! live side by side on the Celery Redis server:
//!
//! | key | type | owner | holds |
//! |---|---|---|---|
//! | `<queue>` | list | kombu | messages of priority 0–2 (`LPUSH` by producers, `RPOP` by consumers) |
//! | `<queue>\x06\x16<n>` | list | kombu | messages of priority step `n` ∈ {3, 6, 9} |
//! | `_kombu.binding.<queue>` | set | kombu | `<routing key>\x06\x16<pattern>\x06\x16<queue>` bindings |
//! | `celery-task-meta-<id>` | string with a TTL | Celery result backend | a task's state and result |
//! | `homing:celery:claimed:<consumer>` | hash | homing | messages an ingress took and has not recorded yet |
//! | `homing:celery:alive:<consumer>` | string with a TTL | homing | the ingress's heartbeat |
//! | `homing:celery:consumers` | set | homing | ingress consumers that may hold claimed messages |
//!
//! kombu's own `unacked` hash and `unacked_index` zset belong to Python consumers; homing never
//! touches them (their restore is driven by kombu's visibility timeout, which homing avoids).
//! Nothing here uses Redis Cluster hash tags: kombu's Redis transport does not run on Cluster.

/// kombu's separator between a queue name and its priority step, and inside binding entries.
pub const SEP: &str = "\x06\x16";

/// kombu's priority steps, in the order its consumers pop them (step 0 first).
pub const PRIORITY_STEPS: [u8; 4] = [0, 3, 6, 9];

/// The Celery result backend's key prefix (also the `PUBLISH` channel of a result).
pub const RESULT_PREFIX: &str = "celery-task-meta-";

const HOMING: &str = "homing:celery";

/// The kombu step a message priority (0–9) falls into: the largest step not above it.
pub fn priority_step(priority: u8) -> u8 {
    let p = priority.min(9);
    PRIORITY_STEPS
        .iter()
        .copied()
        .filter(|s| *s <= p)
        .max()
        .unwrap_or(0)
}

/// The list holding `queue`'s messages of `priority`.
pub fn queue_list(queue: &str, priority: u8) -> String {
    match priority_step(priority) {
        0 => queue.to_string(),
        step => format!("{queue}{SEP}{step}"),
    }
}

/// Every list of `queue`, in the order consumers serve them.
pub fn queue_lists(queue: &str) -> Vec<String> {
    PRIORITY_STEPS
        .iter()
        .map(|p| queue_list(queue, *p))
        .collect()
}

pub fn binding(queue: &str) -> String {
    format!("_kombu.binding.{queue}")
}

/// The binding entry Celery declares for a queue of the same-named direct exchange.
pub fn binding_entry(queue: &str) -> String {
    format!("{queue}{SEP}{SEP}{queue}")
}

pub fn result(task_id: &str) -> String {
    format!("{RESULT_PREFIX}{task_id}")
}

pub fn claimed(consumer: &str) -> String {
    format!("{HOMING}:claimed:{consumer}")
}

pub fn alive(consumer: &str) -> String {
    format!("{HOMING}:alive:{consumer}")
}

pub fn consumers() -> String {
    format!("{HOMING}:consumers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_map_to_kombu_lists() {
        assert_eq!(queue_list("ocr", 0), "ocr");
        assert_eq!(queue_list("ocr", 2), "ocr");
        assert_eq!(queue_list("ocr", 3), "ocr\x06\x163");
        assert_eq!(queue_list("ocr", 7), "ocr\x06\x166");
        assert_eq!(queue_list("ocr", 200), "ocr\x06\x169");
        assert_eq!(
            queue_lists("q"),
            vec!["q", "q\x06\x163", "q\x06\x166", "q\x06\x169"]
        );
        assert_eq!(binding_entry("q"), "q\x06\x16\x06\x16q");
    }
}

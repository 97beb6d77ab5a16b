//! Putting back stray messages: messages reserved under a live consumer's name that it never
//! received. A reservation that ran on the broker but whose answer never arrived (a Redis
//! connection that broke after the script ran, a server that died between a remote session's
//! reservation and its start) leaves them there, and the rescuer puts a consumer's messages back
//! only once it is gone. A Rust worker's session (`worker::strays`) and the remote gateway's
//! sessions (`remote`) each know what their consumer holds; what they share is the rule here:
//! a message that is not held is put back only when the previous sweep saw it too, so one on
//! its way in (held microseconds later) is never touched. Putting one back is one more delivery
//! of its job, which the start answers like any duplicate, so even a wrong guess cannot run a
//! job twice.

use std::collections::HashSet;

use super::{Broker, Delivery};

/// A delivery as a sweep knows it: its queue and its tag (a tag alone is not unique: two
/// queues' streams can give the same entry id in the same millisecond).
pub(crate) type Key = (String, String);

pub(crate) fn key(d: &Delivery) -> Key {
    (d.queue.clone(), d.tag.clone())
}

/// Puts back the deliveries of `unheld` (reserved under `consumer`, not held by it) that the
/// previous sweep saw too (`before`); answers what to remember for the next sweep: the ones
/// seen for the first time, and those a failed put-back left where they were.
pub(crate) async fn put_back(
    broker: &dyn Broker,
    consumer: &str,
    unheld: Vec<Delivery>,
    before: &HashSet<Key>,
) -> HashSet<Key> {
    let (again, first): (Vec<Delivery>, Vec<Delivery>) =
        unheld.into_iter().partition(|d| before.contains(&key(d)));
    let mut still: HashSet<Key> = first.iter().map(key).collect();
    if again.is_empty() {
        return still;
    }
    match broker.requeue(consumer, &again).await {
        Ok(n) if n > 0 => tracing::warn!(
            event = "worker.strays_put_back",
            count = n,
            worker = %consumer,
            "put back messages reserved under this worker's name that it never received (a reservation whose answer was lost)"
        ),
        Ok(_) => {}
        // Seen again next time, and put back then.
        Err(e) => {
            tracing::warn!(error = %e, worker = %consumer, "could not put back stray messages; trying again at the next sweep");
            still.extend(again.iter().map(key));
        }
    }
    still
}

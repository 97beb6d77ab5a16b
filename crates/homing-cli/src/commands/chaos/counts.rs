//! The kept queue counts (docs/counts.md) after a run full of kills, cut connections and
//! restarts: the counts the schema's triggers kept must equal a fresh count of the jobs. A
//! drift here would mean some path changed a job's state without its count (or a transaction
//! was half applied), which no other invariant would notice. The same holds for the broker's
//! depths, which the embedded broker keeps by triggers too: they must equal a count of its
//! messages and dead letters.

use homing::broker::Broker;
use homing::store::Store;

/// The violations (none when the counts agree), read once the deployment has stopped.
pub async fn check(store: &dyn Store) -> Vec<String> {
    let kept = match store.queue_stats().await {
        Ok(k) => k,
        Err(e) => return vec![format!("queue counts: cannot read the kept counts: {e}")],
    };
    let fresh = match store.queue_stats_recounted().await {
        Ok(f) => f,
        Err(e) => return vec![format!("queue counts: cannot count the jobs: {e}")],
    };
    let mut out = Vec::new();
    for f in &fresh {
        match kept.iter().find(|k| k.queue == f.queue) {
            Some(k) if k == f => {}
            Some(k) => out.push(format!(
                "queue counts drifted for {}: kept {k:?}, counted {f:?}",
                f.queue
            )),
            None => out.push(format!(
                "queue counts: {} has jobs ({f:?}) but no kept counts",
                f.queue
            )),
        }
    }
    for k in kept
        .iter()
        .filter(|k| !fresh.iter().any(|f| f.queue == k.queue))
    {
        out.push(format!(
            "queue counts: {} has kept counts ({k:?}) but no jobs",
            k.queue
        ));
    }
    out
}

/// The violations of the broker's depths against a count of its messages (none when they agree
/// or when the broker reads its depths from its messages anyway), read once the deployment has
/// stopped. On the embedded file the kept rows are also read as they are: `depths` shows a count
/// that fell below zero as 0, which a queue with no such message left would otherwise hide.
pub async fn check_broker(broker: &dyn Broker) -> Vec<String> {
    let (kept, fresh) = match (broker.depths().await, broker.depths_recounted().await) {
        (Ok(k), Ok(f)) => (k, f),
        (Err(e), _) | (_, Err(e)) => return vec![format!("broker depths: cannot read them: {e}")],
    };
    let mut out = Vec::new();
    if kept != fresh {
        out.push(format!(
            "broker depths drifted: kept {kept:?}, counted {fresh:?}"
        ));
    }
    if let Some(db) = broker.embedded_db() {
        match homing::broker::sqlite::counts_below_zero(db).await {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => out.push(format!("broker depths below zero: {rows:?}")),
            Err(e) => out.push(format!("broker depths: cannot read the kept rows: {e}")),
        }
    }
    out
}

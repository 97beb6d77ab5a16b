//! The broker contract, case by case. Each case takes a fresh broker and panics on a violation.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::unique_queue;
use crate::broker::*;
use crate::job::{new_job_id, JobId};
use crate::store::ToPublish;

/// Generates one `#[tokio::test]` per broker case; `$make` is an expression whose value is a
/// future of `Arc<dyn Broker>`, evaluated afresh for each case.
#[macro_export]
macro_rules! broker_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(broker, $make;
            publish_reserve_ack_in_order, reserve_respects_max, reserved_messages_are_owned,
            requeue_gives_a_new_tag, requeued_message_goes_first, ack_is_idempotent, heartbeat_lifecycle, lost_consumers_and_removal,
            dead_letter_moves_message, marker_detects_loss, several_queues, concurrent_reserve_is_exclusive,
            reserve_waits_for_a_publish, dead_letters_are_purged_by_age,
            higher_priority_is_reserved_first, requeued_message_keeps_its_priority,
            prioritised_messages_ack_wait_and_dead_letter, depths_follow_every_transition,
            ack_and_reserve_hands_reservations_on
        );
    };
}

fn dispatches(q: &str, n: usize) -> Vec<ToPublish> {
    (0..n)
        .map(|_| ToPublish {
            id: new_job_id(),
            queue: q.to_string(),
            priority: 0,
        })
        .collect()
}

/// One message per priority, in this order.
fn prioritised(q: &str, priorities: &[i32]) -> Vec<ToPublish> {
    priorities
        .iter()
        .map(|p| ToPublish {
            id: new_job_id(),
            queue: q.to_string(),
            priority: *p,
        })
        .collect()
}

fn ids(ds: &[Delivery]) -> Vec<JobId> {
    ds.iter()
        .map(|d| d.job.clone().expect("decodable"))
        .collect()
}

const SHORT: Duration = Duration::from_millis(50);

pub async fn publish_reserve_ack_in_order(b: Arc<dyn Broker>) {
    let q = unique_queue("fifo");
    let msgs = dispatches(&q, 3);
    b.publish(&msgs).await.unwrap();
    let got = b
        .reserve("c1", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(
        ids(&got),
        msgs.iter().map(|m| m.id).collect::<Vec<_>>(),
        "oldest first"
    );
    assert!(got.iter().all(|d| d.queue == q));
    assert!(
        b.reserve("c2", std::slice::from_ref(&q), 10, SHORT)
            .await
            .unwrap()
            .is_empty(),
        "reserved messages are not handed out twice"
    );
    let depth = b
        .depths()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.queue == q)
        .unwrap();
    assert_eq!((depth.ready, depth.reserved), (0, 3));
    b.ack(&got).await.unwrap();
    let depth = b.depths().await.unwrap().into_iter().find(|d| d.queue == q);
    assert!(depth.map(|d| d.ready + d.reserved == 0).unwrap_or(true));
    assert!(b.pending("c1", 10).await.unwrap().is_empty());
}

pub async fn reserve_respects_max(b: Arc<dyn Broker>) {
    let q = unique_queue("max");
    b.publish(&dispatches(&q, 5)).await.unwrap();
    assert_eq!(
        b.reserve("c", std::slice::from_ref(&q), 2, SHORT)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        b.reserve("c", std::slice::from_ref(&q), 1, SHORT)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        b.reserve("c", std::slice::from_ref(&q), 10, SHORT)
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(b.pending("c", 100).await.unwrap().len(), 5);
}

pub async fn reserved_messages_are_owned(b: Arc<dyn Broker>) {
    let q = unique_queue("own");
    b.publish(&dispatches(&q, 2)).await.unwrap();
    let got = b
        .reserve("c1", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(b.pending("c1", 10).await.unwrap().len(), 2);
    assert!(b.pending("c2", 10).await.unwrap().is_empty());
    assert_eq!(
        b.requeue("c2", &got).await.unwrap(),
        0,
        "only the owner's messages are requeued"
    );
    assert_eq!(b.requeue("c1", &got).await.unwrap(), 2);
    assert_eq!(
        b.requeue("c1", &got).await.unwrap(),
        0,
        "requeue happens once"
    );
    let again = b
        .reserve("c2", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(ids(&again), ids(&got));
}

pub async fn requeue_gives_a_new_tag(b: Arc<dyn Broker>) {
    let q = unique_queue("tag");
    b.publish(&dispatches(&q, 1)).await.unwrap();
    let old = b
        .reserve("zombie", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(b.requeue("zombie", &old).await.unwrap(), 1);
    let new = b
        .reserve("fresh", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(ids(&new), ids(&old));
    assert_ne!(new[0].tag, old[0].tag);
    // The zombie acknowledges its old tag: the new owner's message must survive.
    b.ack(&old).await.unwrap();
    assert_eq!(b.pending("fresh", 10).await.unwrap().len(), 1);
}

/// A reclaimed message must not wait behind the backlog: recovery time is TTL + one sweep, not
/// TTL + the time to drain the queue.
pub async fn requeued_message_goes_first(b: Arc<dyn Broker>) {
    let q = unique_queue("front");
    let msgs = dispatches(&q, 3);
    b.publish(&msgs[..1]).await.unwrap();
    let first = b
        .reserve("lost", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    b.publish(&msgs[1..]).await.unwrap();
    assert_eq!(b.requeue("lost", &first).await.unwrap(), 1);
    let next = b
        .reserve("fresh", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(
        ids(&next),
        vec![msgs[0].id],
        "the requeued message is delivered before newer ones"
    );
}

pub async fn ack_is_idempotent(b: Arc<dyn Broker>) {
    let q = unique_queue("ack");
    b.publish(&dispatches(&q, 2)).await.unwrap();
    let got = b
        .reserve("c", std::slice::from_ref(&q), 2, SHORT)
        .await
        .unwrap();
    b.ack(&got[..1]).await.unwrap();
    b.ack(&got[..1]).await.unwrap();
    let pending = b.pending("c", 10).await.unwrap();
    assert_eq!(ids(&pending), ids(&got[1..]));
}

pub async fn heartbeat_lifecycle(b: Arc<dyn Broker>) {
    let w = unique_queue("hb");
    let ttl = Duration::from_millis(300);
    assert!(!b.is_alive(&w).await.unwrap());
    assert_eq!(b.heartbeat_expires_in(&w).await.unwrap(), None);
    assert!(
        !b.heartbeat(&w, ttl).await.unwrap(),
        "an unregistered worker cannot heartbeat"
    );
    b.register(&w, ttl).await.unwrap();
    assert!(b.is_alive(&w).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = b.heartbeat_expires_in(&w).await.unwrap().expect("live");
    assert!(
        before < ttl,
        "{before:?}: time passed since the registration"
    );
    assert!(b.heartbeat(&w, ttl).await.unwrap());
    let after = b.heartbeat_expires_in(&w).await.unwrap().expect("live");
    assert!(
        after > before && after <= ttl,
        "a heartbeat pushes the expiry back to the TTL: {before:?} then {after:?}"
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(
        !b.is_alive(&w).await.unwrap(),
        "heartbeat must expire after its TTL"
    );
    assert_eq!(b.heartbeat_expires_in(&w).await.unwrap(), None);
    assert!(
        !b.heartbeat(&w, ttl).await.unwrap(),
        "an expired worker learns it was presumed dead"
    );
    let w2 = unique_queue("hb");
    b.register(&w2, ttl).await.unwrap();
    b.unregister(&w2).await.unwrap();
    assert!(!b.is_alive(&w2).await.unwrap());
}

pub async fn lost_consumers_and_removal(b: Arc<dyn Broker>) {
    let q = unique_queue("lost");
    let dead = unique_queue("dead-worker");
    let live = unique_queue("live-worker");
    b.register(&dead, Duration::from_millis(100)).await.unwrap();
    b.register(&live, Duration::from_secs(30)).await.unwrap();
    b.publish(&dispatches(&q, 2)).await.unwrap();
    let d1 = b
        .reserve(&dead, std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    let _d2 = b
        .reserve(&live, std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let lost = b.lost_consumers().await.unwrap();
    assert!(lost.contains(&dead), "{lost:?}");
    assert!(!lost.contains(&live), "a live worker is never lost");
    assert!(
        !b.remove_consumer(&dead).await.unwrap(),
        "a consumer holding messages is kept"
    );
    assert!(b.lost_consumers().await.unwrap().contains(&dead));
    assert_eq!(b.requeue(&dead, &d1).await.unwrap(), 1);
    assert!(b.remove_consumer(&dead).await.unwrap());
    assert!(!b.lost_consumers().await.unwrap().contains(&dead));
    assert!(
        !b.is_alive(&live).await.unwrap() || !b.lost_consumers().await.unwrap().contains(&live)
    );
    b.unregister(&live).await.unwrap();
}

pub async fn dead_letter_moves_message(b: Arc<dyn Broker>) {
    let q = unique_queue("dlq");
    b.publish(&dispatches(&q, 1)).await.unwrap();
    let got = b
        .reserve("c", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    b.dead_letter(&got[0], "cannot decode").await.unwrap();
    assert!(b.pending("c", 10).await.unwrap().is_empty());
    assert!(b
        .reserve("c", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap()
        .is_empty());
    let dl = b.dead_letters(1000).await.unwrap();
    let entry = dl.iter().find(|d| d.queue == q).expect("dead letter kept");
    assert_eq!(entry.reason, "cannot decode");
    assert!(entry
        .payload
        .contains(&got[0].job.clone().unwrap().to_string()));
    let depth = b
        .depths()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.queue == q)
        .unwrap();
    assert_eq!(depth.dead_letters, 1);
}

pub async fn dead_letters_are_purged_by_age(b: Arc<dyn Broker>) {
    let q = unique_queue("dlq-age");
    b.publish(&dispatches(&q, 2)).await.unwrap();
    let before_any = crate::time::now() - 1_000_000;
    let got = b
        .reserve("c", std::slice::from_ref(&q), 2, SHORT)
        .await
        .unwrap();
    for d in &got {
        b.dead_letter(d, "garbage").await.unwrap();
    }
    let mine = |dl: Vec<crate::broker::DeadLetter>| dl.into_iter().filter(|d| d.queue == q).count();
    assert_eq!(b.purge_dead_letters(before_any).await.unwrap(), 0);
    assert_eq!(
        mine(b.dead_letters(1000).await.unwrap()),
        2,
        "newer than the cut: kept"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(b.purge_dead_letters(crate::time::now()).await.unwrap() >= 2);
    assert_eq!(mine(b.dead_letters(1000).await.unwrap()), 0);
}

pub async fn marker_detects_loss(b: Arc<dyn Broker>) {
    // A fresh broker has no marker yet; afterwards it stays.
    let first = b.check_marker().await.unwrap();
    assert!(!first || b.check_marker().await.unwrap());
    assert!(b.check_marker().await.unwrap());
}

pub async fn several_queues(b: Arc<dyn Broker>) {
    let qa = unique_queue("qa");
    let qb = unique_queue("qb");
    b.publish(&dispatches(&qa, 1)).await.unwrap();
    b.publish(&dispatches(&qb, 1)).await.unwrap();
    let got = b
        .reserve("c", &[qa.clone(), qb.clone()], 10, SHORT)
        .await
        .unwrap();
    let queues: HashSet<_> = got.iter().map(|d| d.queue.clone()).collect();
    assert_eq!(queues, HashSet::from([qa, qb]));
}

pub async fn concurrent_reserve_is_exclusive(b: Arc<dyn Broker>) {
    let q = unique_queue("conc");
    let msgs = dispatches(&q, 200);
    b.publish(&msgs).await.unwrap();
    let mut handles = Vec::new();
    for c in 0..4 {
        let b = b.clone();
        let q = q.clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = b
                    .reserve(&format!("c{c}"), std::slice::from_ref(&q), 7, SHORT)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return got;
                }
                b.ack(&batch).await.unwrap();
                got.extend(ids(&batch));
            }
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().copied().collect();
    assert_eq!(all.len(), 200, "every message delivered exactly once");
    assert_eq!(unique, msgs.iter().map(|m| m.id).collect::<HashSet<_>>());
}

pub async fn reserve_waits_for_a_publish(b: Arc<dyn Broker>) {
    let q = unique_queue("wait");
    let msgs = dispatches(&q, 1);
    let b2 = b.clone();
    let m2 = msgs.clone();
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        b2.publish(&m2).await.unwrap();
    });
    let got = b
        .reserve("c", std::slice::from_ref(&q), 1, Duration::from_secs(5))
        .await
        .unwrap();
    publisher.await.unwrap();
    assert_eq!(
        ids(&got),
        vec![msgs[0].id],
        "a waiting reservation receives a later publish"
    );
}

/// Higher priorities first, FIFO among equal ones, whether reserved one by one or in one batch.
/// The priorities are far enough apart to be in different bands of a broker that bands them
/// (Redis: 1..=9, 10..=99, ≥ 100 and the same below zero); equal ones are equal.
pub async fn higher_priority_is_reserved_first(b: Arc<dyn Broker>) {
    let expected_order = [3, 6, 1, 4, 0, 5, 2];
    for batch in [1, 10] {
        let q = unique_queue("prio");
        let msgs = prioritised(&q, &[0, 5, -5, 500, 5, 0, 50]);
        b.publish(&msgs).await.unwrap();
        let mut got = Vec::new();
        while got.len() < msgs.len() {
            let ds = b
                .reserve("c", std::slice::from_ref(&q), batch, SHORT)
                .await
                .unwrap();
            assert!(!ds.is_empty(), "every message is ready");
            assert!(ds.len() <= batch);
            got.extend(ids(&ds));
        }
        assert_eq!(
            got,
            expected_order.map(|i| msgs[i].id).to_vec(),
            "priority 500, 50, 5, 5, 0, 0, -5 (batches of {batch})"
        );
    }
}

/// A message put back (its worker was lost) keeps its priority: it goes before lower ones and
/// before newer ones of its own priority.
pub async fn requeued_message_keeps_its_priority(b: Arc<dyn Broker>) {
    let q = unique_queue("prio-requeue");
    let msgs = prioritised(&q, &[0, 50, 50, -50]);
    b.publish(&msgs[..2]).await.unwrap();
    let first = b
        .reserve("lost", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(
        ids(&first),
        vec![msgs[1].id],
        "the priority-50 message first"
    );
    b.publish(&msgs[2..]).await.unwrap();
    assert_eq!(b.requeue("lost", &first).await.unwrap(), 1);
    assert!(b.pending("lost", 10).await.unwrap().is_empty());
    let mut got = Vec::new();
    while got.len() < msgs.len() {
        let ds = b
            .reserve("fresh", std::slice::from_ref(&q), 1, SHORT)
            .await
            .unwrap();
        assert_eq!(ds.len(), 1, "every message is ready");
        got.extend(ids(&ds));
    }
    assert_eq!(
        got,
        vec![msgs[1].id, msgs[2].id, msgs[0].id, msgs[3].id],
        "the requeued priority-50 message, the newer 50, then 0, then -50"
    );
    assert_eq!(b.pending("fresh", 10).await.unwrap().len(), 4);
}

/// Prioritised messages go through the rest of the contract like others: a waiting reservation
/// receives one published later, `pending` lists them, ack removes them, a dead letter moves one.
pub async fn prioritised_messages_ack_wait_and_dead_letter(b: Arc<dyn Broker>) {
    let q = unique_queue("prio-life");
    let msgs = prioritised(&q, &[-7, 300]);
    let b2 = b.clone();
    let m2 = msgs.clone();
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        b2.publish(&m2[1..]).await.unwrap();
    });
    let got = b
        .reserve("c", std::slice::from_ref(&q), 1, Duration::from_secs(5))
        .await
        .unwrap();
    publisher.await.unwrap();
    assert_eq!(
        ids(&got),
        vec![msgs[1].id],
        "a waiting reservation receives it"
    );
    b.publish(&msgs[..1]).await.unwrap();
    let low = b
        .reserve("c", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(ids(&low), vec![msgs[0].id]);
    let pending: HashSet<JobId> = ids(&b.pending("c", 10).await.unwrap())
        .into_iter()
        .collect();
    assert_eq!(pending, msgs.iter().map(|m| m.id).collect::<HashSet<_>>());
    b.ack(&got).await.unwrap();
    b.ack(&got).await.unwrap();
    b.dead_letter(&low[0], "test").await.unwrap();
    assert!(b.pending("c", 10).await.unwrap().is_empty());
    let depth = b.depths().await.unwrap().into_iter().find(|d| d.queue == q);
    assert!(
        depth.map(|d| d.ready + d.reserved == 0).unwrap_or(true),
        "nothing left ready or reserved"
    );
    let dead = b.dead_letters(100).await.unwrap();
    assert!(dead
        .iter()
        .any(|d| d.queue == q && d.payload == msgs[0].id.to_string() && d.reason == "test"));
    assert!(b
        .reserve("c", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap()
        .is_empty());
}

/// The depths after each kind of change a message goes through, in two queues, so a count kept
/// on the side (the embedded broker's triggers) that missed or doubled one would show.
pub async fn depths_follow_every_transition(b: Arc<dyn Broker>) {
    let (q1, q2) = (unique_queue("depth-a"), unique_queue("depth-b"));
    let depth = |b: Arc<dyn Broker>, q: String| async move {
        b.depths()
            .await
            .unwrap()
            .into_iter()
            .find(|d| d.queue == q)
            .map(|d| (d.ready, d.reserved, d.dead_letters))
            .unwrap_or_default()
    };
    b.publish(&dispatches(&q1, 6)).await.unwrap();
    b.publish(&dispatches(&q2, 2)).await.unwrap();
    assert_eq!(depth(b.clone(), q1.clone()).await, (6, 0, 0), "published");
    let got = b
        .reserve("c1", std::slice::from_ref(&q1), 4, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(depth(b.clone(), q1.clone()).await, (2, 4, 0), "reserved");
    b.ack(&got[..1]).await.unwrap();
    b.ack(&got[..1]).await.unwrap();
    assert_eq!(
        depth(b.clone(), q1.clone()).await,
        (2, 3, 0),
        "acknowledged, twice"
    );
    assert_eq!(b.requeue("c1", &got[1..2]).await.unwrap(), 1);
    assert_eq!(depth(b.clone(), q1.clone()).await, (3, 2, 0), "requeued");
    b.dead_letter(&got[2], "garbage").await.unwrap();
    assert_eq!(
        depth(b.clone(), q1.clone()).await,
        (3, 1, 1),
        "dead-lettered"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(b.purge_dead_letters(crate::time::now()).await.unwrap() >= 1);
    assert_eq!(depth(b.clone(), q1.clone()).await, (3, 1, 0), "purged");
    let mine = |ds: Vec<QueueDepth>| -> Vec<QueueDepth> {
        ds.into_iter()
            .filter(|d| d.queue == q1 || d.queue == q2)
            .collect()
    };
    assert_eq!(
        mine(b.depths().await.unwrap()),
        mine(b.depths_recounted().await.unwrap()),
        "the depths equal a count of the messages"
    );
    assert_eq!(
        depth(b.clone(), q2.clone()).await,
        (2, 0, 0),
        "the other queue untouched"
    );
    b.ack(&got[3..]).await.unwrap();
    let rest = b
        .reserve("c2", std::slice::from_ref(&q1), 10, SHORT)
        .await
        .unwrap();
    b.ack(&rest).await.unwrap();
    assert_eq!(depth(b.clone(), q1.clone()).await, (0, 0, 0), "drained");
}

/// A worker's round acknowledges its messages and reserves their successors in one call
/// (`ack_and_reserve`): the acknowledged messages are gone, the new ones are owned by the
/// consumer, higher priority first, never more than asked for, queues in the order given; a stale
/// delivery in the acknowledgement removes nothing, an empty queue gives nothing (at once), and
/// asking for none only acknowledges.
pub async fn ack_and_reserve_hands_reservations_on(b: Arc<dyn Broker>) {
    let q = unique_queue("handon");
    let other = unique_queue("handon-other");
    let msgs = prioritised(&q, &[0, 0, 0, 0, 50, 0]);
    b.publish(&msgs[..4]).await.unwrap();
    let first = b
        .reserve("c", std::slice::from_ref(&q), 2, SHORT)
        .await
        .unwrap();
    assert_eq!(ids(&first), vec![msgs[0].id, msgs[1].id]);
    b.publish(&msgs[4..]).await.unwrap();
    let queues = [q.clone(), other.clone()];
    let next = b.ack_and_reserve(&first, "c", &queues, 2).await.unwrap();
    assert_eq!(
        ids(&next),
        vec![msgs[4].id, msgs[2].id],
        "the higher priority first, then the oldest"
    );
    let pending: HashSet<JobId> = ids(&b.pending("c", 10).await.unwrap())
        .into_iter()
        .collect();
    assert_eq!(
        pending,
        ids(&next).into_iter().collect(),
        "the acknowledged messages are gone, the new ones are the consumer's"
    );

    // A stale delivery (already acknowledged) beside a live one: only the live one goes.
    b.publish(&dispatches(&other, 3)).await.unwrap();
    let mut acks = next.clone();
    acks.extend(first.clone());
    let more = b.ack_and_reserve(&acks, "c", &queues, 3).await.unwrap();
    assert_eq!(more.len(), 3, "within the asked count: {more:?}");
    assert_eq!(
        ids(&more)[..2],
        [msgs[3].id, msgs[5].id],
        "the first queue's messages first"
    );
    assert_eq!(more[2].queue, other, "then the next queue's");
    assert_eq!(b.pending("c", 10).await.unwrap().len(), 3);

    // Asking for none only acknowledges.
    let none = b
        .ack_and_reserve(&more[..1], "c", &queues, 0)
        .await
        .unwrap();
    assert!(none.is_empty());
    assert_eq!(b.pending("c", 10).await.unwrap().len(), 2);
    let rest = b
        .ack_and_reserve(&more[1..], "c", &queues, 5)
        .await
        .unwrap();
    assert_eq!(rest.len(), 2, "the other queue's last two");
    b.ack(&rest).await.unwrap();

    // Nothing ready: nothing reserved.
    let empty = b.ack_and_reserve(&[], "c", &queues, 4).await.unwrap();
    assert!(empty.is_empty());
    assert!(b.pending("c", 10).await.unwrap().is_empty());

    // An old delivery of a message that was put back and delivered again (a zombie's) removes
    // nothing: the message stays with its new delivery.
    b.publish(&dispatches(&q, 1)).await.unwrap();
    let old = b
        .reserve("c", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(b.requeue("c", &old).await.unwrap(), 1);
    let again = b
        .reserve("c", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(ids(&again), ids(&old));
    let none = b.ack_and_reserve(&old, "c", &queues, 1).await.unwrap();
    assert!(none.is_empty(), "nothing else is ready");
    assert_eq!(
        ids(&b.pending("c", 10).await.unwrap()),
        ids(&again),
        "an old delivery's acknowledgement leaves the new one"
    );
    b.ack(&again).await.unwrap();
}

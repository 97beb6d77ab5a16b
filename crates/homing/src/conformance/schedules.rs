//! Periodic schedules in the store (docs/schedules.md), for every store: set/read/pause/delete,
//! and the firing contract that makes "exactly one job per tick" hold: a compare-and-set of the
//! cursor in the same transaction as the ticks' jobs, each keyed by its tick. The cases are part
//! of [`store_conformance!`](crate::store_conformance).

use std::sync::Arc;
use std::time::Duration;

use crate::job::{new_job_id, JobOptions, NewJob};
use crate::schedule::{self, Firing, Missed, ScheduleDef, Spec};
use crate::store::Store;
use crate::time::now;

use super::unique_queue;

pub(crate) fn def(name: &str, queue: &str, secs: u64) -> ScheduleDef {
    ScheduleDef {
        name: name.into(),
        task: "builtin.noop".into(),
        args: serde_json::json!({"from": "schedule"}),
        queue: queue.into(),
        options: JobOptions {
            max_retries: Some(2),
            ..JobOptions::default()
        },
        spec: Spec::Every {
            interval: Duration::from_secs(secs),
        },
        missed: Missed::Latest,
    }
}

pub(crate) fn firing(d: &ScheduleDef, cursor: i64, ticks: &[i64]) -> Firing {
    Firing {
        name: d.name.clone(),
        expected_cursor: cursor,
        new_cursor: *ticks.last().unwrap_or(&cursor),
        jobs: ticks
            .iter()
            .map(|t| {
                let job = NewJob {
                    id: new_job_id(),
                    task: d.task.clone(),
                    queue: d.queue.clone(),
                    args: d.args.clone(),
                    options: JobOptions {
                        queue: Some(d.queue.clone()),
                        idempotency_key: Some(schedule::tick_key(&d.name, *t)),
                        ..d.options.clone()
                    },
                    created_at: now(),
                    run_at: None,
                };
                (*t, job)
            })
            .collect(),
    }
}

/// The head the periodic pass reads of schedule `name`, if it reads one.
async fn head(s: &dyn Store, name: &str) -> Option<schedule::ScheduleHead> {
    let heads = s.schedule_heads().await.expect("heads");
    assert!(
        heads.windows(2).all(|w| w[0].name < w[1].name),
        "heads by name"
    );
    heads.into_iter().find(|h| h.name == name)
}

pub async fn schedules_are_set_read_paused_and_deleted(s: Arc<dyn Store>) {
    let name = unique_queue("sched");
    let queue = unique_queue("sq");
    let t0 = now();
    let d = def(&name, &queue, 60);
    let set = s.put_schedule(&d, t0).await.expect("put");
    assert_eq!(set.def, d);
    assert!(!set.paused);
    assert_eq!(set.cursor, schedule::whole_second(t0));
    assert_eq!((set.last_tick, set.last_job), (None, None));
    assert_eq!(s.schedule(&name).await.unwrap().as_ref(), Some(&set));
    let page = s.schedules_page(Some(&name[..name.len() - 1]), 10).await;
    assert!(page.unwrap().schedules.iter().any(|x| x == &set));
    let h = head(&*s, &name)
        .await
        .expect("an unpaused schedule has a head");
    assert_eq!((h.spec, h.cursor), (d.spec.clone(), set.cursor));

    // Set again with the same spec (a config file at every start): the cursor stays.
    let mut d2 = d.clone();
    d2.args = serde_json::json!({"from": "config"});
    let again = s.put_schedule(&d2, t0 + 5_000_000).await.unwrap();
    assert_eq!(again.cursor, set.cursor, "same spec keeps the cursor");
    assert_eq!(again.def.args, d2.args);
    // A new spec starts now.
    d2.spec = Spec::Every {
        interval: Duration::from_secs(30),
    };
    let changed = s.put_schedule(&d2, t0 + 7_000_000).await.unwrap();
    assert_eq!(changed.cursor, schedule::whole_second(t0 + 7_000_000));
    let h = head(&*s, &name).await.expect("head");
    assert_eq!((h.spec, h.cursor), (d2.spec.clone(), changed.cursor));

    let paused = s.pause_schedule(&name, true, t0 + 8_000_000).await.unwrap();
    assert!(paused.unwrap().paused);
    assert_eq!(
        head(&*s, &name).await,
        None,
        "a paused schedule is not read by the pass"
    );
    let resumed = s
        .pause_schedule(&name, false, t0 + 20_000_000)
        .await
        .unwrap()
        .unwrap();
    assert!(!resumed.paused);
    assert_eq!(
        resumed.cursor,
        schedule::whole_second(t0 + 20_000_000),
        "ticks that fell while paused are not owed"
    );
    assert_eq!(
        head(&*s, &name).await.map(|h| h.cursor),
        Some(resumed.cursor)
    );
    assert!(s
        .pause_schedule("no-such-schedule", true, t0)
        .await
        .unwrap()
        .is_none());

    assert!(s.delete_schedule(&name).await.unwrap());
    assert!(!s.delete_schedule(&name).await.unwrap());
    assert!(s.schedule(&name).await.unwrap().is_none());
    assert_eq!(head(&*s, &name).await, None);
}

/// A page of schedules holds at most its count and ends before the schedule that would take its
/// definitions past [`PAGE_BYTES`](crate::store::PAGE_BYTES), though it always holds one; `next`
/// names where the following page starts, and paging lists each schedule once, by name.
pub async fn schedule_pages_end_before_their_bytes(s: Arc<dyn Store>) {
    let prefix = unique_queue("paged");
    let queue = unique_queue("pq");
    let third = crate::store::PAGE_BYTES / 3;
    let mut names = Vec::new();
    for (i, pad) in [
        third,
        third,
        third,
        third,
        2 * third,
        crate::store::PAGE_BYTES + 1,
        10,
    ]
    .into_iter()
    .enumerate()
    {
        let mut d = def(&format!("{prefix}-{i}"), &queue, 60);
        d.args = serde_json::json!({ "pad": "x".repeat(pad) });
        s.put_schedule(&d, now()).await.unwrap();
        names.push(d.name);
    }
    let mut pages = Vec::new();
    let mut after = Some(prefix.clone());
    while let Some(a) = after {
        let page = s.schedules_page(Some(&a), 1000).await.unwrap();
        let ours: Vec<String> = page
            .schedules
            .iter()
            .map(|x| x.def.name.clone())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        if ours.is_empty() {
            break;
        }
        if let Some(next) = &page.next {
            assert_eq!(Some(next), page.schedules.last().map(|x| &x.def.name));
        }
        pages.push(ours);
        after = page.next;
    }
    // Three thirds pass the budget; two thirds and a third do not; a schedule bigger than a
    // page comes alone.
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes[..4], [2, 2, 1, 1], "{pages:?}");
    assert_eq!(pages.concat(), names, "each schedule once, by name");
    // The count ends a page too.
    let one = s.schedules_page(Some(&prefix), 1).await.unwrap();
    assert_eq!(one.schedules.len(), 1);
    assert_eq!(one.next.as_deref(), Some(names[0].as_str()));
    for n in &names {
        s.delete_schedule(n).await.unwrap();
    }
}

/// The count the periodic pass reads before deciding to read the heads again
/// (`Store::schedule_changes`): moved by a schedule set, paused, resumed or deleted, by exactly
/// one with a firing that moved the cursor (however many ticks it enqueued, and although it also
/// records `last_tick`), and not by reads. The pass trusts the heads it keeps when the count
/// moved by its own firings alone, so "exactly one" is what keeps it from missing a change.
pub async fn schedule_changes_are_counted(s: Arc<dyn Store>) {
    let count = |s: Arc<dyn Store>| async move {
        s.schedule_changes()
            .await
            .expect("count")
            .expect("a store that answered a count once keeps one")
    };
    let name = unique_queue("chg");
    let d = def(&name, &unique_queue("cq"), 1);
    // A store may keep no count (the trait's default): the pass then reads every time, and
    // there is nothing to hold it to. Both of homing's stores keep one.
    if s.schedule_changes().await.expect("count").is_none() {
        return;
    }
    let n0 = count(s.clone()).await;
    let set = s.put_schedule(&d, now()).await.unwrap();
    let n1 = count(s.clone()).await;
    assert!(n1 > n0, "a new schedule is counted");

    s.schedule(&name).await.unwrap().expect("set");
    s.schedule_heads().await.unwrap();
    s.schedules_page(None, 10).await.unwrap();
    assert_eq!(count(s.clone()).await, n1, "reads are not counted");

    let c = set.cursor;
    let one = firing(&d, c, &[c + 1_000_000]);
    assert!(s.fire_schedule(&one, now()).await.unwrap().is_some());
    let n2 = count(s.clone()).await;
    assert_eq!(n2, n1 + 1, "a firing counts exactly one");
    let two = firing(&d, c + 1_000_000, &[c + 2_000_000, c + 3_000_000]);
    assert!(s.fire_schedule(&two, now()).await.unwrap().is_some());
    let n3 = count(s.clone()).await;
    assert_eq!(n3, n2 + 1, "a firing of two ticks counts exactly one");

    s.pause_schedule(&name, true, now()).await.unwrap();
    let n4 = count(s.clone()).await;
    assert!(n4 > n3, "a pause is counted");
    s.pause_schedule(&name, false, now()).await.unwrap();
    let n5 = count(s.clone()).await;
    assert!(n5 > n4, "a resume is counted");
    let mut other = d.clone();
    other.spec = Spec::Every {
        interval: Duration::from_secs(7),
    };
    s.put_schedule(&other, now()).await.unwrap();
    let n6 = count(s.clone()).await;
    assert!(n6 > n5, "a new spec is counted");
    assert!(s.delete_schedule(&name).await.unwrap());
    assert!(count(s.clone()).await > n6, "a deletion is counted");
}

pub async fn schedule_ticks_get_one_job_each(s: Arc<dyn Store>) {
    let name = unique_queue("tick");
    let queue = unique_queue("tq");
    let d = def(&name, &queue, 1);
    let set = s.put_schedule(&d, now()).await.unwrap();
    let c = set.cursor;
    let ticks = [c + 1_000_000, c + 2_000_000];

    // Eight schedulers decide the same ticks at once: one wins, the others write nothing.
    let mut racers = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        let f = firing(&d, c, &ticks);
        racers.push(tokio::spawn(
            async move { s.fire_schedule(&f, now()).await },
        ));
    }
    let mut wins = Vec::new();
    for r in racers {
        if let Some(ins) = r.await.unwrap().expect("fire") {
            wins.push(ins);
        }
    }
    assert_eq!(wins.len(), 1, "exactly one scheduler fires a tick");
    let ins = &wins[0];
    assert_eq!(ins.len(), 2);
    assert!(ins.iter().all(|i| !i.existed && i.needs_dispatch()));

    for (i, t) in ins.iter().zip(ticks) {
        let job = s.get(i.id).await.unwrap().unwrap();
        assert_eq!(job.schedule.as_deref(), Some(name.as_str()));
        assert_eq!(job.scheduled_tick, Some(t));
        assert_eq!(job.queue, queue);
        assert_eq!(job.args, d.args);
        assert_eq!(job.max_retries, Some(2));
        let json = serde_json::to_value(&job).unwrap();
        assert_eq!(json["schedule"], name.as_str());
        assert_eq!(json["scheduled_tick"], crate::time::rfc3339(t).as_str());
    }
    let after = s.schedule(&name).await.unwrap().unwrap();
    assert_eq!(after.cursor, ticks[1]);
    assert_eq!(after.last_tick, Some(ticks[1]));
    assert_eq!(after.last_job, Some(ins[1].id));

    // A stale decision (the old cursor) writes nothing.
    assert!(s
        .fire_schedule(&firing(&d, c, &ticks), now())
        .await
        .unwrap()
        .is_none());
    // A paused schedule fires nothing.
    s.pause_schedule(&name, true, now()).await.unwrap();
    let next = [ticks[1] + 1_000_000];
    assert!(s
        .fire_schedule(&firing(&d, ticks[1], &next), now())
        .await
        .unwrap()
        .is_none());
    // Recreated under the same name, an old tick's job is the existing one (its key).
    s.delete_schedule(&name).await.unwrap();
    let again = s.put_schedule(&d, now()).await.unwrap();
    let replay = s
        .fire_schedule(&firing(&d, again.cursor, &[ticks[0]]), now())
        .await
        .unwrap()
        .unwrap();
    assert!(replay[0].existed);
    assert_eq!(replay[0].id, ins[0].id);
    // A cursor may also move with no job (skipped ticks).
    let skip = s
        .fire_schedule(&firing(&d, ticks[0], &[]), now())
        .await
        .unwrap();
    assert_eq!(skip.map(|v| v.len()), Some(0));
}

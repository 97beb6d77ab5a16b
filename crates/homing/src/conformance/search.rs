//! Job search (docs/operate.md), for every store: a backend's test file invokes
//! [`search_conformance!`](crate::search_conformance) beside the store suite.

use std::sync::Arc;

use serde_json::json;

use super::{new_job, unique_queue};
use crate::job::{JobId, JobState};
use crate::search::{JobSearch, RawSearch};
use crate::store::*;
use crate::time::now;

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store.
#[macro_export]
macro_rules! search_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(search, $make;
            search_matches_every_field, search_pages_by_cursor_and_escapes_nothing,
            search_pages_stop_at_their_byte_budget
        );
    };
}

fn search(raw: RawSearch<'_>) -> JobSearch {
    JobSearch::parse(&raw).expect("a valid search")
}

async fn ids(s: &dyn Store, q: &JobSearch) -> Vec<JobId> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = s.search(q, cursor.as_deref(), 3).await.expect("search");
        assert!(page.jobs.len() <= 3);
        out.extend(page.jobs.iter().map(|j| j.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// Each field narrows the result to exactly the jobs it describes.
pub async fn search_matches_every_field(s: Arc<dyn Store>) {
    let q = unique_queue("search");
    let base = now();
    let argses = [
        json!({"customer": {"id": 7, "name": "ann"}, "items": [{"sku": "A-1"}]}),
        json!({"customer": {"id": 8, "name": "bob"}, "items": [{"sku": "B-2"}, {"sku": "A-1"}]}),
        json!({"customer": {"id": "7"}, "note": "50%_off"}),
        json!({"note": "50xyoff", "flag": true}),
        json!(["top", {"k": null}]),
    ];
    let mut jobs = Vec::new();
    for (i, args) in argses.iter().enumerate() {
        let mut nj = new_job(&q, if i < 2 { "t.search.a" } else { "t.search.b" });
        nj.args = args.clone();
        nj.created_at = base + i as i64 * 1_000_000;
        jobs.push(nj.id);
        s.insert(vec![nj]).await.expect("insert");
    }
    let queue = Some(q.as_str());
    let find = |raw: RawSearch<'static>| {
        let mut raw = raw;
        raw.queue = None;
        let mut q = search(raw);
        q.queue = queue.map(str::to_string);
        q
    };
    let expect = |idx: &[usize]| idx.iter().rev().map(|i| jobs[*i]).collect::<Vec<_>>();

    assert_eq!(
        ids(&*s, &find(RawSearch::default())).await,
        expect(&[0, 1, 2, 3, 4])
    );
    assert_eq!(
        ids(
            &*s,
            &find(RawSearch {
                task: Some("t.search.a"),
                ..Default::default()
            })
        )
        .await,
        expect(&[0, 1])
    );
    // A whole id, and a prefix long enough to be unique to it.
    let whole = jobs[2].to_string();
    let by_id = search(RawSearch {
        id: Some(Box::leak(whole.clone().into_boxed_str())),
        ..Default::default()
    });
    assert_eq!(ids(&*s, &by_id).await, vec![jobs[2]]);
    let upper = whole[..30].to_uppercase();
    let by_prefix = search(RawSearch {
        id: Some(Box::leak(upper.into_boxed_str())),
        ..Default::default()
    });
    assert_eq!(ids(&*s, &by_prefix).await, vec![jobs[2]]);
    // Time range: [base + 1 s, base + 3 s).
    let mut t = find(RawSearch::default());
    t.created_from = Some(base + 1_000_000);
    t.created_to = Some(base + 3_000_000);
    assert_eq!(ids(&*s, &t).await, expect(&[1, 2]));
    // Args at a path: numbers and strings are told apart, nested keys and indexes work.
    let at = |p: &'static str, v: &'static str| {
        find(RawSearch {
            args_path: Some(p),
            args_value: Some(v),
            ..Default::default()
        })
    };
    assert_eq!(ids(&*s, &at("customer.id", "7")).await, expect(&[0]));
    assert_eq!(ids(&*s, &at("customer.id", "\"7\"")).await, expect(&[2]));
    assert_eq!(ids(&*s, &at("customer.name", "bob")).await, expect(&[1]));
    assert_eq!(ids(&*s, &at("items[0].sku", "A-1")).await, expect(&[0]));
    assert_eq!(ids(&*s, &at("items[1].sku", "A-1")).await, expect(&[1]));
    assert_eq!(ids(&*s, &at("flag", "true")).await, expect(&[3]));
    assert_eq!(ids(&*s, &at("[1].k", "null")).await, expect(&[4]));
    assert_eq!(ids(&*s, &at("customer.missing", "7")).await, expect(&[]));
    // Substrings are plain text: % and _ are not wildcards.
    let has = |c: &'static str| {
        find(RawSearch {
            args_contains: Some(c),
            ..Default::default()
        })
    };
    assert_eq!(ids(&*s, &has("%_")).await, expect(&[2]));
    assert_eq!(ids(&*s, &has("50")).await, expect(&[2, 3]));
    assert_eq!(ids(&*s, &has("\"sku\":\"A-1\"")).await, expect(&[0, 1]));
    assert_eq!(ids(&*s, &has("' OR 1=1 --")).await, expect(&[]));
    // State, after one job ran.
    s.start(&[jobs[3]], "w", now()).await.expect("start");
    let mut running = find(RawSearch::default());
    running.state = Some(JobState::Running);
    assert_eq!(ids(&*s, &running).await, vec![jobs[3]]);
    // Each state by each filter. On SQLite queued and running jobs are not in the state indexes
    // (migration 0021), so these take other indexes there than the resting states do.
    s.cancel(jobs[4], now()).await.expect("cancel");
    let by = |state: JobState, task: Option<&'static str>| {
        let mut f = find(RawSearch {
            task,
            ..Default::default()
        });
        f.state = Some(state);
        f
    };
    assert_eq!(
        ids(&*s, &by(JobState::Queued, None)).await,
        expect(&[0, 1, 2])
    );
    assert_eq!(
        ids(&*s, &by(JobState::Queued, Some("t.search.a"))).await,
        expect(&[0, 1])
    );
    assert_eq!(
        ids(&*s, &by(JobState::Running, Some("t.search.b"))).await,
        vec![jobs[3]]
    );
    assert_eq!(
        ids(&*s, &by(JobState::Running, Some("t.search.a"))).await,
        expect(&[])
    );
    assert_eq!(ids(&*s, &by(JobState::Cancelled, None)).await, expect(&[4]));
    assert_eq!(
        ids(&*s, &by(JobState::Cancelled, Some("t.search.b"))).await,
        expect(&[4])
    );
    // Across queues (other cases may share the store): these jobs among the matches, in order.
    let mine = |v: Vec<JobId>| {
        v.into_iter()
            .filter(|i| jobs.contains(i))
            .collect::<Vec<_>>()
    };
    for (state, want) in [
        (JobState::Queued, expect(&[0, 1])),
        (JobState::Running, expect(&[])),
        (JobState::Cancelled, expect(&[])),
    ] {
        let mut f = search(RawSearch {
            task: Some("t.search.a"),
            ..Default::default()
        });
        f.state = Some(state);
        assert_eq!(mine(ids(&*s, &f).await), want, "{state} across queues");
    }
    let count = |state: JobState, task: &str| {
        let filter = JobFilter {
            state: Some(state),
            queue: queue.map(str::to_string),
            task: Some(task.to_string()),
        };
        let s = s.clone();
        async move { s.count(&filter).await.expect("count") }
    };
    assert_eq!(count(JobState::Queued, "t.search.a").await, 2);
    assert_eq!(count(JobState::Queued, "t.search.b").await, 1);
    assert_eq!(count(JobState::Running, "t.search.b").await, 1);
    assert_eq!(count(JobState::Cancelled, "t.search.b").await, 1);
    assert_eq!(count(JobState::Succeeded, "t.search.b").await, 0);
}

/// A search pages through many matches newest first without repeats; a bad cursor is refused.
pub async fn search_pages_by_cursor_and_escapes_nothing(s: Arc<dyn Store>) {
    let q = unique_queue("searchpage");
    let mut all = Vec::new();
    for i in 0..10 {
        let mut nj = new_job(&q, "t.page");
        nj.args = json!({"i": i, "even": i % 2 == 0});
        all.push((nj.id, i % 2 == 0));
        s.insert(vec![nj]).await.expect("insert");
    }
    let mut even = search(RawSearch {
        args_path: Some("even"),
        args_value: Some("true"),
        ..Default::default()
    });
    even.queue = Some(q.clone());
    let got = ids(&*s, &even).await;
    let want: Vec<JobId> = all
        .iter()
        .rev()
        .filter(|(_, e)| *e)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(got, want);
    assert!(matches!(
        s.search(&even, Some("not-a-cursor"), 5).await,
        Err(crate::Error::Invalid(_))
    ));
}

/// A page stops before the job that would take its stored text past [`PAGE_BYTES`], however
/// high the limit, and holds one job larger than that alone: following the cursors gives every
/// job once, newest first.
pub async fn search_pages_stop_at_their_byte_budget(s: Arc<dyn Store>) {
    let q = unique_queue("searchbytes");
    let third = "x".repeat(PAGE_BYTES / 3);
    let whole = "y".repeat(PAGE_BYTES + 1);
    let mut all = Vec::new();
    for pad in [
        &third,
        &third,
        &third,
        &third,
        &third,
        &whole,
        &String::new(),
        &String::new(),
    ] {
        let mut nj = new_job(&q, "t.bytes");
        nj.args = json!({ "pad": pad });
        all.push(nj.id);
        s.insert(vec![nj]).await.expect("insert");
    }
    all.reverse();
    let mut q = JobSearch {
        queue: Some(q),
        ..Default::default()
    };
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = s.search(&q, cursor.as_deref(), 1000).await.expect("search");
        sizes.push(page.jobs.len());
        got.extend(page.jobs.iter().map(|j| j.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        sizes,
        [2, 1, 2, 2, 1],
        "pages of the two small, the large, then the thirds"
    );
    assert_eq!(got, all);
    // The count limit still ends a page first when it is lower.
    q.task = Some("t.bytes".into());
    let page = s.search(&q, None, 1).await.expect("search");
    assert_eq!(page.jobs.len(), 1);
    assert_eq!(page.next_cursor, Some(all[0].to_string()));
}

//! Responsible for turning Celery messages into homing jobs. It claims messages from kombu's
//! Redis lists atomically into its own claimed hash ([`super::scripts`]), records each as a homing
//! job in the store — the job id is the Celery task id, so a message seen twice finds its job
//! (idempotency key `celery:<task id>`) — publishes them through homing's broker, and only then
//! removes them from the claimed hash. From the store commit on, a Celery task is an ordinary
//! homing job with every guarantee: late ack, fencing, reclaim by heartbeat, crash budget.
//!
//! A claimed message lives in Redis for the milliseconds between claim and commit. If the
//! ingress dies there, its heartbeat key expires after three intervals and any other ingress
//! (its sweep runs every interval) puts the claimed messages back at the head of their lists —
//! liveness decides, not kombu's one-hour visibility timeout. A message that cannot be decoded is
//! recorded as a `dead` job with the reason and its payload, and the ingress carries on.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::conn::Conn;
use super::scripts::Scripts;
use super::{keys, results, wire};
use crate::broker::Broker;
use crate::client::publish;
use crate::error::Result;
use crate::job::{JobOptions, NewJob};
use crate::store::{Inserted, Store, ToPublish};
use crate::task::Registry;
use crate::time::now;

/// The homing task name of a dead record made from an undecodable Celery message.
pub const MALFORMED_TASK: &str = "celery.malformed";

const MIN_NAP: Duration = Duration::from_millis(5);
const MAX_NAP: Duration = Duration::from_millis(100);

/// How an ingress runs.
#[derive(Debug, Clone)]
pub struct IngressConfig {
    /// Celery queues (kombu list names) to take messages from; their jobs go to the homing queue
    /// of the same name.
    pub queues: Vec<String>,
    /// Most messages claimed (and recorded in one store transaction) at once.
    pub batch: usize,
    pub heartbeat_interval: Duration,
    /// Whether results go to a Celery result backend (attach the result follow-up).
    pub results: bool,
    /// A prefix for the ingress consumer's name (defaults to the host name).
    pub name: Option<String>,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            queues: vec!["celery".into()],
            batch: 64,
            heartbeat_interval: Duration::from_secs(2),
            results: false,
            name: None,
        }
    }
}

pub struct Ingress {
    conn: Conn,
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
    config: IngressConfig,
    id: String,
    scripts: Arc<Scripts>,
}

impl std::fmt::Debug for Ingress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingress")
            .field("id", &self.id)
            .field("celery", &self.conn)
            .field("queues", &self.config.queues)
            .finish()
    }
}

/// One claimed message: its field in the claimed hash, and its payload.
type Claimed = (String, Vec<u8>);

impl Ingress {
    /// `registry` gives each task's retry budget, so a Celery `retries` header spends it.
    pub fn new(
        conn: Conn,
        broker: Arc<dyn Broker>,
        store: Arc<dyn Store>,
        registry: Registry,
        config: IngressConfig,
    ) -> Self {
        let host = config
            .name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "ingress".into());
        let id = format!(
            "{host}-{}-{:06x}",
            std::process::id(),
            fastrand::u32(..0xff_ffff)
        );
        Self {
            conn,
            broker,
            store,
            registry,
            config,
            id,
            scripts: Arc::new(Scripts::new()),
        }
    }

    pub fn consumer(&self) -> &str {
        &self.id
    }

    fn ttl(&self) -> Duration {
        self.config.heartbeat_interval * 3
    }

    /// Runs until `stop` is cancelled; then finishes the batch in hand and hands back anything
    /// still claimed.
    pub async fn run(self, stop: CancellationToken) -> Result<()> {
        let this = Arc::new(self);
        loop {
            match this.beat().await {
                Ok(_) => break,
                Err(e) if e.is_transient() && !stop.is_cancelled() => {
                    tracing::warn!(error = %e, celery = %this.conn.display, "Celery Redis not reachable; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        }
        tracing::info!(consumer = %this.id, queues = ?this.config.queues, celery = %this.conn.display, "celery ingress ready");
        let hb_stop = CancellationToken::new();
        let hb = tokio::spawn(heartbeat_loop(this.clone(), hb_stop.clone()));
        let mut nap = MIN_NAP;
        let mut seq = 0u64;
        while !stop.is_cancelled() {
            let mut got = false;
            for q in &this.config.queues {
                seq += 1;
                match this.claim(q, seq).await {
                    Ok(items) if !items.is_empty() => {
                        got = true;
                        this.record(q, items, &stop).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, queue = %q, "cannot take Celery messages; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = stop.cancelled() => {}
                        }
                    }
                }
            }
            if got {
                nap = MIN_NAP;
            } else {
                tokio::select! {
                    _ = tokio::time::sleep(nap) => {}
                    _ = stop.cancelled() => {}
                }
                nap = (nap * 2).min(MAX_NAP);
            }
        }
        hb_stop.cancel();
        let _ = hb.await;
        // Leaving: drop the heartbeat, then put back whatever is still claimed (nothing, unless
        // the store was unreachable), so no one waits for a TTL.
        if let Ok(mut c) = this.conn.get().await {
            let _ = ::redis::cmd("DEL")
                .arg(keys::alive(&this.id))
                .query_async::<()>(&mut c)
                .await;
        }
        let _ = this.restore(&this.id).await;
        Ok(())
    }

    /// Refreshes this consumer's heartbeat; returns whether it was still there.
    async fn beat(&self) -> Result<bool> {
        let mut c = self.conn.get().await?;
        let (existed, _): (Option<String>, i64) = ::redis::pipe()
            .cmd("SET")
            .arg(keys::alive(&self.id))
            .arg("1")
            .arg("PX")
            .arg(self.ttl().as_millis() as u64)
            .arg("GET")
            .cmd("SADD")
            .arg(keys::consumers())
            .arg(&self.id)
            .query_async(&mut c)
            .await
            .map_err(crate::broker::redis::err)?;
        Ok(existed.is_some())
    }

    async fn claim(&self, queue: &str, seq: u64) -> Result<Vec<Claimed>> {
        let mut inv = self.scripts.claim.prepare_invoke();
        for k in keys::queue_lists(queue) {
            inv.key(k);
        }
        inv.key(keys::claimed(&self.id));
        inv.arg(self.config.batch.max(1)).arg(seq);
        let mut c = self.conn.get().await?;
        let flat: Vec<Vec<u8>> = inv
            .invoke_async(&mut c)
            .await
            .map_err(crate::broker::redis::err)?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        let mut it = flat.into_iter();
        while let (Some(f), Some(p)) = (it.next(), it.next()) {
            out.push((String::from_utf8_lossy(&f).into_owned(), p));
        }
        Ok(out)
    }

    /// Puts a consumer's claimed messages back unless it is alive; returns how many.
    async fn restore(&self, consumer: &str) -> Result<i64> {
        let mut c = self.conn.get().await?;
        self.scripts
            .restore
            .key(keys::alive(consumer))
            .key(keys::claimed(consumer))
            .key(keys::consumers())
            .arg(consumer)
            .invoke_async(&mut c)
            .await
            .map_err(crate::broker::redis::err)
    }

    /// Restores every lost ingress consumer's claimed messages.
    async fn sweep(&self) -> Result<()> {
        let mut c = self.conn.get().await?;
        let members: Vec<String> = ::redis::cmd("SMEMBERS")
            .arg(keys::consumers())
            .query_async(&mut c)
            .await
            .map_err(crate::broker::redis::err)?;
        for m in members.iter().filter(|m| **m != self.id) {
            let n = self.restore(m).await?;
            if n > 0 {
                tracing::warn!(event = "celery.reclaimed", consumer = %m, messages = n, "put back the Celery messages of a lost ingress");
            }
        }
        Ok(())
    }

    fn new_job(&self, queue: &str, m: &wire::Message, at: i64) -> NewJob {
        let max_retries = (m.retries > 0).then(|| {
            self.registry
                .get(&m.task)
                .map(|h| h.defaults().max_retries)
                .unwrap_or(crate::retry::DEFAULT_MAX_RETRIES)
                .saturating_sub(m.retries)
        });
        let wants_result = self.config.results && !m.ignore_result;
        let follow = (wants_result || m.expires.is_some()).then(|| {
            let mut f = results::follow_up(queue, m);
            f.args["celery"]["store"] = wants_result.into();
            f
        });
        NewJob {
            id: m.job_id(),
            task: m.task.clone(),
            queue: queue.to_string(),
            args: m.input(),
            options: JobOptions {
                queue: Some(queue.to_string()),
                idempotency_key: Some(format!("celery:{}", m.id)),
                max_retries,
                on_success: follow.clone(),
                on_failure: follow,
                ..JobOptions::default()
            },
            created_at: at,
            run_at: m.eta.filter(|t| *t > at),
        }
    }

    /// Records claimed messages as jobs (or dead records), publishes them, then unclaims them.
    async fn record(&self, queue: &str, items: Vec<Claimed>, stop: &CancellationToken) {
        let at = now();
        let mut jobs = Vec::new();
        let mut dead: Vec<(Vec<u8>, wire::Malformed)> = Vec::new();
        for (_, payload) in &items {
            match wire::decode(payload) {
                Ok(m) => {
                    let job = self.new_job(queue, &m, at);
                    match refusal(&job) {
                        Some(reason) => dead.push((
                            payload.clone(),
                            wire::Malformed {
                                reason,
                                id: Some(m.id),
                                task: Some(m.task),
                            },
                        )),
                        None => jobs.push(job),
                    }
                }
                Err(e) => dead.push((payload.clone(), e)),
            }
        }
        let Some(inserted) = self.insert(jobs, &mut dead, stop).await else {
            return; // the store stayed away and we are stopping: the messages go back
        };
        let to_send: Vec<ToPublish> = inserted
            .iter()
            .filter(|i| i.needs_dispatch())
            .map(|i| ToPublish {
                id: i.id,
                queue: i.queue.clone(),
                priority: 0,
            })
            .collect();
        if let Err(e) = publish(&*self.broker, &*self.store, &to_send).await {
            tracing::warn!(error = %e, jobs = to_send.len(), "publish failed; the reconciler will publish these jobs");
        }
        for (payload, e) in dead {
            if !self.record_dead(queue, &payload, &e, stop).await {
                return;
            }
        }
        let fields: Vec<&String> = items.iter().map(|(f, _)| f).collect();
        let unclaimed = async {
            let mut c = self.conn.get().await?;
            ::redis::cmd("HDEL")
                .arg(keys::claimed(&self.id))
                .arg(&fields)
                .query_async::<()>(&mut c)
                .await
                .map_err(crate::broker::redis::err)
        };
        if let Err(e) = unclaimed.await {
            // Harmless: if these come back, their jobs exist and the guard skips them.
            tracing::warn!(error = %e, "cannot unclaim recorded Celery messages");
        }
    }

    /// Inserts jobs, retrying while the store is unavailable. A batch the store refuses for
    /// another reason is inserted one by one, and what still fails becomes a dead record.
    async fn insert(
        &self,
        jobs: Vec<NewJob>,
        dead: &mut Vec<(Vec<u8>, wire::Malformed)>,
        stop: &CancellationToken,
    ) -> Option<Vec<Inserted>> {
        if jobs.is_empty() {
            return Some(Vec::new());
        }
        match self.insert_retrying(jobs.clone(), stop).await? {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "the store refused a batch of Celery jobs; recording them one by one");
                let mut out = Vec::new();
                for j in jobs {
                    match self.insert_retrying(vec![j.clone()], stop).await? {
                        Ok(mut v) => out.append(&mut v),
                        Err(e) => dead.push((
                            serde_json::to_vec(&j.args).unwrap_or_default(),
                            wire::Malformed {
                                reason: format!("the store refused the job: {e}"),
                                id: j.options.idempotency_key.clone(),
                                task: Some(j.task.clone()),
                            },
                        )),
                    }
                }
                Some(out)
            }
        }
    }

    /// `None` when stopping with the store still unavailable; `Some(Err)` for a refusal.
    async fn insert_retrying(
        &self,
        jobs: Vec<NewJob>,
        stop: &CancellationToken,
    ) -> Option<Result<Vec<Inserted>>> {
        let mut nap = Duration::from_millis(50);
        loop {
            match self.store.insert(jobs.clone()).await {
                Err(e) if e.is_transient() => {
                    if stop.is_cancelled() {
                        return None;
                    }
                    tracing::warn!(error = %e, "store unavailable while recording Celery jobs; retrying");
                    tokio::time::sleep(nap).await;
                    nap = (nap * 2).min(Duration::from_secs(2));
                }
                other => return Some(other),
            }
        }
    }

    /// Keeps an undecodable message as a `dead` job with the reason (visible in `homing jobs
    /// list --state dead`). Its id derives from the bytes, so a message put back after a crash is
    /// recorded once.
    async fn record_dead(
        &self,
        queue: &str,
        payload: &[u8],
        e: &wire::Malformed,
        stop: &CancellationToken,
    ) -> bool {
        let id = wire::garbage_id(payload);
        tracing::error!(event = "celery.dead_letter", queue, job = %id, celery_id = ?e.id, reason = %e.reason, "undecodable Celery message recorded as a dead job");
        // Garbage may hold U+0000, which PostgreSQL cannot store: every text is scrubbed.
        let scrub = |t: &str| crate::validate::text(t, wire::MAX_KEPT_PAYLOAD);
        let kept = scrub(&String::from_utf8_lossy(payload));
        let job = NewJob {
            id,
            task: MALFORMED_TASK.into(),
            queue: queue.to_string(),
            args: serde_json::json!({
                "reason": scrub(&e.reason),
                "celery_id": e.id.as_deref().map(scrub),
                "celery_task": e.task.as_deref().map(scrub),
                "payload": kept,
            }),
            options: JobOptions {
                queue: Some(queue.to_string()),
                idempotency_key: Some(format!("celery-malformed:{id}")),
                ..JobOptions::default()
            },
            created_at: now(),
            run_at: None,
        };
        let Some(Ok(_)) = self.insert_retrying(vec![job], stop).await else {
            return false;
        };
        let reason =
            crate::validate::error_text(&format!("undecodable Celery message: {}", e.reason));
        self.store.mark_dead(id, &reason, now()).await.is_ok()
    }
}

/// Why a Celery message's job breaks the rules every producer's job follows (see
/// [`crate::validate`]), if it does: an internal task, arguments too deep or too large, a task
/// id that cannot be an idempotency key, an eta further away than any countdown may be. The ingress's own follow-up is homing's, not the
/// producer's, and is not checked against the producer rules.
fn refusal(job: &NewJob) -> Option<String> {
    use crate::validate as v;
    let key = job.options.idempotency_key.as_deref().unwrap_or_default();
    let latest = job
        .created_at
        .saturating_add(crate::time::micros(v::MAX_DELAY));
    if job.run_at.is_some_and(|t| t > latest) {
        return Some("the eta is more than 366 days away".into());
    }
    v::producer_task(&job.task)
        .and_then(|_| v::json("the arguments", &job.args, v::MAX_ARGS_BYTES))
        .and_then(|_| v::idempotency_key(key).map_err(|_| "the task id must be printable".into()))
        .err()
}

/// Responsible for the ingress's liveness: refreshes its heartbeat and puts back the claimed
/// messages of ingress consumers whose heartbeat expired.
async fn heartbeat_loop(ingress: Arc<Ingress>, stop: CancellationToken) {
    let every = ingress.config.heartbeat_interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        match ingress.beat().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(consumer = %ingress.id, "the ingress heartbeat had expired; its claimed messages may have been put back (their jobs are recorded once)")
            }
            Err(e) => tracing::warn!(error = %e, "cannot refresh the ingress heartbeat"),
        }
        if let Err(e) = ingress.sweep().await {
            tracing::warn!(error = %e, "cannot sweep lost Celery ingress consumers");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(task: &str, args: serde_json::Value, celery_id: &str) -> NewJob {
        NewJob {
            id: crate::job::new_job_id(),
            task: task.into(),
            queue: "celery".into(),
            args,
            options: JobOptions {
                idempotency_key: Some(format!("celery:{celery_id}")),
                on_success: Some(results::follow_up(
                    "celery",
                    &wire::decode(
                        wire::encode(
                            &wire::Outgoing {
                                id: "x".into(),
                                task: task.into(),
                                queue: "celery".into(),
                                args: vec![],
                                kwargs: Default::default(),
                                eta: None,
                                expires: None,
                                priority: 0,
                            },
                            "t",
                        )
                        .as_bytes(),
                    )
                    .unwrap(),
                )),
                ..JobOptions::default()
            },
            created_at: 0,
            run_at: None,
        }
    }

    /// A Celery producer is a producer: internal tasks, unstorable args and unprintable ids
    /// become dead records with the reason, while the ingress's own `celery.result` follow-up
    /// is not held against the message.
    #[test]
    fn producer_rules_apply_to_celery_messages() {
        assert_eq!(
            refusal(&job("tasks.add", serde_json::json!({"x": 1}), "id-1")),
            None
        );
        let r = refusal(&job("builtin.webhook", serde_json::json!({}), "id-2")).unwrap();
        assert!(r.contains("internal"), "{r}");
        let r = refusal(&job("celery.result", serde_json::json!({}), "id-3")).unwrap();
        assert!(r.contains("internal"), "{r}");
        let deep = crate::validate::nested(100, serde_json::json!(1));
        let r = refusal(&job("tasks.add", deep, "id-4")).unwrap();
        assert!(r.contains("deeper"), "{r}");
        let r = refusal(&job("tasks.add", serde_json::json!({"s": "\u{0}"}), "id-5")).unwrap();
        assert!(r.contains("U+0000"), "{r}");
        let r = refusal(&job("tasks.add", serde_json::json!({}), "a\u{7}b")).unwrap();
        assert!(r.contains("task id"), "{r}");
        let mut far = job("tasks.add", serde_json::json!({}), "id-6");
        far.run_at = Some(crate::time::LAST_PRINTABLE + 1);
        assert!(refusal(&far).unwrap().contains("eta"));
    }
}

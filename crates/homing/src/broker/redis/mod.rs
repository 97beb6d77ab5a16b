//! The broker on Redis Streams (Redis ≥ 6.2 or Valkey), for deployments where workers run on
//! several machines. docs/design.md section 5 is the brief; the choices that follow from it:
//!
//! - One stream per queue with one consumer group. A message is an entry with a field `job`; a
//!   reservation is `XREADGROUP … >`, which puts the entry in the group's pending list under the
//!   reserving consumer (late ack), and an ack is `XACK` + `XDEL`, so a stream only ever holds
//!   ready and reserved messages and nothing is trimmed.
//! - Priorities: a queue is in fact one stream per priority band ([`keys::band`]: seven bands,
//!   priority 0 alone in the queue's original stream), FIFO within a band. A reservation reads
//!   the bands highest first inside one script call (skipping empty bands with an `XLEN`), and a
//!   blocked reservation waits on every band, so an unprioritised queue pays no extra round trip.
//!   A delivery's tag names its band, so ack, requeue and dead-letter touch the right stream, and
//!   a requeued message stays in its band: a reclaimed job keeps its priority.
//! - A requeued message stays where it is: it is handed (`XCLAIM`) to a placeholder consumer and
//!   reservations claim from it before reading new entries, so a reclaimed job runs before the
//!   backlog. A delivery's tag carries the entry's delivery count, which every hand-over raises,
//!   so a zombie's ack of an old delivery matches nothing ([`scripts`] explains both).
//! - Blocking reads run on a connection of their own per consumer: on a shared (multiplexed)
//!   connection a `BLOCK` would hold up every other command behind it. Everything else shares one
//!   auto-reconnecting [`ConnectionManager`].
//! - Ownership checks and moves ("requeue only what that consumer still owns") are Lua scripts
//!   ([`scripts`]), hence atomic against concurrent rescuers.
//! - Liveness is a key with a TTL per worker. Consumers are found in the groups (`XINFO
//!   CONSUMERS`) and in a set of registered workers, so a worker that died before or after
//!   reserving anything is noticed either way.
//! - Redis may lose its data (restart without persistence, `FLUSHALL`, failover to a stale
//!   replica). A marker key tells the reconciler, which re-dispatches from the store; groups are
//!   re-created on `NOGROUP`, so reservations keep working.
//! - Failures to reach the server are [`Error::Unavailable`], so callers retry; nothing here
//!   blocks longer than a bounded timeout.

mod entry;
pub mod keys;
mod scripts;
mod url;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use ::redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::*;
use crate::error::Error;
use crate::time::now;
use entry::{int, items, string, Tag};
use keys::{band, Keys, BANDS, GROUP, REQUEUED};
use scripts::Scripts;

const BACKEND: &str = "redis";

/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a (non-blocking) command may wait for its reply on the shared connection.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than its `BLOCK` a reservation waits for the reply before it gives the
/// connection up as broken.
const READ_MARGIN: Duration = Duration::from_secs(2);
/// The longest single `BLOCK`: a requeued message does not wake a blocked reader (nothing is
/// added to the stream), so a long wait is cut into slices that look for requeued entries.
const BLOCK_SLICE: Duration = Duration::from_secs(1);
/// Most entry ids passed to one script call (Lua's `unpack` has a limit of a few thousand).
const CHUNK: usize = 1000;
/// A reserving consumer's connection is closed after this long unused (consumers of sessions
/// that ended, e.g. a worker that rejoined under a new name).
const READER_IDLE: Duration = Duration::from_secs(300);

/// A reserving consumer's own connection, opened on first use and dropped when it breaks.
struct Reader {
    conn: Arc<tokio::sync::Mutex<Option<MultiplexedConnection>>>,
    used: Instant,
}

pub struct RedisBroker {
    client: ::redis::Client,
    keys: Keys,
    /// The server's address without credentials, for logs.
    display: String,
    manager: tokio::sync::OnceCell<ConnectionManager>,
    readers: Mutex<HashMap<String, Reader>>,
    /// Queues whose consumer group this process created or found. Only a cache: a `NOGROUP`
    /// answer empties it for the queues concerned.
    groups: Mutex<HashSet<String>>,
    scripts: Scripts,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("server", &self.display)
            .finish()
    }
}

/// Maps a client error: anything that means "the server is not reachable right now" is
/// transient, everything else (a script bug, a wrong key type, bad credentials) is not.
pub(crate) fn err(e: RedisError) -> Error {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    if transient {
        Error::unavailable_from(BACKEND, e)
    } else {
        Error::backend_from(BACKEND, e)
    }
}

fn shape(e: String) -> Error {
    Error::backend(BACKEND, e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// Why one `XREADGROUP` failed.
enum ReadFail {
    /// A stream or its group is missing (first use, or Redis lost its data).
    NoGroup,
    Other(Error),
}

impl From<Error> for ReadFail {
    fn from(e: Error) -> Self {
        ReadFail::Other(e)
    }
}

impl RedisBroker {
    /// Opens a broker from a `redis://`, `rediss://`, `redis+unix://` or `unix://` URL with an
    /// optional `?prefix=NAME` key namespace. An unreachable server is not an error here (workers
    /// start before Redis does, and every call reconnects); a malformed URL, or a server that
    /// refuses our credentials, is.
    pub async fn open(url: &str) -> Result<Self> {
        let parsed = url::parse(url)?;
        let client = ::redis::Client::open(parsed.info)
            .map_err(|e| Error::Invalid(format!("invalid Redis URL {}: {e}", parsed.display)))?;
        let broker = Self {
            client,
            keys: Keys::new(&parsed.prefix),
            display: parsed.display,
            manager: tokio::sync::OnceCell::new(),
            readers: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashSet::new()),
            scripts: Scripts::new(),
        };
        match broker.manager().await {
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                tracing::warn!(server = %broker.display, error = %e, "Redis is not reachable yet; will keep trying");
            }
            Err(e) => return Err(e),
        }
        Ok(broker)
    }

    /// The key layout, for tests and tools that look at the raw data.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The shared connection, connected on first use (and again after a failed first use).
    async fn manager(&self) -> Result<ConnectionManager> {
        self.manager
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    // One connection attempt per reconnection: a caller waiting on it must get
                    // an `Unavailable` promptly and retry at its own pace (every loop does).
                    .set_number_of_retries(0);
                let mut m = ConnectionManager::new_with_config(self.client.clone(), config)
                    .await
                    .map_err(err)?;
                self.check_eviction_policy(&mut m).await;
                tracing::info!(server = %self.display, "connected to the Redis broker");
                Ok(m)
            })
            .await
            .cloned()
    }

    /// Redis evicting keys would silently drop messages and heartbeats: warn loudly unless the
    /// server refuses writes instead when it is full.
    async fn check_eviction_policy(&self, m: &mut ConnectionManager) {
        let reply = ::redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async::<Value>(m)
            .await;
        match reply.map(|v| items(v).ok().and_then(|i| i.get(1).and_then(string))) {
            Ok(Some(policy)) if policy == "noeviction" => {}
            Ok(Some(policy)) => tracing::warn!(
                event = "broker.eviction_policy",
                server = %self.display,
                %policy,
                "DANGER: Redis maxmemory-policy is '{policy}', not 'noeviction': when memory runs \
                 out Redis will delete keys, which loses messages and heartbeats. Set \
                 `maxmemory-policy noeviction`."
            ),
            Ok(None) | Err(_) => tracing::warn!(
                server = %self.display,
                "could not read Redis maxmemory-policy (CONFIG may be disabled); make sure it is \
                 'noeviction', or Redis may delete messages when memory runs out"
            ),
        }
    }

    async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T> {
        let mut c = self.manager().await?;
        cmd.query_async(&mut c).await.map_err(err)
    }

    async fn query_pipe<T: ::redis::FromRedisValue>(&self, pipe: &::redis::Pipeline) -> Result<T> {
        let mut c = self.manager().await?;
        pipe.query_async(&mut c).await.map_err(err)
    }

    /// Runs one script several times (one call per `(keys, args)`) in a single round trip.
    async fn eval_each(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Value>> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let invocations: Vec<_> = calls
            .iter()
            .map(|(keys, args)| {
                let mut inv = script.prepare_invoke();
                for k in keys {
                    inv.key(k);
                }
                for a in args {
                    inv.arg(a);
                }
                inv
            })
            .collect();
        let mut pipe = ::redis::pipe();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        let mut c = self.manager().await?;
        match pipe.query_async::<Vec<Value>>(&mut c).await {
            // The server forgot its scripts (restart): load this one and run the batch again.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script
                    .prepare_invoke()
                    .load_async(&mut c)
                    .await
                    .map_err(err)?;
                pipe.query_async(&mut c).await.map_err(err)
            }
            r => r.map_err(err),
        }
    }

    /// Every queue the broker knows, sorted.
    async fn known_queues(&self) -> Result<Vec<String>> {
        let v: Value = self
            .query(::redis::cmd("SMEMBERS").arg(self.keys.queues()))
            .await?;
        let mut qs: Vec<String> = items(v).map_err(shape)?.iter().filter_map(string).collect();
        qs.sort();
        Ok(qs)
    }

    /// Makes sure each queue's stream and group exist (the group starts at `0`, so messages
    /// published before any worker came are delivered) and that the queue is known.
    async fn ensure_groups(&self, queues: &[String]) -> Result<()> {
        let missing: Vec<String> = {
            let known = lock(&self.groups);
            queues
                .iter()
                .filter(|q| !known.contains(*q))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        // Every band stream and its group, for all missing queues in one round trip: a blocked
        // reservation reads all of them, and `XREADGROUP` refuses a stream without the group.
        let calls: Vec<_> = missing
            .iter()
            .map(|q| (self.keys.streams(q), vec![GROUP.to_string()]))
            .collect();
        self.eval_each(&self.scripts.ensure_groups, &calls).await?;
        let mut c = self.manager().await?;
        ::redis::cmd("SADD")
            .arg(self.keys.queues())
            .arg(&missing)
            .query_async::<()>(&mut c)
            .await
            .map_err(err)?;
        lock(&self.groups).extend(missing);
        Ok(())
    }

    fn reader(&self, consumer: &str) -> Arc<tokio::sync::Mutex<Option<MultiplexedConnection>>> {
        let mut readers = lock(&self.readers);
        let t = Instant::now();
        if !readers.contains_key(consumer) {
            readers.retain(|_, r| {
                Arc::strong_count(&r.conn) > 1 || t.duration_since(r.used) < READER_IDLE
            });
        }
        let r = readers
            .entry(consumer.to_string())
            .or_insert_with(|| Reader {
                conn: Arc::new(tokio::sync::Mutex::new(None)),
                used: t,
            });
        r.used = t;
        r.conn.clone()
    }

    /// One `XREADGROUP`, on the consumer's own connection. `block: None` does not wait.
    async fn read_once(
        &self,
        slot: &mut Option<MultiplexedConnection>,
        consumer: &str,
        queues: &[String],
        count: usize,
        block: Option<Duration>,
    ) -> std::result::Result<Vec<Delivery>, ReadFail> {
        if slot.is_none() {
            // No client-side response timeout (redis-rs's default, 500 ms, is shorter than a
            // BLOCK): the read below bounds the wait itself.
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(None);
            let conn = self
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(err)?;
            *slot = Some(conn);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ReadFail::Other(Error::unavailable(
                BACKEND,
                "no connection",
            )));
        };
        let mut keys = Vec::with_capacity(queues.len() * BANDS.len());
        let mut by_key: HashMap<String, (&String, i8)> = HashMap::new();
        for q in queues {
            for b in BANDS {
                let key = self.keys.band_stream(q, b);
                keys.push(key.clone());
                by_key.insert(key, (q, b));
            }
        }
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(millis(b));
        }
        cmd.arg("STREAMS").arg(&keys);
        for _ in &keys {
            cmd.arg(">");
        }
        // The client has no response timeout on this connection (a reply legitimately takes up
        // to BLOCK); this one bounds it, so a dead server cannot hang the worker.
        let limit = block.unwrap_or_default() + READ_MARGIN;
        let reply = match tokio::time::timeout(limit, cmd.query_async::<Value>(conn)).await {
            Err(_) => {
                *slot = None;
                return Err(ReadFail::Other(Error::unavailable(
                    BACKEND,
                    format!("no reply to XREADGROUP within {limit:?}"),
                )));
            }
            Ok(Err(e)) if e.code() == Some("NOGROUP") => return Err(ReadFail::NoGroup),
            Ok(Err(e)) => {
                let e = err(e);
                if e.is_transient() {
                    *slot = None;
                }
                return Err(ReadFail::Other(e));
            }
            Ok(Ok(v)) => v,
        };
        let mut out = Vec::new();
        for (key, entries) in entry::read_reply(reply).map_err(shape)? {
            let Some((queue, band)) = by_key.get(&key) else {
                return Err(ReadFail::Other(shape(format!(
                    "XREADGROUP answered for a stream not asked for: {key}"
                ))));
            };
            out.extend(
                entries
                    .into_iter()
                    .map(|e| (*band, e.into_delivery(queue, *band))),
            );
        }
        // Higher bands first (stable: FIFO within a band, queues in the order asked), so what
        // the caller keeps of an oversized batch is the most urgent part.
        out.sort_by_key(|(band, _)| std::cmp::Reverse(*band));
        Ok(out.into_iter().map(|(_, d)| d).collect())
    }

    /// [`Self::read_once`], re-creating missing groups once (after `FLUSHALL` or a restart).
    async fn read(
        &self,
        slot: &mut Option<MultiplexedConnection>,
        consumer: &str,
        queues: &[String],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Delivery>> {
        match self.read_once(slot, consumer, queues, count, block).await {
            Ok(d) => return Ok(d),
            Err(ReadFail::Other(e)) => return Err(e),
            Err(ReadFail::NoGroup) => {}
        }
        self.recreate_groups(queues).await?;
        match self.read_once(slot, consumer, queues, count, block).await {
            Ok(d) => Ok(d),
            Err(ReadFail::Other(e)) => Err(e),
            Err(ReadFail::NoGroup) => Err(Error::backend(
                BACKEND,
                "consumer group missing right after it was created",
            )),
        }
    }

    /// Groups deliveries by stream (queue and band) as script arguments (`id, count` pairs), at
    /// most [`CHUNK`] per call, dropping tags this broker did not make (they name nothing here).
    fn tag_args(&self, deliveries: &[Delivery]) -> Vec<(String, Vec<String>)> {
        let mut by_stream: BTreeMap<(&str, i8), Vec<Tag>> = BTreeMap::new();
        for d in deliveries {
            if let Some(t) = Tag::parse(&d.tag) {
                by_stream
                    .entry((d.queue.as_str(), t.band))
                    .or_default()
                    .push(t);
            }
        }
        let mut out = Vec::new();
        for ((queue, band), tags) in by_stream {
            for chunk in tags.chunks(CHUNK) {
                let args = chunk
                    .iter()
                    .flat_map(|t| [t.id.clone(), t.count.to_string()])
                    .collect();
                out.push((self.keys.band_stream(queue, band), args));
            }
        }
        out
    }

    /// Reserves up to `max` entries of `queue` for `consumer` without blocking: band by band,
    /// highest first, requeued ones first, then new ones (the `RESERVE` script). Creates missing
    /// groups once.
    async fn reserve_ready(
        &self,
        queue: &str,
        consumer: &str,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        for attempt in 0..2 {
            let mut c = self.manager().await?;
            let v: Value = self
                .scripts
                .reserve
                .key(self.keys.streams(queue))
                .arg(GROUP)
                .arg(REQUEUED)
                .arg(consumer)
                .arg(max)
                .invoke_async(&mut c)
                .await
                .map_err(err)?;
            if int(&v) == Some(-1) {
                if attempt == 0 {
                    self.recreate_groups(std::slice::from_ref(&queue.to_string()))
                        .await?;
                }
                continue;
            }
            return entry::indexed_entries(v)
                .map_err(shape)?
                .into_iter()
                .map(|(k, e)| match k.checked_sub(1).and_then(|i| BANDS.get(i)) {
                    Some(band) => Ok(e.into_delivery(queue, *band)),
                    None => Err(shape(format!("RESERVE answered for key number {k}"))),
                })
                .collect();
        }
        Err(Error::backend(
            BACKEND,
            "consumer group missing right after it was created",
        ))
    }

    /// Forgets that these queues' groups exist and creates them again: they vanished (first use,
    /// or Redis lost its data).
    async fn recreate_groups(&self, queues: &[String]) -> Result<()> {
        {
            let mut known = lock(&self.groups);
            for q in queues {
                known.remove(q);
            }
        }
        tracing::info!(queues = ?queues, "consumer group missing (first use, or Redis lost its data): creating it");
        self.ensure_groups(queues).await
    }

    /// Deletes `consumer` from every queue's group in which it owns nothing; true when that was
    /// every queue.
    async fn drop_consumer(&self, consumer: &str) -> Result<bool> {
        let calls: Vec<_> = self
            .known_queues()
            .await?
            .iter()
            .map(|q| {
                (
                    self.keys.streams(q),
                    vec![GROUP.to_string(), consumer.to_string()],
                )
            })
            .collect();
        let results = self.eval_each(&self.scripts.drop_consumer, &calls).await?;
        Ok(results.iter().all(|v| int(v) == Some(1)))
    }
}

#[async_trait]
impl Broker for RedisBroker {
    fn kind(&self) -> &'static str {
        BACKEND
    }

    async fn publish(&self, jobs: &[ToPublish]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let queues: BTreeSet<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
        // One round trip for the whole batch. Recording the queue every time (not once per
        // process) keeps it known even after Redis lost its data.
        let mut pipe = ::redis::pipe();
        pipe.cmd("SADD")
            .arg(self.keys.queues())
            .arg(queues.iter().collect::<Vec<_>>())
            .ignore();
        for j in jobs {
            pipe.cmd("XADD")
                .arg(self.keys.band_stream(&j.queue, band(j.priority)))
                .arg("*")
                .arg(entry::JOB_FIELD)
                .arg(j.id.to_string())
                .ignore();
        }
        self.query_pipe::<()>(&pipe).await
    }

    async fn reserve(
        &self,
        consumer: &str,
        queues: &[String],
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>> {
        if max == 0 || queues.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(Vec::new());
        }
        if consumer == REQUEUED {
            return Err(Error::Invalid(format!(
                "'{REQUEUED}' is reserved by the Redis broker"
            )));
        }
        self.ensure_groups(queues).await?;
        let deadline = Instant::now() + wait;
        let reader = self.reader(consumer);
        let mut slot = reader.lock().await;
        loop {
            // Requeued messages first (they keep their place at the head of their queue), then
            // new ones, queue by queue, without blocking.
            let mut out = Vec::new();
            for q in queues {
                if out.len() >= max {
                    break;
                }
                out.extend(self.reserve_ready(q, consumer, max - out.len()).await?);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !out.is_empty() || left.is_zero() {
                return Ok(out);
            }
            let block = left.min(BLOCK_SLICE);
            let mut out = self
                .read(&mut slot, consumer, queues, max, Some(block))
                .await?;
            // `COUNT` applies per stream: messages that arrived in several queues at the same
            // instant can exceed `max`. The excess goes straight back, keeping its place.
            if out.len() > max {
                let excess = out.split_off(max);
                if let Err(e) = self.requeue(consumer, &excess).await {
                    tracing::error!(error = %e, consumer, "could not put back messages reserved beyond prefetch; they stay reserved until this consumer is lost");
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
        }
    }

    async fn ack(&self, deliveries: &[Delivery]) -> Result<()> {
        let calls: Vec<_> = self
            .tag_args(deliveries)
            .into_iter()
            .map(|(stream, tags)| {
                let mut args = vec![GROUP.to_string()];
                args.extend(tags);
                (vec![stream], args)
            })
            .collect();
        self.eval_each(&self.scripts.ack, &calls).await.map(|_| ())
    }

    async fn requeue(&self, consumer: &str, deliveries: &[Delivery]) -> Result<usize> {
        let calls: Vec<_> = self
            .tag_args(deliveries)
            .into_iter()
            .map(|(stream, tags)| {
                let mut args = vec![
                    GROUP.to_string(),
                    consumer.to_string(),
                    REQUEUED.to_string(),
                ];
                args.extend(tags);
                (vec![stream], args)
            })
            .collect();
        let results = self.eval_each(&self.scripts.requeue, &calls).await?;
        Ok(results.iter().filter_map(int).sum::<i64>() as usize)
    }

    async fn dead_letter(&self, d: &Delivery, reason: &str) -> Result<()> {
        let Some(tag) = Tag::parse(&d.tag) else {
            return Ok(());
        };
        let mut c = self.manager().await?;
        self.scripts
            .dead_letter
            .key(self.keys.band_stream(&d.queue, tag.band))
            .key(self.keys.dead(&d.queue))
            .arg(GROUP)
            .arg(&tag.id)
            .arg(tag.count)
            .arg(&d.queue)
            .arg(reason)
            .arg(now())
            .invoke_async::<i64>(&mut c)
            .await
            .map(|_| ())
            .map_err(err)
    }

    async fn pending(&self, consumer: &str, limit: usize) -> Result<Vec<Delivery>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let streams: Vec<(String, i8)> = self
            .known_queues()
            .await?
            .into_iter()
            .flat_map(|q| BANDS.map(|b| (q.clone(), b)))
            .collect();
        let calls: Vec<_> = streams
            .iter()
            .map(|(q, b)| {
                (
                    vec![self.keys.band_stream(q, *b)],
                    vec![GROUP.to_string(), consumer.to_string(), limit.to_string()],
                )
            })
            .collect();
        let results = self.eval_each(&self.scripts.pending, &calls).await?;
        let mut out = Vec::new();
        for ((queue, band), v) in streams.iter().zip(results) {
            let entries = entry::counted_entries(v).map_err(shape)?;
            out.extend(entries.into_iter().map(|e| e.into_delivery(queue, *band)));
        }
        out.truncate(limit);
        Ok(out)
    }

    async fn register(&self, worker: &str, ttl: Duration) -> Result<()> {
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(self.keys.heartbeat(worker))
            .arg(now())
            .arg("PX")
            .arg(millis(ttl))
            .ignore()
            .cmd("SADD")
            .arg(self.keys.workers())
            .arg(worker)
            .ignore();
        self.query_pipe::<()>(&pipe).await
    }

    async fn heartbeat(&self, worker: &str, ttl: Duration) -> Result<bool> {
        let mut c = self.manager().await?;
        let n: i64 = self
            .scripts
            .heartbeat
            .key(self.keys.heartbeat(worker))
            .arg(millis(ttl))
            .arg(now())
            .invoke_async(&mut c)
            .await
            .map_err(err)?;
        Ok(n == 1)
    }

    async fn unregister(&self, worker: &str) -> Result<()> {
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(self.keys.heartbeat(worker))
            .ignore()
            .cmd("SREM")
            .arg(self.keys.workers())
            .arg(worker)
            .ignore();
        self.query_pipe::<()>(&pipe).await?;
        lock(&self.readers).remove(worker);
        // A worker that handed everything back leaves no trace; one that still owns messages
        // stays in those groups, where the rescuer finds it.
        self.drop_consumer(worker).await.map(|_| ())
    }

    async fn is_alive(&self, worker: &str) -> Result<bool> {
        self.query(::redis::cmd("EXISTS").arg(self.keys.heartbeat(worker)))
            .await
    }

    async fn heartbeat_expires_in(&self, worker: &str) -> Result<Option<Duration>> {
        // PTTL: milliseconds left, -2 without the key, -1 without an expiry (never written so).
        let ms: i64 = self
            .query(::redis::cmd("PTTL").arg(self.keys.heartbeat(worker)))
            .await?;
        Ok(u64::try_from(ms)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis))
    }

    async fn lost_consumers(&self) -> Result<Vec<String>> {
        let calls: Vec<_> = self
            .known_queues()
            .await?
            .iter()
            .map(|q| (self.keys.streams(q), vec![GROUP.to_string()]))
            .collect();
        let mut candidates = BTreeSet::new();
        for v in self.eval_each(&self.scripts.consumers, &calls).await? {
            candidates.extend(items(v).map_err(shape)?.iter().filter_map(string));
        }
        let registered: Value = self
            .query(::redis::cmd("SMEMBERS").arg(self.keys.workers()))
            .await?;
        candidates.extend(items(registered).map_err(shape)?.iter().filter_map(string));
        candidates.remove(REQUEUED);
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        // A heartbeat never comes back once gone (`heartbeat` refuses to revive it and every
        // session registers a new name), so checking after listing is not racy.
        let mut pipe = ::redis::pipe();
        for c in &candidates {
            pipe.cmd("EXISTS").arg(self.keys.heartbeat(c));
        }
        let alive: Vec<i64> = self.query_pipe(&pipe).await?;
        Ok(candidates
            .into_iter()
            .zip(alive)
            .filter(|(_, a)| *a == 0)
            .map(|(c, _)| c)
            .collect())
    }

    async fn remove_consumer(&self, consumer: &str) -> Result<bool> {
        if consumer == REQUEUED || !self.drop_consumer(consumer).await? {
            return Ok(false);
        }
        let mut c = self.manager().await?;
        self.scripts
            .forget_worker
            .key(self.keys.workers())
            .key(self.keys.heartbeat(consumer))
            .arg(consumer)
            .invoke_async::<i64>(&mut c)
            .await
            .map_err(err)?;
        lock(&self.readers).remove(consumer);
        Ok(true)
    }

    async fn check_marker(&self) -> Result<bool> {
        let set: Option<String> = self
            .query(
                ::redis::cmd("SET")
                    .arg(self.keys.marker())
                    .arg(now())
                    .arg("NX"),
            )
            .await?;
        Ok(set.is_none())
    }

    async fn depths(&self) -> Result<Vec<QueueDepth>> {
        let queues = self.known_queues().await?;
        let calls: Vec<_> = queues
            .iter()
            .map(|q| {
                let mut keys = self.keys.streams(q);
                keys.push(self.keys.dead(q));
                (keys, vec![GROUP.to_string(), REQUEUED.to_string()])
            })
            .collect();
        let results = self.eval_each(&self.scripts.depth, &calls).await?;
        queues
            .into_iter()
            .zip(results)
            .map(|(queue, v)| {
                let n: Vec<u64> = items(v)
                    .map_err(shape)?
                    .iter()
                    .map(|x| int(x).unwrap_or(0).max(0) as u64)
                    .collect();
                let [len, pending, requeued, dead] = n[..] else {
                    return Err(shape(format!("DEPTH returned {n:?}")));
                };
                // Requeued entries are pending in Redis's eyes but ready in ours. A pending id
                // whose entry was deleted by hand would make a plain difference negative.
                let reserved = pending.saturating_sub(requeued).min(len);
                Ok(QueueDepth {
                    queue,
                    ready: len - reserved,
                    reserved,
                    dead_letters: dead,
                })
            })
            .collect()
    }

    /// Dead-letter entries carry server-assigned ids (`XADD *`, milliseconds of Redis's clock),
    /// so `XTRIM MINID` cuts them by age.
    async fn purge_dead_letters(&self, before: crate::time::Micros) -> Result<u64> {
        let queues = self.known_queues().await?;
        if queues.is_empty() {
            return Ok(0);
        }
        let min_id = format!("{}-0", before.max(0) / 1000);
        let mut pipe = ::redis::pipe();
        for q in &queues {
            pipe.cmd("XTRIM")
                .arg(self.keys.dead(q))
                .arg("MINID")
                .arg(&min_id);
        }
        let mut c = self.manager().await?;
        let trimmed: Vec<u64> = pipe.query_async(&mut c).await.map_err(err)?;
        Ok(trimmed.into_iter().sum())
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let queues = self.known_queues().await?;
        if queues.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let mut pipe = ::redis::pipe();
        for q in &queues {
            pipe.cmd("XREVRANGE")
                .arg(self.keys.dead(q))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(limit);
        }
        let replies: Vec<Value> = self.query_pipe(&pipe).await?;
        let mut out = Vec::new();
        for v in replies {
            out.extend(
                entry::entries(v)
                    .map_err(shape)?
                    .into_iter()
                    .map(entry::dead_letter),
            );
        }
        out.sort_by_key(|d| std::cmp::Reverse(d.at));
        out.truncate(limit);
        Ok(out)
    }
}

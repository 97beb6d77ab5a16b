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
//! - The same broker runs on a Redis Cluster (`redis+cluster://` seed nodes; docs/redis-cluster.md):
//!   [`conn`] routes each command and script to its slot's master and splits pipelines per slot.
//!   Blocking reads need every stream in one slot, so a consumer of several queues polls instead
//!   of blocking there, and the data-loss marker is checked per queue (a single master can restart
//!   empty while the others keep their data).

mod conn;
mod entry;
pub mod keys;
mod scripts;
mod url;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::*;
use crate::error::Error;
use crate::time::now;
use conn::{Batch, Conn};
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
/// On a cluster, how often an idle consumer of queues in several slots looks for new messages:
/// one blocking read cannot wait on streams of different slots.
const CLUSTER_POLL: Duration = Duration::from_millis(20);
/// How many times a cluster command is retried (redirections, a master failing over or
/// restarting) before the caller gets an `Unavailable`, and the longest pause between tries.
const CLUSTER_RETRIES: u32 = 6;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 400;

/// A reserving consumer's own connection, opened on first use and dropped when it breaks.
struct Reader {
    conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
    used: Instant,
}

/// Where the broker connects.
// One per broker: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Client {
    Single(::redis::Client),
    /// One client for the shared connection, one (without a response timeout: a blocking read
    /// legitimately takes its `BLOCK`) for reserving consumers' own connections.
    Cluster {
        shared: ClusterClient,
        reader: ClusterClient,
    },
}

pub struct RedisBroker {
    client: Client,
    keys: Keys,
    /// The server's address without credentials, for logs.
    display: String,
    manager: tokio::sync::OnceCell<Conn>,
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

/// The deliveries a `RESERVE` (or `ACK_THEN` + `RESERVE`) call answered for `queue`; `None`
/// when a stream of it had no group.
fn reserved(queue: &str, v: Value) -> Result<Option<Vec<Delivery>>> {
    if int(&v) == Some(-1) {
        return Ok(None);
    }
    entry::indexed_entries(v)
        .map_err(shape)?
        .into_iter()
        .map(|(k, e)| match k.checked_sub(1).and_then(|i| BANDS.get(i)) {
            Some(band) => Ok(e.into_delivery(queue, *band)),
            None => Err(shape(format!("RESERVE answered for key number {k}"))),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
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
        let invalid =
            |e: RedisError| Error::Invalid(format!("invalid Redis URL {}: {e}", parsed.display));
        let client = match parsed.target {
            url::Target::Single(info) => {
                Client::Single(::redis::Client::open(info).map_err(invalid)?)
            }
            url::Target::Cluster(seeds) => {
                let builder = || {
                    ClusterClientBuilder::new(seeds.clone())
                        .connection_timeout(CONNECT_TIMEOUT)
                        .retries(CLUSTER_RETRIES)
                        .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
                        .use_protocol(::redis::ProtocolVersion::RESP2)
                };
                Client::Cluster {
                    shared: builder()
                        .response_timeout(RESPONSE_TIMEOUT)
                        .build()
                        .map_err(invalid)?,
                    // No response timeout: `read_once` bounds each blocking read itself.
                    reader: builder().build().map_err(invalid)?,
                }
            }
        };
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

    /// Whether the broker runs on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.client, Client::Cluster { .. })
    }

    /// The shared connection, connected on first use (and again after a failed first use).
    async fn manager(&self) -> Result<Conn> {
        self.manager
            .get_or_try_init(|| async {
                let mut m = match &self.client {
                    Client::Single(client) => {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(CONNECT_TIMEOUT))
                            .set_response_timeout(Some(RESPONSE_TIMEOUT))
                            // One connection attempt per reconnection: a caller waiting on it
                            // must get an `Unavailable` promptly and retry at its own pace
                            // (every loop does).
                            .set_number_of_retries(0);
                        Conn::Manager(
                            ConnectionManager::new_with_config(client.clone(), config)
                                .await
                                .map_err(err)?,
                        )
                    }
                    // Reconnects to masters and refreshes the slot map by itself.
                    Client::Cluster { shared, .. } => {
                        Conn::Cluster(shared.get_async_connection().await.map_err(err)?)
                    }
                };
                self.check_eviction_policy(&mut m).await;
                tracing::info!(server = %self.display, "connected to the Redis broker");
                Ok(m)
            })
            .await
            .cloned()
    }

    /// Redis evicting keys would silently drop messages and heartbeats: warn loudly unless the
    /// server refuses writes instead when it is full. (On a cluster, one master answers.)
    async fn check_eviction_policy(&self, m: &mut Conn) {
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

    /// Runs one script several times (one call per `(keys, args)`, each call's keys in one
    /// slot) in a single round trip per slot. A server that forgot its scripts (restart) gets
    /// the script loaded and the batch again.
    async fn eval_each(
        &self,
        script: &::redis::Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Value>> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = Batch::new();
        for (keys, args) in calls {
            batch.script(script, keys, args);
        }
        batch.run(&self.manager().await?, Some(script)).await
    }

    /// Runs a batch of commands (one pipeline per slot on a cluster).
    async fn run(&self, batch: Batch) -> Result<Vec<Value>> {
        batch.run(&self.manager().await?, None).await
    }

    /// Records queues as known. On a cluster, a queue seen for the first time also gets its
    /// own data-loss marker (see [`Broker::check_marker`]): only when `SADD` says it is new, so
    /// a queue whose master restarted empty is not marked as if nothing happened.
    async fn remember_queues(&self, queues: &[&str]) -> Result<()> {
        if queues.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new();
        for q in queues {
            let mut cmd = ::redis::cmd("SADD");
            cmd.arg(self.keys.queues()).arg(*q);
            batch.push(&self.keys.queues(), cmd);
        }
        let added = self.run(batch).await?;
        if !self.is_cluster() {
            return Ok(());
        }
        let mut markers = Batch::new();
        for (q, v) in queues.iter().zip(&added) {
            if int(v) == Some(1) {
                let key = self.keys.queue_marker(q);
                let mut cmd = ::redis::cmd("SET");
                cmd.arg(&key).arg(now()).arg("NX");
                markers.push(&key, cmd);
            }
        }
        self.run(markers).await.map(|_| ())
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
        let names: Vec<&str> = missing.iter().map(String::as_str).collect();
        self.remember_queues(&names).await?;
        lock(&self.groups).extend(missing);
        Ok(())
    }

    fn reader(&self, consumer: &str) -> Arc<tokio::sync::Mutex<Option<Conn>>> {
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
        slot: &mut Option<Conn>,
        consumer: &str,
        queues: &[String],
        count: usize,
        block: Option<Duration>,
    ) -> std::result::Result<Vec<Delivery>, ReadFail> {
        if slot.is_none() {
            let conn = match &self.client {
                Client::Single(client) => {
                    // No client-side response timeout (redis-rs's default, 500 ms, is shorter
                    // than a BLOCK): the read below bounds the wait itself.
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(None);
                    Conn::Multiplexed(
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .map_err(err)?,
                    )
                }
                Client::Cluster { reader, .. } => {
                    Conn::Cluster(reader.get_async_connection().await.map_err(err)?)
                }
            };
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
        slot: &mut Option<Conn>,
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
            match reserved(queue, v)? {
                Some(got) => return Ok(got),
                None if attempt == 0 => {
                    self.recreate_groups(std::slice::from_ref(&queue.to_string()))
                        .await?
                }
                None => {}
            }
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
        // Recording the queue every time (not once per process) keeps it known even after
        // Redis lost its data.
        if self.is_cluster() {
            // Per-queue markers depend on which queues are new: one more round trip.
            self.remember_queues(&queues.iter().copied().collect::<Vec<_>>())
                .await?;
        }
        // One round trip for the whole batch (one per slot on a cluster).
        let mut batch = Batch::new();
        if !self.is_cluster() {
            let mut cmd = ::redis::cmd("SADD");
            cmd.arg(self.keys.queues())
                .arg(queues.iter().collect::<Vec<_>>());
            batch.push(&self.keys.queues(), cmd);
        }
        for j in jobs {
            let key = self.keys.band_stream(&j.queue, band(j.priority));
            let mut cmd = ::redis::cmd("XADD");
            cmd.arg(&key)
                .arg("*")
                .arg(entry::JOB_FIELD)
                .arg(j.id.to_string());
            batch.push(&key, cmd);
        }
        self.run(batch).await.map(|_| ())
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
            if self.is_cluster() && queues.len() > 1 {
                // Streams of several slots cannot be read by one blocking command.
                tokio::time::sleep(left.min(CLUSTER_POLL)).await;
                continue;
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

    /// One script call when every acknowledged delivery belongs to the first queue served (a
    /// worker of one queue, the common case): the acknowledgement and the reservation run
    /// together in the queue's hash tag, the ack first (`ACK_THEN`). Otherwise, or when the
    /// first queue has fewer ready messages than asked for, the rest goes the ordinary way.
    async fn ack_and_reserve(
        &self,
        acks: &[Delivery],
        consumer: &str,
        queues: &[String],
        max: usize,
    ) -> Result<Vec<Delivery>> {
        let one_queue = queues
            .first()
            .filter(|first| acks.iter().all(|d| d.queue == **first));
        let Some(first) = one_queue.filter(|_| max > 0 && consumer != REQUEUED) else {
            return ack_then_reserve(self, acks, consumer, queues, max).await;
        };
        self.ensure_groups(queues).await?;
        let mut call = self.scripts.ack_reserve.key(self.keys.streams(first));
        call.arg(GROUP).arg(REQUEUED).arg(consumer).arg(max);
        // Tags this broker did not make name nothing here, as in `ack`.
        for t in acks.iter().filter_map(|d| Tag::parse(&d.tag)) {
            let k = BANDS.iter().position(|b| *b == t.band).unwrap_or(0) + 1;
            call.arg(k).arg(&t.id).arg(t.count);
        }
        let mut c = self.manager().await?;
        let v: Value = call.invoke_async(&mut c).await.map_err(err)?;
        // No group (`None`): the acknowledgements ran (they need none) and nothing was reserved
        // from this queue; the fetcher's next reservation creates the groups.
        let mut got = reserved(first, v)?.unwrap_or_default();
        if got.len() < max && queues.len() > 1 {
            // What the script reserved is this consumer's now: an error here must not lose it.
            match self
                .reserve(consumer, &queues[1..], max - got.len(), Duration::ZERO)
                .await
            {
                Ok(more) => got.extend(more),
                Err(e) => {
                    tracing::warn!(error = %e, "reserving from the other queues failed; keeping what the first gave")
                }
            }
        }
        Ok(got)
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
        let queues = self.known_queues().await?;
        self.pending_in(consumer, &queues, limit).await
    }

    /// One script call per band stream of `queues` only: a worker's sweep need not read every
    /// queue the broker knows.
    async fn pending_in(
        &self,
        consumer: &str,
        queues: &[String],
        limit: usize,
    ) -> Result<Vec<Delivery>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let streams: Vec<(String, i8)> = queues
            .iter()
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

    /// On a single server the one marker covers everything. On a cluster each master keeps or
    /// loses its data on its own, so there are markers wherever messages live: one per queue (in
    /// the queue's slot), one beside the set of known queues (losing it would hide queues from
    /// this check), and the global one. Any missing one means "lost"; all are set again.
    async fn check_marker(&self) -> Result<bool> {
        let mut keys = vec![self.keys.marker()];
        if self.is_cluster() {
            keys.push(self.keys.queues_marker());
            keys.extend(
                self.known_queues()
                    .await?
                    .iter()
                    .map(|q| self.keys.queue_marker(q)),
            );
        }
        let mut batch = Batch::new();
        for k in &keys {
            let mut cmd = ::redis::cmd("SET");
            cmd.arg(k).arg(now()).arg("NX");
            batch.push(k, cmd);
        }
        let replies = self.run(batch).await?;
        // `SET … NX` answers OK when it set the key (it was missing), nil when it was there.
        Ok(replies.iter().all(|v| matches!(v, Value::Nil)))
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
        let mut batch = Batch::new();
        for q in &queues {
            let key = self.keys.dead(q);
            let mut cmd = ::redis::cmd("XTRIM");
            cmd.arg(&key).arg("MINID").arg(&min_id);
            batch.push(&key, cmd);
        }
        let trimmed = self.run(batch).await?;
        Ok(trimmed
            .iter()
            .map(|v| int(v).unwrap_or(0).max(0) as u64)
            .sum())
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let queues = self.known_queues().await?;
        if queues.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let mut batch = Batch::new();
        for q in &queues {
            let key = self.keys.dead(q);
            let mut cmd = ::redis::cmd("XREVRANGE");
            cmd.arg(&key).arg("+").arg("-").arg("COUNT").arg(limit);
            batch.push(&key, cmd);
        }
        let replies = self.run(batch).await?;
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

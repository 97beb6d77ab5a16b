//! One broker, two kinds of deployment: a single Redis server (or a primary with replicas behind
//! one address) and a Redis Cluster. Everything above this module speaks to a [`Conn`], which is
//! either; the differences that remain are spelled out here:
//!
//! - A cluster connection (redis-rs's `cluster-async`) learns the slot map from the seed nodes,
//!   sends each command to the master owning its key's slot, follows `MOVED` (a slot that moved
//!   for good: it refreshes the map) and `ASK` (a slot being migrated: it asks the target once),
//!   and retries `TRYAGAIN` (a multi-key command whose keys are split by an ongoing migration).
//! - A pipeline on a cluster must stay inside one slot, so a [`Batch`] remembers each command's
//!   slot and runs one pipeline per slot (concurrently); on a single server it is one pipeline, as
//!   before. Its replies come back in the order the commands were pushed.
//! - A script must only touch keys of one slot: the key layout ([`super::keys`]) puts all keys
//!   of one queue under one hash tag, and callers issue one script call per queue.

use ::redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::Slot;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Script, ServerErrorKind, Value};
use std::collections::HashMap;

use super::err;
use crate::error::Result;

/// A connection to the broker's server or cluster.
#[derive(Clone)]
pub enum Conn {
    /// The shared, auto-reconnecting connection to a single server.
    Manager(ConnectionManager),
    /// A reserving consumer's own connection to a single server.
    Multiplexed(MultiplexedConnection),
    /// A connection to every master of a cluster (shared, or a consumer's own).
    Cluster(ClusterConnection),
}

impl Conn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Commands to send together, each with the slot of its key.
#[derive(Default)]
pub struct Batch {
    cmds: Vec<(Slot, Cmd)>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `cmd`, whose (first) key is `key`.
    pub fn push(&mut self, key: &str, cmd: Cmd) -> &mut Self {
        self.cmds.push((Slot::for_key(key), cmd));
        self
    }

    /// A script call: `EVALSHA` with its keys (all of one slot) and arguments.
    pub fn script(&mut self, script: &Script, keys: &[String], args: &[String]) -> &mut Self {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let slot_key = keys.first().map(String::as_str).unwrap_or("");
        self.push(slot_key, cmd)
    }

    /// Runs every command and returns their replies in order. On a single server this is one
    /// pipeline; on a cluster one pipeline per slot, run concurrently. When `script` is given and
    /// a server answers `NOSCRIPT` (it restarted, or a slot moved to a master that never saw the
    /// script), the script is loaded there and that pipeline runs again.
    ///
    /// Not atomic across slots: a failure may leave some pipelines applied, which every caller's
    /// crash contract already allows (each command or script call is a step of its own).
    pub async fn run(self, conn: &Conn, script: Option<&Script>) -> Result<Vec<Value>> {
        if self.cmds.is_empty() {
            return Ok(Vec::new());
        }
        if !conn.is_cluster() {
            let mut pipe = ::redis::pipe();
            for (_, c) in &self.cmds {
                pipe.add_command(c.clone());
            }
            return run_pipe(conn.clone(), pipe, script.cloned()).await;
        }
        let n = self.cmds.len();
        let mut groups: HashMap<Slot, (Vec<usize>, Pipeline)> = HashMap::new();
        for (i, (slot, cmd)) in self.cmds.into_iter().enumerate() {
            let g = groups
                .entry(slot)
                .or_insert_with(|| (Vec::new(), ::redis::pipe()));
            g.0.push(i);
            g.1.add_command(cmd);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (_, (positions, pipe)) in groups {
            let (conn, script) = (conn.clone(), script.cloned());
            tasks.spawn(async move { (positions, run_pipe(conn, pipe, script).await) });
        }
        let mut out = vec![Value::Nil; n];
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            let (positions, replies) = joined.map_err(|e| {
                crate::error::Error::backend(super::BACKEND, format!("pipeline task failed: {e}"))
            })?;
            match replies {
                Ok(replies) => {
                    for (i, v) in positions.into_iter().zip(replies) {
                        out[i] = v;
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

async fn run_pipe(mut conn: Conn, pipe: Pipeline, script: Option<Script>) -> Result<Vec<Value>> {
    match pipe.query_async::<Vec<Value>>(&mut conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let Some(script) = script else {
                return Err(err(e));
            };
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(err)?;
            pipe.query_async(&mut conn).await.map_err(err)
        }
        r => r.map_err(err),
    }
}

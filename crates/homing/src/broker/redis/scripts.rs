//! Every Lua script the Redis broker runs. A script is how a read-then-write on one queue
//! ("is this entry still pending for that consumer? then move it") happens atomically: Redis runs
//! a script without interleaving any other client's command, so two rescuers can never both
//! requeue one message, and a crash (of the client) cannot leave half a move behind.
//!
//! Each script touches the keys of a single hash tag only (see [`super::keys`]), so it stays
//! valid on Redis Cluster. Errors a script expects (a stream or group that does not exist yet,
//! e.g. after `FLUSHALL`) are caught with `redis.pcall` and treated as "nothing there", because
//! the store, not Redis, is the source of truth and will re-dispatch.
//!
//! Stream entry ids arrive from [`Delivery::tag`](crate::broker::Delivery::tag) and are checked
//! by the caller to look like ids, so `XACK`/`XDEL`/`XRANGE` never fail on them.

use ::redis::Script;

/// Acknowledge and delete entries (late ack: the job's new state is already committed).
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2..\]: entry ids.
/// Returns the number of entries deleted (0 when they were already gone: ack is idempotent).
const ACK: &str = r#"
redis.pcall('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
"#;

/// Put entries still pending for one consumer back at the tail of the queue, as new entries with
/// the same fields (a new id, so a zombie acknowledging the old id cannot remove the new
/// message). Entries pending for another consumer, or no longer pending, are left alone. An entry
/// pending but already deleted from the stream has nothing to put back: it is only acknowledged.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// ARGV\[3..\]: entry ids. Returns how many entries were put back.
const REQUEUE: &str = r#"
local group, consumer = ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1, consumer)
  if p.err == nil and #p == 1 then
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e == 1 then
      redis.call('XADD', KEYS[1], '*', unpack(e[1][2]))
      n = n + 1
    end
    redis.call('XACK', KEYS[1], group, id)
    redis.call('XDEL', KEYS[1], id)
  end
end
return n
"#;

/// Move one entry from a queue stream to that queue's dead-letter stream, with the reason.
/// The dead letter's `payload` is the job id for a well-formed message, otherwise the JSON array
/// of the entry's fields (so garbage stays inspectable).
///
/// KEYS\[1\]: the queue stream. KEYS\[2\]: the queue's dead-letter stream.
/// ARGV\[1\]: the group. ARGV\[2\]: the entry id. ARGV\[3\]: the queue name. ARGV\[4\]: the reason.
/// ARGV\[5\]: the time (microseconds since the epoch).
/// Returns 1 when moved, 0 when the entry was already gone.
const DEAD_LETTER: &str = r#"
local group, id = ARGV[1], ARGV[2]
local e = redis.call('XRANGE', KEYS[1], id, id)
if #e == 0 then
  redis.pcall('XACK', KEYS[1], group, id)
  return 0
end
local f = e[1][2]
local payload
if #f == 2 and f[1] == 'job' then payload = f[2] else payload = cjson.encode(f) end
redis.call('XADD', KEYS[2], '*', 'queue', ARGV[3], 'payload', payload, 'reason', ARGV[4], 'at', ARGV[5])
redis.pcall('XACK', KEYS[1], group, id)
redis.call('XDEL', KEYS[1], id)
return 1
"#;

/// The entries pending for one consumer, oldest first, with their fields. A pending id whose
/// entry was deleted (`XDEL` by hand, or a crash between a script's steps on a replica that was
/// promoted) can never be delivered: it is acknowledged away instead of being returned.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// ARGV\[3\]: the most entries to look at.
/// Returns `{{id, {field, value, ...}}, ...}` (the shape of `XRANGE`); `{}` when the stream or
/// group does not exist.
const PENDING: &str = r#"
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[3]), ARGV[2])
if p.err ~= nil then return {} end
local out = {}
for _, row in ipairs(p) do
  local e = redis.call('XRANGE', KEYS[1], row[1], row[1])
  if #e == 1 then
    out[#out + 1] = e[1]
  else
    redis.call('XACK', KEYS[1], ARGV[1], row[1])
  end
end
return out
"#;

/// What one queue holds.
///
/// KEYS\[1\]: the queue stream. KEYS\[2\]: the queue's dead-letter stream. ARGV\[1\]: the group.
/// Returns `{entries in the stream, entries pending in the group, dead letters}`. Acknowledged
/// entries are always deleted, so the stream holds exactly the ready and the pending ones.
const DEPTH: &str = r#"
local pending = 0
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1])
if p.err == nil then pending = p[1] end
return {redis.call('XLEN', KEYS[1]), pending, redis.call('XLEN', KEYS[2])}
"#;

/// The names of the consumers in a queue's group (whether or not they own entries).
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group.
/// Returns `{name, ...}`; `{}` when the stream or group does not exist.
const CONSUMERS: &str = r#"
local c = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if c.err ~= nil then return {} end
local names = {}
for _, row in ipairs(c) do
  for i = 1, #row, 2 do
    if row[i] == 'name' then names[#names + 1] = row[i + 1] end
  end
end
return names
"#;

/// Delete a consumer from a queue's group, only if it owns no pending entry there. Checked and
/// done in one step: `XGROUP DELCONSUMER` drops the consumer's pending entries, so deleting a
/// consumer that reserved a message in between would lose that message.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// Returns 1 when the consumer owns nothing in this queue (it is gone from the group), 0 when it
/// still owns entries (it is kept).
const DROP_CONSUMER: &str = r#"
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p.err ~= nil then return 1 end
if #p > 0 then return 0 end
redis.pcall('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"#;

/// Forget a registered worker, unless its heartbeat is alive (a live worker is never forgotten).
///
/// KEYS\[1\]: the registered-workers set. KEYS\[2\]: the worker's heartbeat key.
/// ARGV\[1\]: the worker name. Returns 1 when forgotten, 0 when kept because it is alive.
const FORGET_WORKER: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SREM', KEYS[1], ARGV[1])
return 1
"#;

/// Refresh a heartbeat only while it still exists: an expired worker must learn that it was
/// presumed dead instead of silently coming back to life.
///
/// KEYS\[1\]: the heartbeat key. ARGV\[1\]: the time-to-live in milliseconds.
/// ARGV\[2\]: the time of this beat (microseconds since the epoch), kept as the key's value.
/// Returns 1 when refreshed, 0 when the key was gone.
const HEARTBEAT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
return 1
"#;

/// The broker's scripts, hashed once (`EVALSHA`; redis-rs loads a script again when the server
/// answers `NOSCRIPT`, e.g. after a restart).
#[derive(Debug)]
pub struct Scripts {
    pub ack: Script,
    pub requeue: Script,
    pub dead_letter: Script,
    pub pending: Script,
    pub depth: Script,
    pub consumers: Script,
    pub drop_consumer: Script,
    pub forget_worker: Script,
    pub heartbeat: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            ack: Script::new(ACK),
            requeue: Script::new(REQUEUE),
            dead_letter: Script::new(DEAD_LETTER),
            pending: Script::new(PENDING),
            depth: Script::new(DEPTH),
            consumers: Script::new(CONSUMERS),
            drop_consumer: Script::new(DROP_CONSUMER),
            forget_worker: Script::new(FORGET_WORKER),
            heartbeat: Script::new(HEARTBEAT),
        }
    }
}

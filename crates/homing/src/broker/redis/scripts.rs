//! Every Lua script the Redis broker runs. A script is how a read-then-write on one queue
//! ("is this entry still pending for that consumer, at that delivery? then move it") happens
//! atomically: Redis runs a script without interleaving any other client's command, so two
//! rescuers can never both requeue one message, and a client crash cannot leave half a move.
//!
//! Two ideas the scripts share:
//! - **A queue is several streams, one per priority band** (see [`super::keys::band`]), all in
//!   one hash tag; scripts that look at a whole queue take them all as keys, highest band first.
//! - **Requeued entries stay in the group's pending list**, owned by a reserved consumer name
//!   ([`super::keys::REQUEUED`]), instead of being added again at the tail: they keep their
//!   place, so reservations claim them (`XCLAIM`) before reading new entries, and a reclaimed job
//!   runs before the backlog.
//! - **A delivery is an entry id plus its delivery count** (`XPENDING`'s fourth column). Every
//!   move sets the count one higher (`XCLAIM … RETRYCOUNT`), so a zombie's ack, requeue or
//!   dead-letter of its old delivery matches nothing once the message was handed to someone else.
//!
//! Each script touches the keys of a single hash tag (see [`super::keys`]), so it stays valid on
//! Redis Cluster. Expected errors (a stream or group that does not exist yet, e.g. after
//! `FLUSHALL`) are caught with `redis.pcall` and read as "nothing there": the store, not Redis,
//! is the source of truth and re-dispatches. Entry ids reach the scripts already checked (see
//! `entry::Tag`), so `XRANGE`/`XACK`/`XDEL` never fail on them.
//!
//! `XCLAIM … JUSTID` is used with the payload read by `XRANGE` beforehand because an entry that
//! was deleted while pending is reported differently by Redis 6.2 (a nil) and 7 (silently dropped
//! from the pending list); checking with `XRANGE` first behaves the same on both.

use ::redis::Script;

/// Reserve up to a number of entries of one queue for a consumer, without blocking, from the
/// queue's priority-band streams in the order given (highest band first). In each band: first
/// the entries the rescuer (or a shutting-down worker) put back, oldest first (they keep their
/// place at the head of their band), then new ones (`XREADGROUP … >`). A band stream with no
/// entry at all (`XLEN` 0: acknowledged entries are deleted, so it holds neither ready nor
/// pending ones) is skipped with that one O(1) call, so a queue that only ever sees priority 0
/// pays nothing but a few `XLEN`s inside the one round trip it always made. Only an empty queue
/// makes the caller block on its own connection. Requeued entries deleted from the stream
/// meanwhile are acknowledged away.
///
/// KEYS: the queue's band streams, highest band first. ARGV\[1\]: the group. ARGV\[2\]: the
/// requeued-owner name. ARGV\[3\]: the reserving consumer. ARGV\[4\]: the most entries to reserve.
/// Returns `{{id, delivery count, {field, value, ...}, key index}, ...}`, or `-1` when a stream
/// with entries has no group (the caller creates the groups and tries again).
const RESERVE: &str = r#"
local group, parked, consumer = ARGV[1], ARGV[2], ARGV[3]
local max = tonumber(ARGV[4])
local out = {}
for k, key in ipairs(KEYS) do
  if #out >= max then break end
  if redis.call('XLEN', key) > 0 then
    local p = redis.pcall('XPENDING', key, group, '-', '+', max - #out, parked)
    if p.err ~= nil then return -1 end
    for _, row in ipairs(p) do
      local id, n = row[1], row[4] + 1
      local e = redis.call('XRANGE', key, id, id)
      if #e == 0 then
        redis.call('XACK', key, group, id)
      else
        redis.call('XCLAIM', key, group, consumer, 0, id, 'RETRYCOUNT', n, 'JUSTID')
        out[#out + 1] = {id, n, e[1][2], k}
      end
    end
    if #out < max then
      local r = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max - #out, 'STREAMS', key, '>')
      if type(r) == 'table' and r.err ~= nil then return -1 end
      if r then
        for _, e in ipairs(r[1][2]) do out[#out + 1] = {e[1], 1, e[2], k} end
      end
    end
  end
end
return out
"#;

/// [`RESERVE`] after acknowledging deliveries of the same queue, as [`ACK`] would: a worker's
/// round hands its acknowledged messages' reservations to their successors in one call. The
/// acknowledgement runs first, inside the same script, so the consumer never holds more
/// entries than before the call when it asks for no more than it acknowledges.
///
/// KEYS and ARGV\[1..4\] as for [`RESERVE`]. ARGV\[5..\]: triples of key index (into KEYS),
/// entry id and delivery count, to acknowledge. Returns what [`RESERVE`] returns (`-1`, no
/// group, only after the acknowledgements).
const ACK_THEN: &str = r#"
for i = 5, #ARGV, 3 do
  local key, id = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local p = redis.pcall('XPENDING', key, ARGV[1], id, id, 1)
  if p.err == nil and #p == 1 and p[1][4] == tonumber(ARGV[i + 2]) then
    redis.call('XACK', key, ARGV[1], id)
    redis.call('XDEL', key, id)
  end
end
"#;

/// Create the consumer group (starting at `0`, so messages published before any worker came are
/// delivered) on each of a queue's band streams, creating the streams too; an existing group is
/// left alone. One round trip for all bands.
///
/// KEYS: the queue's band streams. ARGV\[1\]: the group.
/// Returns the number of groups created.
const ENSURE_GROUPS: &str = r#"
local n = 0
for _, key in ipairs(KEYS) do
  local r = redis.pcall('XGROUP', 'CREATE', key, ARGV[1], '0', 'MKSTREAM')
  if type(r) == 'table' and r.err ~= nil then
    if string.sub(r.err, 1, 9) ~= 'BUSYGROUP' then return redis.error_reply(r.err) end
  else
    n = n + 1
  end
end
return n
"#;

/// Acknowledge and delete delivered entries (late ack: the job's new state is committed). Only
/// an entry still pending at exactly that delivery is removed: acknowledging twice, or a
/// zombie acknowledging a delivery that was since requeued, removes nothing.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2..\]: pairs of entry id and
/// delivery count. Returns the number of entries removed.
const ACK: &str = r#"
local group = ARGV[1]
local n = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
  if p.err == nil and #p == 1 and p[1][4] == tonumber(ARGV[i + 1]) then
    redis.call('XACK', KEYS[1], group, id)
    n = n + redis.call('XDEL', KEYS[1], id)
  end
end
return n
"#;

/// Put deliveries still owned by one consumer (at that delivery) back: they become owned by the
/// requeued-owner name and keep their place at the head of the queue. A delivery whose entry was
/// deleted meanwhile has nothing to put back and is acknowledged away.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// ARGV\[3\]: the requeued-owner name. ARGV\[4..\]: pairs of entry id and delivery count.
/// Returns how many were put back.
const REQUEUE: &str = r#"
local group, consumer, parked = ARGV[1], ARGV[2], ARGV[3]
local n = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local count = tonumber(ARGV[i + 1])
  local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1, consumer)
  if p.err == nil and #p == 1 and p[1][4] == count then
    if #redis.call('XRANGE', KEYS[1], id, id) == 1 then
      redis.call('XCLAIM', KEYS[1], group, parked, 0, id, 'RETRYCOUNT', count + 1, 'JUSTID')
      n = n + 1
    else
      redis.call('XACK', KEYS[1], group, id)
    end
  end
end
return n
"#;

/// Move one delivered entry from a queue stream to that queue's dead-letter stream, with the
/// reason, if it is still pending at that delivery. The dead letter's `payload` is the job id of
/// a well-formed message, otherwise the JSON array of the entry's fields (garbage stays
/// inspectable).
///
/// KEYS\[1\]: the queue stream. KEYS\[2\]: the queue's dead-letter stream.
/// ARGV\[1\]: the group. ARGV\[2\]: the entry id. ARGV\[3\]: the delivery count.
/// ARGV\[4\]: the queue name. ARGV\[5\]: the reason. ARGV\[6\]: the time (µs since the epoch).
/// Returns 1 when moved, 0 when the delivery was no longer there.
const DEAD_LETTER: &str = r#"
local group, id = ARGV[1], ARGV[2]
local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
if p.err ~= nil or #p == 0 or p[1][4] ~= tonumber(ARGV[3]) then return 0 end
local e = redis.call('XRANGE', KEYS[1], id, id)
redis.call('XACK', KEYS[1], group, id)
if #e == 0 then return 0 end
local f = e[1][2]
local payload
if #f == 2 and f[1] == 'job' then payload = f[2] else payload = cjson.encode(f) end
redis.call('XADD', KEYS[2], '*', 'queue', ARGV[4], 'payload', payload, 'reason', ARGV[5], 'at', ARGV[6])
redis.call('XDEL', KEYS[1], id)
return 1
"#;

/// The deliveries pending for one consumer, oldest first. A pending id whose entry was deleted
/// (`XDEL` by hand) can never be delivered again: it is acknowledged away instead of returned.
///
/// KEYS\[1\]: the queue stream. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// ARGV\[3\]: the most entries to look at.
/// Returns `{{id, delivery count, {field, value, ...}}, ...}`; `{}` when there is no group.
const PENDING: &str = r#"
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[3]), ARGV[2])
if p.err ~= nil then return {} end
local out = {}
for _, row in ipairs(p) do
  local e = redis.call('XRANGE', KEYS[1], row[1], row[1])
  if #e == 1 then
    out[#out + 1] = {row[1], row[4], e[1][2]}
  else
    redis.call('XACK', KEYS[1], ARGV[1], row[1])
  end
end
return out
"#;

/// What one queue holds, summed over its band streams.
///
/// KEYS\[1..n-1\]: the queue's band streams. KEYS\[n\]: the queue's dead-letter stream.
/// ARGV\[1\]: the group. ARGV\[2\]: the requeued-owner name.
/// Returns `{entries in the streams, entries pending, of which requeued, dead letters}`.
/// Acknowledged entries are always deleted, so the streams hold exactly the ready and the
/// pending ones.
const DEPTH: &str = r#"
local len, pending, parked = 0, 0, 0
for k = 1, #KEYS - 1 do
  len = len + redis.call('XLEN', KEYS[k])
  local p = redis.pcall('XPENDING', KEYS[k], ARGV[1])
  if p.err == nil then
    pending = pending + p[1]
    if type(p[4]) == 'table' then
      for _, c in ipairs(p[4]) do
        if c[1] == ARGV[2] then parked = parked + tonumber(c[2]) end
      end
    end
  end
end
return {len, pending, parked, redis.call('XLEN', KEYS[#KEYS])}
"#;

/// The names of the consumers in a queue's group, over all its band streams (whether or not
/// they own entries).
///
/// KEYS: the queue's band streams. ARGV\[1\]: the group.
/// Returns `{name, ...}` (a name may repeat); a stream or group that does not exist adds none.
const CONSUMERS: &str = r#"
local names = {}
for _, key in ipairs(KEYS) do
  local c = redis.pcall('XINFO', 'CONSUMERS', key, ARGV[1])
  if c.err == nil then
    for _, row in ipairs(c) do
      for i = 1, #row, 2 do
        if row[i] == 'name' then names[#names + 1] = row[i + 1] end
      end
    end
  end
end
return names
"#;

/// Delete a consumer from a queue's group on every band stream, only if it owns no pending
/// entry in any of them. Checked and done in one step: `XGROUP DELCONSUMER` drops the
/// consumer's pending entries, so deleting a consumer that reserved a message in between would
/// lose that message.
///
/// KEYS: the queue's band streams. ARGV\[1\]: the group. ARGV\[2\]: the consumer.
/// Returns 1 when the consumer owns nothing in this queue (it is gone from the group), 0 when it
/// still owns entries (it is kept everywhere).
const DROP_CONSUMER: &str = r#"
for _, key in ipairs(KEYS) do
  local p = redis.pcall('XPENDING', key, ARGV[1], '-', '+', 1, ARGV[2])
  if p.err == nil and #p > 0 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.pcall('XGROUP', 'DELCONSUMER', key, ARGV[1], ARGV[2])
end
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
/// ARGV\[2\]: the time of this beat (µs since the epoch), kept as the key's value.
/// Returns 1 when refreshed, 0 when the key was gone.
const HEARTBEAT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
return 1
"#;

/// The broker's scripts, hashed once (`EVALSHA`; a script the server forgot, e.g. after a
/// restart, is loaded again on `NOSCRIPT`).
#[derive(Debug)]
pub struct Scripts {
    pub reserve: Script,
    /// [`ACK_THEN`] followed by [`RESERVE`].
    pub ack_reserve: Script,
    pub ensure_groups: Script,
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
            reserve: Script::new(RESERVE),
            ack_reserve: Script::new(&format!("{ACK_THEN}{RESERVE}")),
            ensure_groups: Script::new(ENSURE_GROUPS),
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

//! The two Lua scripts of the Celery ingress. kombu's own consumers pop a message (`BRPOP`) and
//! only then note it in the `unacked` hash, so a consumer killed in between loses it; here the pop
//! and the note are one script, which Redis runs without interleaving, so a Celery message is at
//! every instant either in its list or in exactly one ingress's claimed hash.
//!
//! The scripts name kombu's lists inside values (a claimed entry remembers its list), which is
//! fine on a single Redis server — the only topology kombu's Redis transport supports.

use ::redis::Script;

/// Claim up to a number of messages of one queue for one ingress consumer, serving priority
/// lists in kombu's order (step 0 first) and each list from its consumer end (`RPOP`, as kombu's
/// `BRPOP`).
///
/// KEYS\[1..n\]: the queue's lists in serving order. KEYS\[n+1\]: the consumer's claimed hash.
/// ARGV\[1\]: the most messages to claim. ARGV\[2\]: a batch id unique to this call (the hash
/// fields are `<batch>:<k>`).
/// Each claimed message is stored as `<list name>\n<payload>` so it can go back to its list.
/// Returns `{field, payload, field, payload, ...}`.
const CLAIM: &str = r#"
local max = tonumber(ARGV[1])
local hash = KEYS[#KEYS]
local out = {}
local n = 0
for i = 1, #KEYS - 1 do
  while n < max do
    local v = redis.call('RPOP', KEYS[i])
    if not v then break end
    n = n + 1
    local field = ARGV[2] .. ':' .. n
    redis.call('HSET', hash, field, KEYS[i] .. '\n' .. v)
    out[#out + 1] = field
    out[#out + 1] = v
  end
end
return out
"#;

/// Put a lost ingress consumer's claimed messages back at the consumer end of their lists (as
/// kombu's own restore does), unless its heartbeat came back.
///
/// KEYS\[1\]: the consumer's heartbeat. KEYS\[2\]: its claimed hash. KEYS\[3\]: the set of
/// ingress consumers. ARGV\[1\]: the consumer's name.
/// Returns the number of messages put back, or `-1` when the consumer is alive.
const RESTORE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local all = redis.call('HGETALL', KEYS[2])
local n = 0
for i = 1, #all, 2 do
  local v = all[i + 1]
  local cut = string.find(v, '\n', 1, true)
  if cut then
    redis.call('RPUSH', string.sub(v, 1, cut - 1), string.sub(v, cut + 1))
    n = n + 1
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return n
"#;

pub struct Scripts {
    pub claim: Script,
    pub restore: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            claim: Script::new(CLAIM),
            restore: Script::new(RESTORE),
        }
    }
}

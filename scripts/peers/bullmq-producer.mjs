// The producer of scripts/bench-peers: adds N no-op jobs with addBulk, CHUNK per call (the same
// 500 per call as `homing bench`), while the workers already drain, then waits until all are
// completed and prints one JSON line: when the first add began and when the last job finished
// (the completed set is scored by finishedOn), in Unix milliseconds.
// Completed jobs are kept (BullMQ's default, removeOnComplete unset): each leaves a record in
// Redis, as homing's jobs leave theirs in the store.
// Usage: node bullmq-producer.mjs QUEUE N CHUNK REDIS_SOCKET
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';

const [queue, nArg, chunkArg, socket] = process.argv.slice(2);
const n = Number(nArg);
const chunk = Number(chunkArg);
const q = new Queue(queue, { connection: { path: socket } });
await q.waitUntilReady();
// A connection of our own for the completion polls (ZCARD every 50 ms, nothing heavier).
const client = new Redis({ path: socket });
const t0 = Date.now();
for (let left = n; left > 0; left -= chunk) {
  const m = Math.min(chunk, left);
  await q.addBulk(Array.from({ length: m }, () => ({ name: 'noop', data: {} })));
}
const enqueued = Date.now();
const key = `bull:${queue}:completed`;
const deadline = Date.now() + 3600 * 1000;
for (;;) {
  const [done, failed] = await Promise.all([client.zcard(key), client.zcard(`bull:${queue}:failed`)]);
  if (failed > 0) throw new Error(`${failed} BullMQ jobs failed`);
  if (done >= n) break;
  if (Date.now() > deadline) throw new Error(`timed out: ${done} of ${n} completed`);
  await new Promise((r) => setTimeout(r, 50));
}
const last = await client.zrange(key, -1, -1, 'WITHSCORES');
console.log(JSON.stringify({ t0, enqueued, end: Number(last[1]) }));
await q.close();
client.disconnect();

// One BullMQ worker process for scripts/bench-peers: a Worker of the given concurrency running
// a no-op processor. Prints "ready" once connected, so the driver starts adding jobs only when
// every worker is up; closes gracefully on SIGTERM (finishing what it runs).
// Usage: node bullmq-worker.mjs QUEUE CONCURRENCY REDIS_SOCKET
import { Worker } from 'bullmq';

const [queue, concurrency, socket] = process.argv.slice(2);
const worker = new Worker(queue, async () => null, {
  connection: { path: socket, maxRetriesPerRequest: null },
  concurrency: Number(concurrency),
});
worker.on('failed', (job, err) => console.error(`job ${job?.id} failed: ${err}`));
await worker.waitUntilReady();
console.log('ready');
process.on('SIGTERM', async () => {
  await worker.close();
  process.exit(0);
});

/**
 * Cost of spend holds in the limits store alone (`npx tsx bench/limits-store.ts`): the
 * request path's store calls, in one run, budgets off versus on, for the in-process limiter
 * and for Redis (BENCH_REDIS_URL, default redis://127.0.0.1:6379, through createLimiter as
 * the sidecar runs it):
 *   off  admit (RPM, TPM, concurrency) + finish
 *   on   the same + hold on a key budget and a project budget + settle
 * CONCURRENCY requests in flight at all times for DURATION seconds per variant, variants
 * alternated over ROUNDS rounds, median requests/s reported. The end-to-end figure (with
 * HTTP) belongs in bench/run.ts once the request path takes holds.
 */
import { Redis } from 'ioredis';
import { createLimiter } from '../src/limits/failover.js';
import type { Limiter } from '../src/limits/limiter.js';

const env = (name: string, def: number): number => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : def;
};
const ROUNDS = env('BENCH_ROUNDS', 3);
const DURATION = env('BENCH_DURATION', 3);
const CONCURRENCY = env('BENCH_CONCURRENCY', 64);
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
const PREFIX = `kwbench-${process.pid}`;
const KEYS = 50;

const limits = { rpm: 1e9, tpm: 1e12, concurrency: 1e6 };
const route = { name: 'bench', concurrency: 0, rpm: 0 };

async function run(lim: Limiter, budgets: boolean): Promise<number> {
  let done = 0;
  let seq = 0;
  const until = performance.now() + DURATION * 1000;
  const worker = async (): Promise<void> => {
    while (performance.now() < until) {
      const k = `k${seq++ % KEYS}`;
      const a = await lim.admit({ keyId: k, limits, tokens: 100, route, requestId: 'r' });
      if (!a.ok) throw new Error(`admission refused: ${a.code}`);
      if (budgets) {
        const p = `p${seq % 5}`;
        const h = await lim.hold({
          requestId: 'r',
          tag: p,
          amount: 0.001,
          holders: [
            { id: `key:${k}`, kind: 'budget', base: 0, limit: 1e6, epoch: 0, code: 'key_budget_exhausted' },
            { id: `project:${p}`, kind: 'budget', base: 0, limit: 1e6, epoch: 0, code: 'project_budget_exhausted' },
          ],
        });
        if (!h.ok) throw new Error(`hold refused: ${h.code}`);
        h.hold.settle(0.0005);
      }
      a.lease.finish({ tokens: 90 });
      done++;
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return done / DURATION;
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function cleanup(): Promise<void> {
  const redis = new Redis(REDIS_URL);
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `{${PREFIX}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  redis.disconnect();
}

const stores: [string, Limiter][] = [
  ['memory', createLimiter({})],
  ['redis', createLimiter({ redis: { url: REDIS_URL, prefix: PREFIX, timeoutMs: 1_000, onError: 'closed' } })],
];
try {
  for (const [name, lim] of stores) {
    await run(lim, true); // warm-up: connection, scripts loaded, JIT
    const off: number[] = [];
    const on: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      off.push(await run(lim, false));
      on.push(await run(lim, true));
    }
    const [a, b] = [median(off), median(on)];
    console.log(`${name.padEnd(7)} budgets off ${a.toFixed(0).padStart(7)} req/s   on ${b.toFixed(0).padStart(7)} req/s   (${((b / a) * 100).toFixed(0)}%)`);
  }
} finally {
  for (const [, lim] of stores) await lim.close();
  await cleanup();
}

/**
 * Bucket slices and blocks of concurrency slots in the limits store alone
 * (`npx tsx bench/limits-lease.ts`): Redis calls per request and limiter operations per
 * second, `redis.lease` off versus on, side by side in one run, through createLimiter as the
 * sidecar runs it (BENCH_REDIS_URL, default redis://127.0.0.1:6379). One operation is a
 * request's store work:
 *   admit (key RPM and TPM, far from the limit) + finish with real usage (a TPM refund),
 *   and with BENCH_BUDGETS=1 also a spend hold on a key and a project budget + its settlement.
 * Two cases, each measured on its own: keys with RPM and TPM only, and keys that also have a
 * concurrency limit (BENCH_KEY_CONCURRENCY, default 1024, far from it: blocks of slots
 * leased; a limit under 16 has none and keeps one call per request). Redis timeout 5 s, so
 * a machine slowed by MONITOR does not abort the run. CONCURRENCY operations in flight for
 * DURATION s per variant, variants alternated over ROUNDS rounds, median reported. Calls are
 * counted in a separate pass of CALLS_OPS operations per variant with MONITOR (which slows
 * Redis, so it is not on while timing).
 */
import { Redis } from 'ioredis';
import { createLimiter } from '../src/limits/create.js';
import type { Limiter } from '../src/limits/limiter.js';
import { watchEvals } from '../test/helpers/redis-monitor.js';

const env = (name: string, def: number): number => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : def;
};
const ROUNDS = env('BENCH_ROUNDS', 3);
const DURATION = env('BENCH_DURATION', 3);
const CONCURRENCY = env('BENCH_CONCURRENCY', 64);
const CALLS_OPS = env('BENCH_CALLS_OPS', 5000);
const KEYS = env('BENCH_KEYS', 50);
const BUDGETS = process.env.BENCH_BUDGETS === '1';
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
const PREFIX = `kwbench-lease-${process.pid}`;

const KEY_CONCURRENCY = env('BENCH_KEY_CONCURRENCY', 1024);
let limits: { rpm: number; tpm: number; concurrency: number | null } = { rpm: 1e9, tpm: 1e12, concurrency: null };
const route = { name: 'bench', concurrency: 0, rpm: 0 };

async function op(lim: Limiter, seq: number): Promise<void> {
  const k = `k${seq % KEYS}`;
  const a = await lim.admit({ keyId: k, limits, tokens: 100, route });
  if (!a.ok) throw new Error(`admission refused: ${a.code}`);
  if (BUDGETS) {
    const p = `p${seq % 5}`;
    const h = await lim.hold({
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
}

/** Runs `count` operations, or for `seconds`; returns operations done and seconds spent. */
async function drive(lim: Limiter, o: { count?: number; seconds?: number }): Promise<{ done: number; secs: number }> {
  let seq = 0;
  const start = performance.now();
  const until = start + (o.seconds ?? 1e9) * 1000;
  const worker = async (): Promise<void> => {
    while (performance.now() < until && (o.count === undefined || seq < o.count)) {
      await op(lim, seq++);
      // A request reaches the sidecar as I/O: yield to it, as the server does, or admissions
      // from a slice (no I/O at all) would starve the Redis replies of the others.
      await new Promise<void>((r) => setImmediate(r));
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return { done: seq, secs: (performance.now() - start) / 1000 };
}

/** Redis script calls per operation, counted with MONITOR on this run's prefix. */
async function callsPerOp(lim: Limiter): Promise<number> {
  const evals = await watchEvals([REDIS_URL], PREFIX);
  await evals.settle();
  evals.calls = 0;
  const { done } = await drive(lim, { count: CALLS_OPS });
  await new Promise((r) => setTimeout(r, 100)); // settlements still queued leave within a tick
  await evals.settle();
  evals.stop();
  return evals.calls / done;
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function cleanup(): Promise<void> {
  const redis = new Redis(REDIS_URL);
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `{${PREFIX}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
  redis.disconnect();
}

const variantsOf = (tag: string): [string, Limiter][] => [false, true].map((enabled) => [
  enabled ? 'lease on ' : 'lease off',
  createLimiter({ redis: { url: REDIS_URL, prefix: `${PREFIX}-${tag}-${enabled ? 'on' : 'off'}`, timeoutMs: 5_000, onError: 'closed', lease: { enabled, sliceMs: 1000 } }, leaseMs: 30_000 }),
]);
const cases: [string, typeof limits][] = [
  ['rpm+tpm', { rpm: 1e9, tpm: 1e12, concurrency: null }],
  [`rpm+tpm+concurrency ${KEY_CONCURRENCY}`, { rpm: 1e9, tpm: 1e12, concurrency: KEY_CONCURRENCY }],
];
console.log(`keys ${KEYS}, ${CONCURRENCY} in flight, ${DURATION} s x ${ROUNDS} rounds, budgets ${BUDGETS ? 'on' : 'off'}`);
for (const [caseName, caseLimits] of cases) {
  limits = caseLimits;
  const variants = variantsOf(caseName.replace(/\W+/g, '-'));
  try {
    const calls = new Map<string, number>();
    for (const [name, lim] of variants) {
      await drive(lim, { seconds: 1 }); // warm-up: connection, scripts, JIT, demand history
      calls.set(name, await callsPerOp(lim));
    }
    const rates = new Map<string, number[]>(variants.map(([n]) => [n, []]));
    for (let r = 0; r < ROUNDS; r++) {
      for (const [name, lim] of variants) {
        const { done, secs } = await drive(lim, { seconds: DURATION });
        rates.get(name)!.push(done / secs);
      }
    }
    console.log(`keys limited by ${caseName}`);
    const base = median(rates.get('lease off')!);
    for (const [name] of variants) {
      const ops = median(rates.get(name)!);
      console.log(`  ${name}  ${calls.get(name)!.toFixed(3)} Redis calls/op   ${ops.toFixed(0).padStart(7)} ops/s   (${((ops / base) * 100).toFixed(0)}% of lease off)`);
    }
  } finally {
    for (const [, lim] of variants) await lim.close();
  }
}
await cleanup();

/**
 * keyward as the benchmark runs it: a real sidecar (startSidecar) with a replica holding
 * the benchmark key, its access log formatted as in production but written to /dev/null;
 * the compiled build when bench/lib/servers.ts made one (build.ts).
 *   node --import tsx bench/servers/keyward.ts <upstream url> memory|redis|redis-budgets [redis url] [workers]
 * memory:        in-process limiter, personal key with no limits on its user's wallet and no
 *                price records: admission is a no-op, the wallet hold is 0 in process memory.
 * redis:         Redis limits with a unique prefix and a personal key with high rpm/tpm/
 *                concurrency, so nothing is denied but every limit is enforced in Redis
 *                (leased slices and slot blocks far from the limits, redis.lease's default).
 *                The key draws on its user's wallet; there is no price record, so the wallet
 *                hold is 0, but it is still checked in Redis (hold.lua; not recorded), and a
 *                request admitted from a slice settles its tokens into that slice: one hold
 *                per request (the holds of one event-loop turn in one EVALSHA), money always 0.
 * redis-budgets: Redis limits as above, and spend holds that move money: a team key with a
 *                key budget in a project with a budget (both far from exhausted) and a price
 *                record for the benchmark request's model, so every request holds a non-zero
 *                cost estimate on both budgets at once and settles it to the cost of the
 *                upstream's reported usage: the hold (the holds of one turn in one EVALSHA)
 *                and its batched settlement on two ledgers.
 * workers > 1 (redis modes only): `serve --workers N` as the CLI runs it, a cluster primary
 *                (startWorkers) and N workers (keyward-worker.ts) sharing the port.
 * On shutdown a single-process server writes one more JSON line on stdout, `{"stats":
 * <limiter stats>}`, which carries the fallback spend holds that /metrics does not show.
 */
import cluster from 'node:cluster';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type { SyncRecord } from '../../src/protocol/records.js';
import { load } from './build.js';
import { exitWithParent, ready } from './common.js';

const [{ makeKeyHasher }, { generateKey }, { configSchema }, { createLogger, logDestination }, { startSidecar }, { startWorkers }, { ReplicaStore }] = await Promise.all([
  load<typeof import('../../src/auth/hash.js')>('auth/hash.js'),
  load<typeof import('../../src/auth/keyformat.js')>('auth/keyformat.js'),
  load<typeof import('../../src/config/schema.js')>('config/schema.js'),
  load<typeof import('../../src/obs/logger.js')>('obs/logger.js'),
  load<typeof import('../../src/app/sidecar.js')>('app/sidecar.js'),
  load<typeof import('../../src/app/workers.js')>('app/workers.js'),
  load<typeof import('../../src/replica/store.js')>('replica/store.js'),
]);

const upstream = process.argv[2] ?? 'http://127.0.0.1:4000';
const MODES = ['memory', 'redis', 'redis-budgets'] as const;
type Mode = (typeof MODES)[number];
const mode: Mode = MODES.find((m) => m === process.argv[3]) ?? 'memory';
const withRedis = mode !== 'memory';
const redisUrl = process.argv[4] ?? 'redis://127.0.0.1:6379';
const workers = Math.max(1, Number(process.argv[5] ?? 1) || 1);
const prefix = `kwbench-${process.pid}-${Date.now().toString(36)}`;

const dir = mkdtempSync(join(tmpdir(), 'kw-bench-'));
const config = configSchema.parse({
  server: { port: 0 },
  admin: { port: 0 },
  upstreams: { default: { url: upstream } },
  replica: { path: join(dir, 'replica.sqlite') },
  logging: { level: 'info' },
  // timeoutMs 1000, not the default 100: on a busy 2-core machine, where the load generator,
  // the upstream and Redis compete with the sidecar, Redis often answers after 100 ms, and
  // those requests would be admitted by the in-process fallback (onError: open), which does
  // less work and flatters the Redis figures. 1 s only fires when Redis is really unwell;
  // the run reports any fallbacks that still happen.
  ...(withRedis ? { redis: { url: redisUrl, prefix, timeoutMs: 1_000 } } : {}),
});
// The parent passes one key so every variant gets byte-identical requests.
const key = process.env.KW_BENCH_KEY ?? generateKey();
const limits = withRedis ? { rpm: 100_000_000, tpm: 100_000_000_000, concurrency: 100_000 } : { rpm: null, tpm: null, concurrency: null };
const hash = makeKeyHasher(config.keys)(key);
const records: SyncRecord[] =
  mode === 'redis-budgets'
    ? [
        // A budget of 1,000,000 against a cost of about 1e-5 a request: never exhausted.
        { type: 'project', id: 'p_bench', status: 'enabled', budget: 1_000_000, spent: 0 },
        {
          type: 'key', id: 'k_bench', hash, kind: 'team', user: null, project: 'p_bench',
          status: 'active', budget: 1_000_000, spent: 0, models: null, routing: null, ...limits,
        },
        // The benchmark request's model (gpt-4o-mini), priced per million tokens.
        { type: 'price', model: 'gpt-4o-mini*', input: 0.15, output: 0.6, per: 1_000_000 },
      ]
    : [
        { type: 'wallet', user: 'u_bench', balance: 1_000_000 },
        {
          type: 'key', id: 'k_bench', hash, kind: 'personal', user: 'u_bench', project: null,
          status: 'active', budget: null, spent: 0, models: null, routing: null, ...limits,
        },
      ];
const replica = new ReplicaStore({ path: config.replica.path });
replica.applySnapshot({ version: 1, records: records.map((record, i) => ({ line: i + 2, record })), source: 'bench' });
// As in production, only to /dev/null.
const logger = createLogger({ level: process.env.KW_BENCH_LOG_LEVEL ?? 'info', destination: logDestination(process.env.KW_BENCH_LOG ? `${process.env.KW_BENCH_LOG}.${mode}` : '/dev/null') });
let close: () => Promise<void>;
if (workers > 1) {
  await replica.close();
  // The workers run keyward-worker.ts with the config startWorkers sends them.
  cluster.setupPrimary({ exec: join(import.meta.dirname, 'keyward-worker.ts'), execArgv: process.execArgv });
  const pool = await startWorkers({ config, logger, workers });
  ready({ port: pool.port, adminPort: pool.adminPort, key, mode, workers, prefix, redisTimeoutMs: config.redis?.timeoutMs, pids: pool.pids() });
  close = () => pool.close({ graceMs: 500 });
} else {
  const sidecar = await startSidecar({ config, logger, replica });
  ready({ port: sidecar.port, adminPort: sidecar.adminPort, key, mode, prefix, redisTimeoutMs: config.redis?.timeoutMs });
  close = async () => {
    process.stdout.write(`${JSON.stringify({ stats: sidecar.limiter.stats() })}\n`);
    await sidecar.close({ graceMs: 500 });
    await replica.close();
  };
}

exitWithParent(async () => {
  await close();
  rmSync(dir, { recursive: true, force: true });
  if (withRedis) {
    // Leave nothing behind in the shared Redis.
    const r = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
    let cursor = '0';
    do {
      const [next, keys] = await r.scan(cursor, 'MATCH', `{${prefix}:*`, 'COUNT', 1000);
      if (keys.length > 0) await r.del(...keys);
      cursor = next;
    } while (cursor !== '0');
    r.disconnect();
  }
});

/**
 * keyward as the benchmark runs it: a real sidecar (startSidecar) with a replica holding
 * one personal key, its access log formatted as in production but written to /dev/null.
 *   node --import tsx bench/servers/keyward.ts <upstream url> memory|redis [redis url]
 * memory: in-process limiter, no limits on the key (admission is a no-op).
 * redis:  Redis limits with a unique prefix and a key with high rpm/tpm/concurrency, so
 *         nothing is denied but every request is admitted and settled in Redis.
 * workers > 1 (redis only): `serve --workers N` as the CLI runs it, a cluster primary
 *         (startWorkers) and N workers (keyward-worker.ts) sharing the port.
 */
import cluster from 'node:cluster';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { generateKey } from '../../src/auth/keyformat.js';
import { configSchema } from '../../src/config/schema.js';
import { createLogger, logDestination } from '../../src/obs/logger.js';
import { startSidecar } from '../../src/proxy/server.js';
import { startWorkers } from '../../src/proxy/workers.js';
import { ReplicaStore } from '../../src/replica/store.js';
import type { SyncRecord } from '../../src/protocol/records.js';
import { exitWithParent, ready } from './common.js';

const upstream = process.argv[2] ?? 'http://127.0.0.1:4000';
const mode = process.argv[3] === 'redis' ? 'redis' : 'memory';
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
  ...(mode === 'redis' ? { redis: { url: redisUrl, prefix } } : {}),
});
// The parent passes one key so every variant gets byte-identical requests.
const key = process.env.KW_BENCH_KEY ?? generateKey();
const limits = mode === 'redis' ? { rpm: 100_000_000, tpm: 100_000_000_000, concurrency: 100_000 } : { rpm: null, tpm: null, concurrency: null };
const records: SyncRecord[] = [
  { type: 'wallet', user: 'u_bench', balance: 1_000_000 },
  {
    type: 'key', id: 'k_bench', hash: makeKeyHasher(config.keys)(key), kind: 'personal', user: 'u_bench', project: null,
    status: 'active', budget: null, spent: 0, models: null, routing: null, ...limits,
  },
];
const replica = new ReplicaStore({ path: config.replica.path });
replica.applySnapshot({ version: 1, records: records.map((record, i) => ({ line: i + 2, record })), source: 'bench' });
// As in production, only to /dev/null.
const logger = createLogger({ level: 'info', destination: logDestination('/dev/null') });
let close: () => Promise<void>;
if (workers > 1) {
  replica.close();
  // The workers run keyward-worker.ts with this config.
  cluster.setupPrimary({ exec: join(import.meta.dirname, 'keyward-worker.ts'), execArgv: process.execArgv });
  process.env.KW_BENCH_CONFIG = JSON.stringify(config);
  const pool = await startWorkers({ config, logger, workers });
  ready({ port: pool.port, adminPort: pool.adminPort, key, mode, workers, pids: pool.pids() });
  close = () => pool.close({ graceMs: 500 });
} else {
  const sidecar = await startSidecar({ config, logger, replica });
  ready({ port: sidecar.port, adminPort: sidecar.adminPort, key, mode });
  close = async () => {
    process.stderr.write(`keyward ${mode}: limiter ${JSON.stringify(sidecar.limiter.stats())}\n`);
    await sidecar.close({ graceMs: 500 });
    replica.close();
  };
}

exitWithParent(async () => {
  await close();
  rmSync(dir, { recursive: true, force: true });
  if (mode === 'redis') {
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

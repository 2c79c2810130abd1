/**
 * Young-generation GC per variant under the same evenly paced load (paced.ts): how many
 * scavenges per 1,000 requests, their pause, and what outlives them. What survives a
 * scavenge is copied, and what survives two is promoted to the old generation, where it
 * brings major GCs; a sidecar whose per-request state dies young pays little for GC, one
 * whose state outlives a scavenge pays on every request and in its latency tail.
 *   npx tsx bench/young-gc.ts
 * Each server runs with --trace-gc-nvp; the figures are medians over the scavenges of the
 * measured window (after a warm-up at the same rate).
 * GC_SATURATE=1 loads each server as `npm run bench` does instead (autocannon, 32
 * connections, as fast as it answers), where many more requests are in flight at each
 * scavenge; the last column counts the full (mark-compact) GCs of the measured window.
 * Environment: GC_RATE (2000 req/s), GC_DURATION (4 s), GC_SATURATE, BENCH_VARIANTS
 * (bare,keyward,keyward-redis,keyward-redis-budgets).
 */
import { paced } from './paced.js';
import { median, throughput } from './lib/measure.js';
import { redisAvailable, startServer, stopServer } from './lib/servers.js';
import { RAW_REQUEST, REDIS_URL, env as num, log } from './lib/settings.js';

const RATE = num('GC_RATE', 2000);
const DURATION = num('GC_DURATION', 4);
const SATURATE = process.env.GC_SATURATE === '1';
const want = (process.env.BENCH_VARIANTS ?? 'bare,keyward,keyward-redis,keyward-redis-budgets').split(',');

const upstream = await startServer('upstream', []);
const url = `http://127.0.0.1:${upstream.port}`;
const redis = await redisAvailable(REDIS_URL);
const args: Record<string, [string, string[]]> = {
  bare: ['bare', [url]],
  keyward: ['keyward', [url, 'memory']],
  'keyward-redis': ['keyward', [url, 'redis', REDIS_URL]],
  'keyward-redis-budgets': ['keyward', [url, 'redis-budgets', REDIS_URL]],
};
log(`${SATURATE ? 'saturated (autocannon)' : `paced at ${RATE} req/s`}, ${DURATION} s measured per variant; medians per scavenge`);
log(`${'variant'.padEnd(22)} ${'scavenges/1k req'.padStart(16)} ${'pause ms'.padStart(9)} ${'GC ms/1k req'.padStart(12)} ${'survived KB'.padStart(12)} ${'promoted KB'.padStart(12)} ${'full GCs'.padStart(9)}`);
/** Requests completed under the load: paced, or saturating. */
const load = async (port: number, seconds: number): Promise<number> =>
  SATURATE ? (await throughput(port, seconds)).ok : (await paced({ host: '127.0.0.1', port, request: RAW_REQUEST, rate: RATE, durationMs: seconds * 1000 })).completed;
for (const v of want) {
  const spec = args[v];
  if (!spec || (v.startsWith('keyward-redis') && !redis)) continue;
  // One nvp line per GC; only those inside the measured window count: scavenges ("gc=s")
  // and full GCs ("gc=mc", or "gc=mmc" when memory is low).
  const lines: string[] = [];
  let full = 0;
  let measuring = false;
  const s = await startServer(spec[0], spec[1], {
    nodeArgs: ['--trace-gc-nvp'],
    onLine: (l) => {
      if (!measuring) return;
      if (l.includes(' gc=s ')) lines.push(l);
      else if (l.includes(' gc=mc ') || l.includes(' gc=mmc ')) full++;
    },
  });
  await load(s.port, 2);
  measuring = true;
  const completed = await load(s.port, DURATION);
  measuring = false;
  await stopServer(s);
  const rows = lines.map((l) => Object.fromEntries(l.split(' ').map((kv) => kv.split('=')).filter((kv) => kv.length === 2).map(([k, x]) => [k, Number.parseFloat(x!)])));
  const col = (k: string) => median(rows.map((row) => row[k] ?? 0));
  const per1k = 1000 / Math.max(1, completed);
  const total = rows.reduce((a, row) => a + (row.scavenge ?? 0), 0);
  log(
    `${v.padEnd(22)} ${(rows.length * per1k).toFixed(2).padStart(16)} ${col('scavenge').toFixed(2).padStart(9)} ${(total * per1k).toFixed(2).padStart(12)} ` +
      `${(col('new_space_survived') / 1024).toFixed(0).padStart(12)} ${(col('promoted') / 1024).toFixed(0).padStart(12)} ${String(full).padStart(9)}`,
  );
}
await stopServer(upstream);
process.exit(0);

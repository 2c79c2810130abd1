/**
 * Side-by-side benchmark (`npm run bench`): the same small chat request, the same
 * upstream, several ways, in one run on one machine:
 *   direct         straight to the upstream
 *   bare           a bare http-proxy-3 pass-through with keyward's agent settings
 *   keyward        keyward, cached key, in-process limiter, no limits on the key (personal
 *                  key, no price records: its wallet hold is 0 and stays in process)
 *   keyward-redis  keyward with Redis limits (personal key with high rpm/tpm/concurrency,
 *                  enforced in Redis; with redis.lease on, the default, admissions come from
 *                  leased slices and slot blocks); the key draws on its user's wallet but no
 *                  price record exists, so the wallet hold is 0, yet still taken in Redis:
 *                  one hold per request, the holds of one event-loop turn in one EVALSHA;
 *                  a request admitted from a slice settles its tokens into that slice
 *   keyward-redis-budgets  keyward-redis plus spend holds that move money (DESIGN section 6):
 *                  a team key with a key budget in a project with a budget (both far from
 *                  exhausted) and a price record for the request's model, so every request
 *                  holds a non-zero cost estimate on both budgets at once and settles it to
 *                  the cost of the reported usage: one hold per request on two ledgers (the
 *                  holds of one turn in one call), settlements batched per tick
 *   keyward-redis-w2       keyward-redis as `serve --workers 2`: a cluster primary and two
 *                  workers on one port; its CPU is the sum over the three processes. On a
 *                  2-core machine the load generator and the upstream compete with the workers.
 * The Redis variants run with redis.timeoutMs 1000 (bench/servers/keyward.ts says why); the
 * report counts, per Redis variant, Redis errors and the admissions and spend holds that
 * still went to the in-process fallback, and marks a variant that had any.
 * Memory (RSS with 1,000 open SSE streams, during a 1 GiB upload): `npm run bench:memory`.
 *
 * Every server runs in a child process of its own, so the load generator (autocannon, in
 * this process) never shares an event loop with the server under test. Throughput:
 * a warm-up per variant, then ROUNDS rounds of DURATION seconds per variant, the order
 * rotated each round, median reported. Latency at a fixed rate below every variant's
 * saturation (half of the slowest variant's median throughput) for bare, keyward and
 * the single-process Redis variants, twice: with autocannon's -R, and with an evenly
 * paced open-loop generator (see paced.ts for why both).
 *
 * Environment:
 *   BENCH_ROUNDS (3), BENCH_DURATION (5 s), BENCH_WARMUP (3 s), BENCH_CONNECTIONS (32),
 *   BENCH_RATE_CONNECTIONS (8, autocannon -R), BENCH_RATE_FRACTION (0.5),
 *   BENCH_REDIS_URL (redis://127.0.0.1:6379),
 *   BENCH_VARIANTS   comma list, e.g. `keyward`: bare (the baseline) plus these only
 *   BENCH_PROFILE=1  CPU profiles of the bare and keyward children in .bench/prof
 *                    (summarise with `tsx bench/profile-top.ts <file>`)
 *   BENCH_PIN=1      servers under test on CPU 1, upstream and load generator on CPU 0
 *                    (except keyward-redis-w2, whose workers would share one core)
 * Results: a table on stdout and .bench/results.json.
 * Modules: lib/settings.ts (environment, request, variants), lib/servers.ts (children),
 * lib/measure.ts (throughput, latency, CPU), lib/report.ts (table and JSON).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { latencyCannon, latencyPaced, median, throughput, type Latency, type Throughput } from './lib/measure.js';
import { f, lpad, ms, pad, report } from './lib/report.js';
import { failOpenHoldsAtExit, killChildren, readMetrics, redisAvailable, startServer, stopServer, type LimiterTrouble, type Started } from './lib/servers.js';
import {
  BODY, CONNECTIONS, DURATION, HEADERS, PATH, PIN, PROFILE, RATE_FRACTION, REDIS_URL, ROUNDS, THROUGHPUT_ONLY, VARIANTS, WARMUP, log, root, wanted, type Variant,
} from './lib/settings.js';

async function main(): Promise<void> {
  const started = Date.now();
  mkdirSync(join(root, '.bench'), { recursive: true });
  const withRedis = await redisAvailable(REDIS_URL);
  if (!withRedis) log(`bench: no Redis at ${REDIS_URL}; the keyward-redis variants are skipped`);
  log(`bench: node ${process.version}, ${cpus().length} CPUs, ${CONNECTIONS} connections, ${ROUNDS} rounds x ${DURATION} s${PIN ? ', pinned' : ''}`);

  const upstream = await startServer('upstream', [], { cpu: 0 });
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
  const servers: Partial<Record<Variant, Started>> = {};
  servers.bare = await startServer('bare', [upstreamUrl], { cpu: 1, profile: PROFILE });
  servers.keyward = await startServer('keyward', [upstreamUrl, 'memory'], { cpu: 1, profile: PROFILE });
  if (withRedis && wanted('keyward-redis')) servers['keyward-redis'] = await startServer('keyward', [upstreamUrl, 'redis', REDIS_URL], { cpu: 1, profile: PROFILE });
  if (withRedis && wanted('keyward-redis-budgets')) servers['keyward-redis-budgets'] = await startServer('keyward', [upstreamUrl, 'redis-budgets', REDIS_URL], { cpu: 1, profile: PROFILE });
  if (withRedis && wanted('keyward-redis-w2')) servers['keyward-redis-w2'] = await startServer('keyward', [upstreamUrl, 'redis', REDIS_URL, '2']);
  const ports: Partial<Record<Variant, number>> = { direct: upstream.port };
  const pids: Partial<Record<Variant, number>> = { direct: upstream.child.pid };
  for (const [v, s] of Object.entries(servers) as [Variant, Started][]) {
    ports[v] = s.port;
    pids[v] = s.child.pid;
  }
  const variants = VARIANTS.filter((v) => ports[v] !== undefined && (v === 'bare' || wanted(v)));
  if (PIN) spawnSync('taskset', ['-p', '-c', '0', String(process.pid)]);

  // Sanity: every variant answers 200 to the benchmark request before anything is timed.
  for (const v of variants) {
    const res = await fetch(`http://127.0.0.1:${ports[v]}${PATH}`, { method: 'POST', headers: HEADERS, body: BODY });
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`${v} answered ${res.status} to the benchmark request`);
  }

  // ---- throughput
  for (const v of variants) {
    log(`warm-up ${v} (${WARMUP} s)`);
    await throughput(ports[v]!, WARMUP);
  }
  const tp: Record<string, Throughput[]> = Object.fromEntries(variants.map((v) => [v, []]));
  for (let round = 0; round < ROUNDS; round++) {
    const order = variants.map((_, i) => variants[(i + round) % variants.length]!);
    for (const v of order) {
      const r = await throughput(ports[v]!, DURATION, pids[v]);
      tp[v]!.push(r);
      log(`round ${round + 1}/${ROUNDS} ${pad(v, 22)} ${lpad(f(r.rps), 7)} req/s  ${lpad(f(r.cpuUsPerRequest), 4)} µs CPU/req  p50 ${ms(r.p50)}  p99 ${ms(r.p99)}${r.non2xx || r.errors ? `  non2xx ${r.non2xx} errors ${r.errors}` : ''}`);
    }
  }
  const rps = Object.fromEntries(variants.map((v) => [v, median(tp[v]!.map((r) => r.rps))])) as Record<Variant, number>;
  const cpu = Object.fromEntries(variants.map((v) => [v, median(tp[v]!.map((r) => r.cpuUsPerRequest))])) as Record<Variant, number>;

  // ---- fixed-rate latency
  // Below saturation for every variant measured: a fraction of the slowest one's throughput
  // (half of bare's would overload a variant that reaches less than half of bare).
  const latVariants = variants.filter((v) => v !== 'direct' && !THROUGHPUT_ONLY.has(v));
  const slowest = latVariants.reduce((a, v) => (rps[v] < rps[a] ? v : a), 'bare' as Variant);
  const rate = Math.max(100, Math.round(rps[slowest] * RATE_FRACTION));
  const latRounds = Math.max(1, Math.min(ROUNDS, 3));
  const latDuration = Math.max(2, Math.min(DURATION, 4));
  const lat: Record<string, { cannon: Latency[]; paced: Latency[] }> = Object.fromEntries(latVariants.map((v) => [v, { cannon: [], paced: [] }]));
  for (const v of latVariants) await latencyPaced(ports[v]!, rate, 1); // warm the connections and code paths
  for (let round = 0; round < latRounds; round++) {
    const order = latVariants.map((_, i) => latVariants[(i + round) % latVariants.length]!);
    for (const v of order) {
      const c = await latencyCannon(ports[v]!, rate, latDuration);
      const p = await latencyPaced(ports[v]!, rate, latDuration);
      lat[v]!.cannon.push(c);
      lat[v]!.paced.push(p);
      log(`latency ${round + 1}/${latRounds} ${pad(v, 22)} @${rate}/s  autocannon -R p50 ${ms(c.p50)} p99 ${ms(c.p99)}  |  paced p50 ${ms(p.p50)} p99 ${ms(p.p99)}`);
    }
  }

  // ---- Redis trouble during the run: admissions that fell back to the in-process limiter
  // were not measured with Redis, so the figures of that variant say so (read from each
  // keyward's admin /metrics; for keyward-redis-w2, the sum over its workers).
  const limiterTrouble: Partial<Record<Variant, LimiterTrouble>> = {};
  for (const [v, s] of Object.entries(servers) as [Variant, Started][]) {
    if (!v.startsWith('keyward')) continue;
    const t = await readMetrics(s);
    if (t) limiterTrouble[v] = t;
  }

  // ---- stop children (profiles are written on exit; a keyward writes its limiter stats)
  await Promise.all([...Object.values(servers), upstream].map(stopServer));
  for (const [v, t] of Object.entries(limiterTrouble) as [Variant, LimiterTrouble][]) t.failOpenHolds = failOpenHoldsAtExit(servers[v]!);
  const redisTimeoutMs = Object.values(servers).map((s) => s.info.redisTimeoutMs).find((t): t is number => typeof t === 'number') ?? null;

  report({ started, withRedis, variants, tp, rps, cpu, latVariants, slowest, rate, latRounds, latDuration, lat, limiterTrouble, redisTimeoutMs });
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    killChildren();
    process.exit(1);
  },
);

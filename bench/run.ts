/**
 * Side-by-side benchmark (`npm run bench`): the same chat request, the same upstream,
 * several ways, in one run on one machine, measured as an outside harness measures it.
 *
 * Variants:
 *   direct                 straight to the upstream (the ceiling of this machine)
 *   bare                   http-proxy-3 through its public API with keyward's agent settings
 *   keyward                keyward, no limits on the key (personal key, in-process limiter)
 *   keyward-redis          Redis limits: a personal key drawing on its wallet, limits far from exhausted
 *   keyward-redis-budgets  Redis limits and money: a team key with a key budget in a project
 *                          with a budget, a priced model (bench/servers/keyward.ts has both)
 *   keyward-redis-w2       keyward-redis as `serve --workers 2`
 * Generators: wrk (-t1 -c32, a process of its own, what outside harnesses run; `apt-get
 * install wrk` if missing, the run then has the autocannon figures only) and autocannon (in
 * this process). Bodies: chat-1k (system + user message, about 1 KB: the main column) and
 * small (about 100 B).
 *
 * How to read the output:
 *   - "ratio to bare" is the median, over rounds, of each round's req/s over the bare round
 *     beside it (same generator, same body): rounds are interleaved, the order rotated, so
 *     drift on a shared machine hits both sides.
 *   - CPU µs/req is per 2xx response, for EVERY process: proxy (all its processes for
 *     workers), Redis, upstream, generator (wrk's process; for autocannon, this process).
 *     On a 2-core machine they all share the cores: "cores ours" near 2 means the run is
 *     CPU-bound, and then req/s ≈ 2e6 / total µs, so a ratio is a ratio of total CPU.
 *     "machine" above "ours" is other work on the machine: the figures are noisy.
 *   - latency: p50/p99 at one fixed, evenly paced rate (half of bare's throughput), from
 *     each request's scheduled time; "added" is over bare. A variant whose throughput is
 *     below that rate is marked: its latency is queueing.
 * Why the bench and an outside wrk disagreed: bench/gap.ts (run delay and Redis per request).
 *
 * Environment:
 *   BENCH_ROUNDS (3), BENCH_DURATION (5 s), BENCH_WARMUP (3 s), BENCH_CONNECTIONS (32),
 *   BENCH_WRK_THREADS (1), BENCH_RATE_FRACTION (0.5),
 *   BENCH_GENERATORS (wrk,autocannon), BENCH_BODIES (chat-1k,small): the first of each is the main one
 *   BENCH_VARIANTS   comma list, e.g. `keyward`: bare (the baseline) plus these only
 *   BENCH_REDIS_URL  a Redis to use; by default a private redis-server on a free port, so its CPU is ours alone
 *   BENCH_PROFILE=1  CPU profiles of the single-process servers in .bench/prof
 *   BENCH_PIN=1      servers under test on CPU 1, upstream and generators on CPU 0
 * Results: the tables on stdout, everything in .bench/results.json.
 * Modules: lib/settings.ts (environment, bodies, variants), lib/fleet.ts and lib/servers.ts
 * (children), lib/redis-server.ts, lib/wrk.ts, lib/measure.ts and lib/procstat.ts (rounds,
 * CPU), lib/report.ts (tables and JSON).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { checkAnswers, partiesOf, portOf, startFleet, stopFleet, type Fleet } from './lib/fleet.js';
import { latencyPaced, measureRound, median, type Latency, type Round } from './lib/measure.js';
import { redisUnderTest } from './lib/redis-server.js';
import { cellKey, f, lpad, ms, pad, report, type Cell } from './lib/report.js';
import { runMain } from './lib/servers.js';
import { BODIES, BODY_NAMES, CONNECTIONS, DURATION, GENERATORS, PIN, PROFILE, RATE_FRACTION, ROUNDS, WARMUP, log, root, wanted, type Variant } from './lib/settings.js';
import { wrkAvailable } from './lib/wrk.js';

function cellsToRun(): Cell[] {
  const hasWrk = wrkAvailable();
  if (!hasWrk && GENERATORS.includes('wrk')) log('bench: wrk not found (`apt-get install wrk`, Debian package wrk): autocannon figures only');
  const generators = GENERATORS.filter((g) => g !== 'wrk' || hasWrk);
  if (generators.length === 0 || BODY_NAMES.length === 0) throw new Error('nothing to run: BENCH_GENERATORS or BENCH_BODIES selects nothing available');
  return BODY_NAMES.flatMap((body) => generators.map((generator) => ({ generator, body })));
}

/** ROUNDS rounds per cell and variant; within a round, each cell's variants in an order rotated by one. */
async function throughputRounds(fleet: Fleet, cells: Cell[]): Promise<Record<string, Partial<Record<Variant, Round[]>>>> {
  const { variants } = fleet;
  const main = cells[0]!;
  for (const v of variants) {
    log(`warm-up ${v} (${WARMUP} s)`);
    await measureRound({ generator: main.generator, port: portOf(fleet, v), body: BODIES[main.body], duration: WARMUP, parties: partiesOf(fleet, v) });
  }
  const rounds: Record<string, Partial<Record<Variant, Round[]>>> = {};
  for (let round = 0; round < ROUNDS; round++) {
    for (const cell of cells) {
      const byVariant = (rounds[cellKey(cell)] ??= {});
      const order = variants.map((_, i) => variants[(i + round) % variants.length]!);
      for (const v of order) {
        const r = await measureRound({ generator: cell.generator, port: portOf(fleet, v), body: BODIES[cell.body], duration: DURATION, parties: partiesOf(fleet, v) });
        (byVariant[v] ??= []).push(r);
        log(
          `round ${round + 1}/${ROUNDS} ${pad(cellKey(cell), 19)} ${pad(v, 22)} ${lpad(f(r.rps), 6)} req/s  µs/req proxy ${f(r.cpu.proxy ?? NaN)} redis ${f(r.cpu.redis ?? NaN)} ` +
            `upstream ${f(r.cpu.upstream)} gen ${f(r.cpu.generator)}  cores ${f(r.cores.ours, 2)}/${f(r.cores.machine, 2)}${r.non2xx || r.errors ? `  non2xx ${r.non2xx} errors ${r.errors}` : ''}`,
        );
      }
    }
  }
  return rounds;
}

/** Fixed-rate latency, main body, every proxy variant; rounds interleaved like the throughput rounds. */
async function latencyRounds(fleet: Fleet, rate: number, body: string): Promise<{ variants: Variant[]; rounds: number; duration: number; lat: Partial<Record<Variant, Latency[]>> }> {
  const variants = fleet.variants.filter((v) => v !== 'direct');
  const rounds = Math.max(1, Math.min(ROUNDS, 3));
  const duration = Math.max(2, Math.min(DURATION, 4));
  const lat: Partial<Record<Variant, Latency[]>> = {};
  for (const v of variants) await latencyPaced(portOf(fleet, v), rate, 1, body); // warm the connections
  for (let round = 0; round < rounds; round++) {
    for (const v of variants.map((_, i) => variants[(i + round) % variants.length]!)) {
      const l = await latencyPaced(portOf(fleet, v), rate, duration, body);
      (lat[v] ??= []).push(l);
      log(`latency ${round + 1}/${rounds} ${pad(v, 22)} @${rate}/s  paced p50 ${ms(l.p50)} p99 ${ms(l.p99)}`);
    }
  }
  return { variants, rounds, duration, lat };
}

async function main(): Promise<void> {
  const started = Date.now();
  mkdirSync(join(root, '.bench'), { recursive: true });
  const cells = cellsToRun();
  const redis = await redisUnderTest();
  if (!redis) log('bench: no Redis (no redis-server, none at BENCH_REDIS_URL): the keyward-redis variants are skipped');
  log(`bench: node ${process.version}, ${cpus().length} CPUs, ${CONNECTIONS} connections, ${ROUNDS} rounds x ${DURATION} s, ${cells.map(cellKey).join(', ')}${PIN ? ', pinned' : ''}`);
  // direct always runs: the machine's ceiling beside bare
  const fleet = await startFleet({ redis, want: (v) => v === 'direct' || wanted(v), profile: PROFILE });
  if (PIN) spawnSync('taskset', ['-p', '-c', '0', String(process.pid)]);
  await checkAnswers(fleet, cells.map((c) => BODIES[c.body]));

  const tp = await throughputRounds(fleet, cells);
  const main = cells[0]!;
  const bareRps = median(tp[cellKey(main)]!.bare!.map((r) => r.rps));
  const rate = Math.max(100, Math.round(bareRps * RATE_FRACTION));
  const latency = await latencyRounds(fleet, rate, BODIES[main.body]);
  const trouble = await stopFleet(fleet);

  report({ started, cells, variants: fleet.variants, tp, rate, rateBasis: `${RATE_FRACTION * 100}% of bare's ${cellKey(main)} throughput`, latency, trouble, redis: redis ? { url: redis.url, own: redis.own, viaProc: redis.pid !== null } : null, redisTimeoutMs: redisTimeoutOf(fleet) });
}

const redisTimeoutOf = (fleet: Fleet): number | null =>
  Object.values(fleet.servers).map((s) => s.info.redisTimeoutMs).find((t): t is number => typeof t === 'number') ?? null;

runMain('bench', main);

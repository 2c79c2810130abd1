/**
 * The benchmark's report: the table on stdout and .bench/results.json. Pure formatting of
 * what bench/run.ts measured, apart from writing the file.
 */
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { median, type Latency, type Throughput } from './measure.js';
import type { LimiterTrouble } from './servers.js';
import { BODY, CONNECTIONS, DURATION, PATH, PIN, PROFILE, RATE_CONNECTIONS, RATE_FRACTION, REDIS_URL, ROUNDS, VARIANTS, WARMUP, root, type Variant } from './settings.js';

export interface RunResults {
  /** Date.now() at the start */
  started: number;
  withRedis: boolean;
  /** the variants measured for throughput, in VARIANTS order */
  variants: Variant[];
  tp: Record<string, Throughput[]>;
  rps: Record<Variant, number>;
  cpu: Record<Variant, number>;
  /** the variants measured at a fixed rate */
  latVariants: Variant[];
  slowest: Variant;
  rate: number;
  latRounds: number;
  latDuration: number;
  lat: Record<string, { cannon: Latency[]; paced: Latency[] }>;
  limiterTrouble: Partial<Record<Variant, LimiterTrouble>>;
  /** redis.timeoutMs of the Redis variants, as they reported it */
  redisTimeoutMs: number | null;
}

export const f = (n: number, digits = 0): string => (Number.isFinite(n) ? n.toFixed(digits) : 'n/a');
export const ms = (n: number): string => (Number.isFinite(n) ? `${n.toFixed(3)} ms` : 'n/a');
export const pad = (s: string, n: number): string => s.padEnd(n);
export const lpad = (s: string, n: number): string => s.padStart(n);

/** Admissions or holds that went to the in-process fallback: that variant's figures are not all Redis. */
const fellBack = (t: LimiterTrouble | undefined): boolean => !!t && (t.failOpen > 0 || (t.failOpenHolds ?? 0) > 0);

export function report(r: RunResults): void {
  const { variants, tp, rps, cpu, latVariants, slowest, rate, latRounds, latDuration, lat, limiterTrouble } = r;
  const latSummary = (v: Variant, kind: 'cannon' | 'paced') => ({
    p50: median(lat[v]![kind].map((x) => x.p50)),
    p99: median(lat[v]![kind].map((x) => x.p99)),
    achieved: median(lat[v]![kind].map((x) => x.achieved)),
    non2xx: lat[v]![kind].reduce((a, x) => a + x.non2xx, 0),
    errors: lat[v]![kind].reduce((a, x) => a + x.errors, 0),
  });
  // Issue #11's targets: every keyward variant at 0.90 of bare or better; at a fixed rate
  // below saturation, evenly paced, at most 0.3 ms added at p50 and 2 ms at p99.
  const targets = { overBare: 0.9, addedP50Ms: 0.3, addedP99Ms: 2 };
  const ratio = (v: Variant) => (rps[v] ?? NaN) / rps.bare;
  const latency = Object.fromEntries(
    latVariants.map((v) => [v, { autocannonR: latSummary(v, 'cannon'), paced: latSummary(v, 'paced') }]),
  ) as Record<Variant, { autocannonR: ReturnType<typeof latSummary>; paced: ReturnType<typeof latSummary> }>;
  const added = (v: Variant, kind: 'autocannonR' | 'paced') =>
    latency[v] ? { p50: latency[v][kind].p50 - latency.bare[kind].p50, p99: latency[v][kind].p99 - latency.bare[kind].p99 } : null;
  const check = (ok: boolean) => (ok ? 'ok' : 'MISSED');

  const out: string[] = [];
  out.push('');
  out.push(`keyward benchmark — node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), POST ${PATH} (${Buffer.byteLength(BODY)} B body)`);
  out.push(`throughput: autocannon, ${CONNECTIONS} keep-alive connections, warm-up ${WARMUP} s, median of ${ROUNDS} interleaved rounds x ${DURATION} s${PIN ? '; servers pinned to CPU 1' : ''}`);
  out.push('');
  out.push(`${pad('variant', 23)}${lpad('req/s (median)', 15)}${lpad('rounds', 26)}${lpad('vs bare', 10)}${lpad('target', 9)}${lpad('', 8)}${lpad('server CPU µs/req', 19)}`);
  for (const v of VARIANTS.filter((x) => variants.includes(x))) {
    // a space before the list: with five or more rounds it is wider than its column
    const rounds = ` ${tp[v]!.map((x) => f(x.rps)).join(' / ')}`;
    const target = v.startsWith('keyward') ? targets.overBare : null;
    const name = fellBack(limiterTrouble[v]) ? `${v} !` : v;
    out.push(
      `${pad(name, 23)}${lpad(f(rps[v]), 15)}${lpad(rounds, 26)}${lpad(f(ratio(v), 3), 10)}${lpad(target === null ? '' : `≥ ${target}`, 9)}${lpad(target === null ? '' : check(ratio(v) >= target), 8)}${lpad(f(cpu[v]), 19)}`,
    );
  }
  out.push('  (server CPU: user+system time of the server process under test per 2xx response, median of rounds; direct = the upstream alone;');
  out.push('   keyward-redis-w2: primary and both workers together. This machine has 2 cores: the load generator, the upstream and Redis compete with the workers)');
  if (variants.some((v) => fellBack(limiterTrouble[v]))) out.push('  ! part of this variant\'s requests went to the in-process fallback, not Redis: its figures are flattered (counts below)');
  out.push('');
  out.push(`fixed-rate latency at ${rate} req/s (${RATE_FRACTION * 100}% of ${slowest}, the slowest variant; ${f((100 * rate) / rps.bare)}% of bare), median of ${latRounds} rounds x ${latDuration} s, full-resolution timings`);
  out.push(`  autocannon -R: ${RATE_CONNECTIONS} connections, each sends its per-second quota back to back (bursty)`);
  out.push('  paced: open loop, evenly spaced, latency from the scheduled send time');
  out.push('');
  out.push(`${pad('variant', 23)}${lpad('-R p50', 11)}${lpad('-R p99', 11)}${lpad('paced p50', 11)}${lpad('paced p99', 11)}${lpad('added p50 (-R/paced)', 24)}${lpad('added p99 (-R/paced)', 24)}`);
  for (const v of latVariants) {
    const l = latency[v];
    const a = added(v, 'autocannonR');
    const p = added(v, 'paced');
    const addedCell = (x: number | undefined, y: number | undefined) => (v === 'bare' ? '—' : `${f(x ?? NaN, 3)} / ${f(y ?? NaN, 3)}`);
    out.push(
      `${pad(v, 23)}${lpad(f(l.autocannonR.p50, 3), 11)}${lpad(f(l.autocannonR.p99, 3), 11)}${lpad(f(l.paced.p50, 3), 11)}${lpad(f(l.paced.p99, 3), 11)}` +
        `${lpad(addedCell(a?.p50, p?.p50), 24)}${lpad(addedCell(a?.p99, p?.p99), 24)}`,
    );
  }
  out.push('  (ms)');
  out.push('');
  for (const v of latVariants.filter((x) => x !== 'bare')) {
    const p = added(v, 'paced')!;
    const a = added(v, 'autocannonR')!;
    out.push(
      `${pad(v, 23)} added p50 ≤ ${targets.addedP50Ms} ms: paced ${check(p.p50 <= targets.addedP50Ms)} (-R ${check(a.p50 <= targets.addedP50Ms)});` +
        `  added p99 ≤ ${targets.addedP99Ms} ms: paced ${check(p.p99 <= targets.addedP99Ms)} (-R ${check(a.p99 <= targets.addedP99Ms)})`,
    );
  }
  out.push(...troubleLines(limiterTrouble, r.redisTimeoutMs));
  const problems = variants.flatMap((v) => tp[v]!.filter((x) => x.non2xx || x.errors).map((x) => `${v}: ${x.non2xx} non-2xx, ${x.errors} errors`));
  for (const v of latVariants) for (const k of ['autocannonR', 'paced'] as const) if (latency[v][k].non2xx || latency[v][k].errors) problems.push(`${v} ${k}: ${latency[v][k].non2xx} non-2xx, ${latency[v][k].errors} errors`);
  if (problems.length) out.push('', `non-2xx or errors: ${problems.join('; ')}`);
  const seconds = (Date.now() - r.started) / 1000;
  out.push('', `took ${f(seconds)} s; JSON in .bench/results.json${PROFILE ? '; CPU profiles in .bench/prof' : ''}`);
  process.stdout.write(`${out.join('\n')}\n`);

  writeFileSync(
    join(root, '.bench', 'results.json'),
    `${JSON.stringify(
      {
        at: new Date().toISOString(),
        node: process.version,
        cpus: cpus().length,
        settings: { rounds: ROUNDS, durationS: DURATION, warmupS: WARMUP, connections: CONNECTIONS, rateConnections: RATE_CONNECTIONS, rateFraction: RATE_FRACTION, pinned: PIN, redis: r.withRedis ? REDIS_URL : null, redisTimeoutMs: r.redisTimeoutMs },
        request: { method: 'POST', path: PATH, bodyBytes: Buffer.byteLength(BODY) },
        throughput: Object.fromEntries(variants.map((v) => [v, { medianRps: rps[v], medianCpuUsPerRequest: cpu[v], rounds: tp[v] }])),
        ratios: {
          keywardOverBare: ratio('keyward'),
          redisOverBare: variants.includes('keyward-redis') ? ratio('keyward-redis') : null,
          redisBudgetsOverBare: variants.includes('keyward-redis-budgets') ? ratio('keyward-redis-budgets') : null,
          redisTwoWorkersOverBare: variants.includes('keyward-redis-w2') ? ratio('keyward-redis-w2') : null,
        },
        latency: { rate, rateBasis: slowest, rounds: latRounds, durationS: latDuration, ...latency },
        added: Object.fromEntries(latVariants.filter((v) => v !== 'bare').map((v) => [v, { autocannonR: added(v, 'autocannonR'), paced: added(v, 'paced') }])),
        targets,
        limiterTrouble,
        seconds,
      },
      null,
      2,
    )}\n`,
  );
}

/**
 * Redis trouble per Redis variant, printed whether or not there was any, so a run whose
 * requests partly went to the in-process fallback (`onError: open`) says so next to its figures.
 */
function troubleLines(trouble: Partial<Record<Variant, LimiterTrouble>>, timeoutMs: number | null): string[] {
  const entries = (Object.entries(trouble) as [Variant, LimiterTrouble][]).filter(([v]) => v.startsWith('keyward-redis'));
  if (entries.length === 0) return [];
  const out = ['', `Redis during the run (redis.timeoutMs ${timeoutMs ?? '?'}, onError: open; /metrics, and the limiter's stats at exit for spend holds):`];
  for (const [v, t] of entries) {
    const holds = t.failOpenHolds === null ? 'spend holds in process: not reported (workers)' : `${t.failOpenHolds} spend holds taken by the in-process ledger`;
    const note = fellBack(t)
      ? '  <- FALLBACK: these requests were not measured with Redis'
      : t.redisErrors > 0 && t.failOpenHolds === 0
        ? '  (nothing fell back: failed settlements or lease refreshes)'
        : '';
    out.push(`${pad(v, 23)}${t.redisErrors} Redis errors or timeouts, ${t.failOpen} requests admitted by the in-process fallback, ${holds}${note}`);
  }
  return out;
}

/**
 * The benchmark's report: the tables on stdout and .bench/results.json. Pure formatting of
 * what bench/run.ts measured, apart from writing the file.
 */
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { median, type Latency, type Round } from './measure.js';
import type { LimiterTrouble } from './servers.js';
import { BODIES, CONNECTIONS, DURATION, PATH, PIN, PROFILE, RATE_FRACTION, ROUNDS, WARMUP, WRK_THREADS, root, type BodyName, type Generator, type Variant } from './settings.js';

/** One column of the run: a generator and a body. */
export interface Cell {
  generator: Generator;
  body: BodyName;
}
export const cellKey = (c: Cell): string => `${c.generator} ${c.body}`;

export interface RunResults {
  /** Date.now() at the start */
  started: number;
  /** the main one first */
  cells: Cell[];
  variants: Variant[];
  /** per cell key, per variant, the rounds in the order they ran */
  tp: Record<string, Partial<Record<Variant, Round[]>>>;
  rate: number;
  rateBasis: string;
  latency: { variants: Variant[]; rounds: number; duration: number; lat: Partial<Record<Variant, Latency[]>> };
  trouble: Partial<Record<Variant, LimiterTrouble>>;
  redis: { url: string; own: boolean; viaProc: boolean } | null;
  redisTimeoutMs: number | null;
}

export const f = (n: number, digits = 0): string => (Number.isFinite(n) ? n.toFixed(digits) : 'n/a');
export const ms = (n: number): string => (Number.isFinite(n) ? `${n.toFixed(3)} ms` : 'n/a');
export const pad = (s: string, n: number): string => s.padEnd(n);
export const lpad = (s: string, n: number): string => s.padStart(n);
/** a CPU figure: '—' where the process is not part of the variant */
const us = (n: number | null): string => (n === null ? '—' : f(n));

/** Admissions or holds that went to the in-process fallback: that variant's figures are not all Redis. */
const fellBack = (t: LimiterTrouble | undefined): boolean => !!t && (t.failOpen > 0 || (t.failOpenHolds ?? 0) > 0);

type CpuKey = 'proxy' | 'redis' | 'upstream' | 'generator' | 'total';
const CPU_KEYS: CpuKey[] = ['proxy', 'redis', 'upstream', 'generator', 'total'];

/** Medians over one variant's rounds in one cell, and its ratio to the bare round beside each. */
function summarise(rounds: Round[], bare: Round[]) {
  const m = (pick: (r: Round) => number | null) => (rounds.every((r) => pick(r) === null) ? null : median(rounds.map((r) => pick(r) ?? NaN)));
  return {
    rps: median(rounds.map((r) => r.rps)),
    ratio: median(rounds.map((r, i) => r.rps / (bare[i]?.rps ?? NaN))),
    cpu: Object.fromEntries(CPU_KEYS.map((k) => [k, m((r) => r.cpu[k])])) as Record<CpuKey, number | null>,
    cores: { ours: median(rounds.map((r) => r.cores.ours)), machine: median(rounds.map((r) => r.cores.machine)) },
    p50: median(rounds.map((r) => r.p50)),
    p99: median(rounds.map((r) => r.p99)),
    non2xx: rounds.reduce((a, r) => a + r.non2xx, 0),
    errors: rounds.reduce((a, r) => a + r.errors, 0),
  };
}
type Summary = ReturnType<typeof summarise>;

function summaries(r: RunResults): Record<string, Partial<Record<Variant, Summary>>> {
  return Object.fromEntries(
    r.cells.map((c) => {
      const cell = r.tp[cellKey(c)]!;
      return [cellKey(c), Object.fromEntries(r.variants.map((v) => [v, summarise(cell[v]!, cell.bare!)]))];
    }),
  );
}

function ratioTable(r: RunResults, s: Record<string, Partial<Record<Variant, Summary>>>, name: (v: Variant) => string): string[] {
  const out = [`req/s and ratio to bare (median of per-round ratios), ${ROUNDS} interleaved rounds x ${DURATION} s`, ''];
  out.push(`${pad('variant', 24)}${r.cells.map((c) => lpad(cellKey(c), 22)).join('')}`);
  for (const v of r.variants) out.push(`${pad(name(v), 24)}${r.cells.map((c) => lpad(`${f(s[cellKey(c)]![v]!.rps)}  ${f(s[cellKey(c)]![v]!.ratio, 3)}`, 22)).join('')}`);
  return out;
}

function cellTable(c: Cell, s: Partial<Record<Variant, Summary>>, variants: Variant[], name: (v: Variant) => string): string[] {
  const gen = c.generator === 'wrk' ? `wrk -t${WRK_THREADS} -c${CONNECTIONS}` : `autocannon -c${CONNECTIONS} (in the bench process)`;
  const out = ['', `${cellKey(c)}: ${gen}, ${Buffer.byteLength(BODIES[c.body])} B body; CPU in µs per 2xx response`];
  out.push(`${pad('variant', 24)}${lpad('req/s', 8)}${lpad('x bare', 8)}${lpad('proxy', 8)}${lpad('redis', 8)}${lpad('upstr', 8)}${lpad('gen', 8)}${lpad('total', 8)}${lpad('cores ours/machine', 20)}${lpad('p50 ms', 9)}${lpad('p99 ms', 9)}`);
  for (const v of variants) {
    const x = s[v]!;
    out.push(
      `${pad(name(v), 24)}${lpad(f(x.rps), 8)}${lpad(f(x.ratio, 3), 8)}${CPU_KEYS.map((k) => lpad(us(x.cpu[k]), 8)).join('')}` +
        `${lpad(`${f(x.cores.ours, 2)} / ${f(x.cores.machine, 2)}`, 20)}${lpad(f(x.p50, 2), 9)}${lpad(f(x.p99, 2), 9)}${x.non2xx || x.errors ? `  non2xx ${x.non2xx} errors ${x.errors}` : ''}`,
    );
  }
  return out;
}

/** Below `rate` in any cell with the latency body: the paced run of that variant measures a queue. */
function overSaturation(r: RunResults, s: Record<string, Partial<Record<Variant, Summary>>>, v: Variant): boolean {
  return r.cells.filter((c) => c.body === r.cells[0]!.body).some((c) => (s[cellKey(c)]![v]?.rps ?? Infinity) < r.rate);
}

function latencySummary(r: RunResults, s: Record<string, Partial<Record<Variant, Summary>>>) {
  const l = r.latency;
  const sum = (v: Variant) => {
    const xs = l.lat[v]!;
    return { p50: median(xs.map((x) => x.p50)), p99: median(xs.map((x) => x.p99)), achieved: median(xs.map((x) => x.achieved)), non2xx: xs.reduce((a, x) => a + x.non2xx, 0), errors: xs.reduce((a, x) => a + x.errors, 0) };
  };
  const by = Object.fromEntries(l.variants.map((v) => [v, sum(v)])) as Record<Variant, ReturnType<typeof sum>>;
  return Object.fromEntries(
    l.variants.map((v) => [v, { ...by[v], addedP50: by[v].p50 - by.bare.p50, addedP99: by[v].p99 - by.bare.p99, overSaturation: overSaturation(r, s, v) }]),
  ) as Record<Variant, ReturnType<typeof sum> & { addedP50: number; addedP99: number; overSaturation: boolean }>;
}

function latencyTable(r: RunResults, lat: ReturnType<typeof latencySummary>, name: (v: Variant) => string): string[] {
  const out = ['', `latency at ${r.rate} req/s, evenly paced (${r.rateBasis}), ${r.cells[0]!.body} body, median of ${r.latency.rounds} rounds x ${r.latency.duration} s (ms)`];
  out.push(`${pad('variant', 24)}${lpad('p50', 9)}${lpad('p99', 9)}${lpad('added p50', 11)}${lpad('added p99', 11)}`);
  for (const v of r.latency.variants) {
    const x = lat[v];
    const added = (n: number) => (v === 'bare' ? '—' : f(n, 3));
    const notes = [x.overSaturation ? 'rate above its throughput in a cell: queueing' : '', x.non2xx || x.errors ? `non2xx ${x.non2xx} errors ${x.errors}` : ''].filter(Boolean).join('; ');
    out.push(`${pad(name(v), 24)}${lpad(f(x.p50, 3), 9)}${lpad(f(x.p99, 3), 9)}${lpad(added(x.addedP50), 11)}${lpad(added(x.addedP99), 11)}${notes ? `  ${notes}` : ''}`);
  }
  return out;
}

// Issue #11's targets: every keyward variant at 0.90 of bare or better; at a fixed rate
// below saturation, evenly paced, at most 0.3 ms added at p50 and 2 ms at p99.
const TARGETS = { overBare: 0.9, addedP50Ms: 0.3, addedP99Ms: 2 };

function targetLines(r: RunResults, main: Partial<Record<Variant, Summary>>, lat: ReturnType<typeof latencySummary>): string[] {
  const check = (ok: boolean) => (ok ? 'ok' : 'MISSED');
  const out = ['', `targets (${cellKey(r.cells[0]!)}): ratio >= ${TARGETS.overBare}, added p50 <= ${TARGETS.addedP50Ms} ms, added p99 <= ${TARGETS.addedP99Ms} ms`];
  for (const v of r.variants.filter((x) => x.startsWith('keyward'))) {
    const l = lat[v];
    out.push(`${pad(v, 24)}ratio ${check(main[v]!.ratio >= TARGETS.overBare)}, p50 ${l ? check(l.addedP50 <= TARGETS.addedP50Ms) : 'n/a'}, p99 ${l ? check(l.addedP99 <= TARGETS.addedP99Ms) : 'n/a'}`);
  }
  return out;
}

export function report(r: RunResults): void {
  const s = summaries(r);
  const main = s[cellKey(r.cells[0]!)]!;
  const lat = latencySummary(r, s);
  const name = (v: Variant) => (fellBack(r.trouble[v]) ? `${v} !` : v);
  const bodies = [...new Set(r.cells.map((c) => c.body))].map((b) => `${b} ${Buffer.byteLength(BODIES[b])} B`).join(', ');
  const redis = r.redis ? `${r.redis.own ? 'private redis-server' : r.redis.url} (CPU from ${r.redis.viaProc ? '/proc' : 'INFO cpu'})` : 'none';
  const out = [
    '',
    `keyward benchmark — node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), POST ${PATH}; bodies ${bodies}; Redis: ${redis}${PIN ? '; servers pinned to CPU 1' : ''}`,
    `${CONNECTIONS} keep-alive connections, warm-up ${WARMUP} s per variant`,
    '',
    ...ratioTable(r, s, name),
    ...r.cells.flatMap((c) => cellTable(c, s[cellKey(c)]!, r.variants, name)),
    '  (proxy: all processes of the variant, — for direct; gen: wrk\'s process, or for autocannon the bench process;',
    '   cores: CPU time per wall second, ours = the processes above, machine = every process on it; p50/p99 at saturation)',
    ...latencyTable(r, lat, name),
    ...targetLines(r, main, lat),
    ...troubleLines(r.trouble, r.redisTimeoutMs),
  ];
  if (r.variants.some((v) => fellBack(r.trouble[v]))) out.push("  ! part of this variant's requests went to the in-process fallback, not Redis: its figures are flattered");
  const seconds = (Date.now() - r.started) / 1000;
  out.push('', `took ${f(seconds)} s; JSON in .bench/results.json${PROFILE ? '; CPU profiles in .bench/prof' : ''}`);
  process.stdout.write(`${out.join('\n')}\n`);
  writeJson(r, s, lat, seconds);
}

function writeJson(r: RunResults, s: Record<string, Partial<Record<Variant, Summary>>>, lat: ReturnType<typeof latencySummary>, seconds: number): void {
  const json = {
    at: new Date().toISOString(),
    node: process.version,
    cpus: cpus().length,
    settings: { rounds: ROUNDS, durationS: DURATION, warmupS: WARMUP, connections: CONNECTIONS, wrkThreads: WRK_THREADS, rateFraction: RATE_FRACTION, pinned: PIN, redis: r.redis, redisTimeoutMs: r.redisTimeoutMs },
    request: { method: 'POST', path: PATH, bodyBytes: Object.fromEntries(Object.entries(BODIES).map(([k, b]) => [k, Buffer.byteLength(b)])) },
    cells: r.cells.map(cellKey),
    summary: s,
    rounds: r.tp,
    latency: { rate: r.rate, basis: r.rateBasis, rounds: r.latency.rounds, durationS: r.latency.duration, body: r.cells[0]!.body, summary: lat, runs: r.latency.lat },
    targets: TARGETS,
    limiterTrouble: r.trouble,
    seconds,
  };
  writeFileSync(join(root, '.bench', 'results.json'), `${JSON.stringify(json, null, 2)}\n`);
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

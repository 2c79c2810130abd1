/**
 * Instructions per request, counted by callgrind: a figure that does not move with the
 * machine's speed, for comparing a change on a shared machine whose CPU time per request
 * drifts between runs. Each server runs under `valgrind --tool=callgrind` with counting off;
 * after a warm-up it counts exactly N requests of `npm run bench`'s small chat request, then stops.
 *   npx tsx bench/instructions.ts [bare,keyward,keyward-redis,...]
 * (also keyward-redis-budgets, and bare-agent, bare-lines, bare-agent-lines: the bare proxy
 * with keyward's upstream agent and/or its header-lines pass, what Node's client is handed)
 * Environment: BENCH_IR_REQUESTS (3000), BENCH_IR_WARMUP (20000: fewer leaves much of Node's and
 * keyward's code unoptimised, which a long-running proxy is not), BENCH_IR_CACHE=1 (callgrind's
 * cache simulation too, about twice as slow: first-level instruction and data misses and
 * last-level misses per request, on one core's own caches as on this machine's EPYC: 32 KB
 * instruction and 48 KB data caches, and its 1 MB second level as the last level, since the
 * shared third level is what other tenants of the host contend for).
 * BENCH_IR_JS=N: each server also runs with --perf-basic-prof, and the N generated-code
 * functions (JavaScript, by name) with the most instruction-fetch misses per request (the most
 * instructions without BENCH_IR_CACHE) are listed per variant (bench/lib/jit-names.ts).
 * What it counts: every instruction in user space of the server process (all its threads:
 * JIT code, V8's compiler and GC, libuv), not the kernel's socket work, which is about half
 * of a bare proxy's CPU time (see README, Performance). Work that runs per unit of time
 * (timers, lease refreshes, slices that end by the clock) is stretched by valgrind's
 * slowdown, so the Redis variants repeat less well than the in-process one (runs of the
 * same tree spread by about 3% in memory; more with Redis).
 * BENCH_IR_OTHER=<tree>: old against new, as bench/ab.ts does for CPU time: every variant is
 * counted in that checkout too (a git worktree with node_modules linked), the two trees
 * alternating, BENCH_IR_PAIRS (3) times each; the report gives each tree's median and the
 * difference. bare is the same code in both trees, so its difference is the runs' own spread.
 * Results: a table on stdout; callgrind's files in .bench/callgrind (callgrind_annotate).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { jsFunctions } from './lib/jit-names.js';
import { killChildren, redisAvailable, startServer, stopServer } from './lib/servers.js';
import { BODY, HEADERS, PATH, REDIS_URL, log, root } from './lib/settings.js';

const count = (name: string, fallback: number): number => (Number(process.env[name]) > 0 ? Number(process.env[name]) : fallback);
const REQUESTS = count('BENCH_IR_REQUESTS', 3000);
const WARMUP = count('BENCH_IR_WARMUP', 20000);
const CACHE = process.env.BENCH_IR_CACHE === '1';
const JS_TOP = count('BENCH_IR_JS', 0);
const OTHER = process.env.BENCH_IR_OTHER ? resolve(process.env.BENCH_IR_OTHER) : null;
const PAIRS = count('BENCH_IR_PAIRS', 3);

/** What one variant counted, per request: instructions, and with CACHE the simulated misses. */
interface Counts {
  ir: number;
  /** first-level instruction cache misses */
  i1?: number;
  /** first-level data cache misses, reads and writes */
  d1?: number;
  /** last-level misses, instructions and data */
  ll?: number;
}

/** callgrind's summary: its `events:` names against its `totals:` figures, per request. */
function countsOf(text: string): Counts | null {
  const names = /^events: (.+)$/m.exec(text)?.[1]?.trim().split(/\s+/);
  const totals = /^totals: (.+)$/m.exec(text)?.[1]?.trim().split(/\s+/).map(Number);
  if (!names || !totals) return null;
  const per = (name: string): number => (totals[names.indexOf(name)] ?? 0) / REQUESTS;
  if (!CACHE) return { ir: per('Ir') };
  return { ir: per('Ir'), i1: per('I1mr'), d1: per('D1mr') + per('D1mw'), ll: per('ILmr') + per('DLmr') + per('DLmw') };
}
const VARIANTS: Record<string, [string, ...string[]]> = {
  bare: ['bare'],
  // bare with keyward's upstream agent and its header-lines pass (bench/servers/bare.ts)
  'bare-agent': ['bare', '0', 'agent'],
  'bare-lines': ['bare', '0', 'lines'],
  'bare-agent-lines': ['bare', '0', 'agent,lines'],
  keyward: ['keyward', 'memory'],
  'keyward-redis': ['keyward', 'redis', REDIS_URL],
  'keyward-redis-budgets': ['keyward', 'redis-budgets', REDIS_URL],
};

/** Sends exactly `amount` requests, 16 at a time (a server under valgrind is slow: long timeouts). */
async function send(port: number, amount: number): Promise<void> {
  const r = await autocannon({ url: `http://127.0.0.1:${port}${PATH}`, method: 'POST', headers: HEADERS, body: BODY, connections: 16, amount, timeout: 60 });
  if (r['2xx'] !== amount) throw new Error(`${r['2xx']} of ${amount} requests answered 2xx`);
}

const control = (...args: string[]): void => {
  const r = spawnSync('callgrind_control', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`callgrind_control ${args.join(' ')}: ${r.stderr || r.stdout}`);
};

/** One variant counted once; `tree`: another checkout's copy of the server (BENCH_IR_OTHER). */
async function measure(variant: string, upstream: string, dir: string, tree?: string): Promise<Counts> {
  const [name, ...rest] = VARIANTS[variant]!;
  const label = tree ? `${variant}-other` : variant;
  const out = join(dir, `${label}.out`);
  const s = await startServer(name, [upstream, ...rest], {
    ...(tree ? { tree } : {}),
    nodeArgs: JS_TOP > 0 ? ['--perf-basic-prof'] : [],
    // --smc-check: V8 writes and rewrites machine code on the heap; counting starts switched off.
    wrap: ['valgrind', '-q', '--tool=callgrind', '--smc-check=all-non-file', '--instr-atstart=no', ...(CACHE ? ['--cache-sim=yes', '--I1=32768,8,64', '--D1=49152,12,64', '--LL=1048576,16,64'] : []), `--callgrind-out-file=${out}`],
  });
  try {
    await send(s.port, WARMUP);
    const pid = String(s.child.pid);
    control('-i', 'on', pid);
    await send(s.port, REQUESTS);
    control('-i', 'off', pid);
    control('-d', pid);
  } finally {
    await stopServer(s);
  }
  // The dump on request is `<out>.1` (parts are numbered); the exit writes `<out>` with nothing counted after.
  const file = readdirSync(dir).filter((f) => f.startsWith(`${label}.out.`)).sort().at(-1);
  const counts = file ? countsOf(readFileSync(join(dir, file), 'utf8')) : null;
  if (!counts) throw new Error(`no callgrind summary for ${variant}`);
  if (JS_TOP > 0) {
    reportJsFunctions(label, join(dir, file!), s.child.pid!);
    // --perf-basic-prof also has V8 write its own log beside the server: not ours to keep.
    for (const f of readdirSync(root)) if (new RegExp(`^isolate-0x[0-9a-f]+-${s.child.pid}-v8\\.log$`).test(f)) rmSync(join(root, f), { force: true });
  }
  return counts;
}

/** The generated-code functions that cost the most per request, by name (BENCH_IR_JS). */
function reportJsFunctions(variant: string, file: string, pid: number): void {
  const by = CACHE ? 'ILmr' : 'Ir';
  const fns = jsFunctions(file, pid, REQUESTS).sort((a, b) => (b.perRequest[by] ?? 0) - (a.perRequest[by] ?? 0));
  const total = (e: string): number => fns.reduce((a, f) => a + (f.perRequest[e] ?? 0), 0);
  const columns = CACHE ? ['Ir', 'I1mr', 'ILmr', 'DLmr'] : ['Ir'];
  const row = (figures: Record<string, number>): string => columns.map((e) => Math.round(figures[e] ?? 0).toLocaleString('en-US').padStart(10)).join('');
  process.stdout.write(`${variant}: generated code per request, by ${by}\n${columns.map((e) => e.padStart(10)).join('')}\n`);
  process.stdout.write(`${row(Object.fromEntries(columns.map((e) => [e, total(e)])))}  all generated code\n`);
  for (const f of fns.slice(0, JS_TOP)) process.stdout.write(`${row(f.perRequest)}  ${f.name}\n`);
}

/** BENCH_IR_OTHER: each variant in both trees, alternating, PAIRS times; medians and the difference. */
async function againstOther(variants: string[], url: string, dir: string): Promise<void> {
  const runs = new Map<string, { other: number[]; self: number[] }>(variants.map((v) => [v, { other: [], self: [] }]));
  for (let p = 0; p < PAIRS; p++) {
    for (const v of variants) {
      for (const side of p % 2 === 0 ? (['other', 'self'] as const) : (['self', 'other'] as const)) {
        log(`instructions: ${v}, ${side === 'other' ? OTHER : 'this tree'} (pair ${p + 1} of ${PAIRS})`);
        runs.get(v)![side].push((await measure(v, url, dir, side === 'other' ? OTHER! : undefined)).ir);
      }
    }
  }
  const med = (xs: number[]): number => {
    const s = [...xs].sort((a, b) => a - b);
    const h = Math.floor(s.length / 2);
    return s.length % 2 === 1 ? s[h]! : (s[h - 1]! + s[h]!) / 2;
  };
  const n = (x: number): string => Math.round(x).toLocaleString('en-US');
  process.stdout.write(`user-space instructions per request (callgrind, ${REQUESTS} requests after ${WARMUP}), ${PAIRS} alternating runs of each tree; other: ${OTHER}\n`);
  process.stdout.write(`${'variant'.padEnd(24)}${'other'.padStart(12)}${'this'.padStart(12)}${'difference'.padStart(12)}  runs (other; this)\n`);
  for (const [v, r] of runs) {
    const d = med(r.self) - med(r.other);
    process.stdout.write(`${v.padEnd(24)}${n(med(r.other)).padStart(12)}${n(med(r.self)).padStart(12)}${`${d >= 0 ? '+' : ''}${n(d)}`.padStart(12)}  ${r.other.map(n).join(', ')}; ${r.self.map(n).join(', ')}\n`);
  }
}

async function main(): Promise<void> {
  if (spawnSync('valgrind', ['--version']).status !== 0) throw new Error('valgrind is not installed (apt-get install valgrind)');
  const wanted = (process.argv[2] ?? 'bare,keyward,keyward-redis').split(',').filter((v) => v in VARIANTS);
  if (!wanted.includes('bare')) wanted.unshift('bare');
  const withRedis = await redisAvailable(REDIS_URL);
  const dir = join(root, '.bench', 'callgrind');
  mkdirSync(dir, { recursive: true });
  for (const f of readdirSync(dir)) if (f.includes('.out')) rmSync(join(dir, f), { force: true });
  const upstream = await startServer('upstream', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  if (OTHER) {
    await againstOther(wanted.filter((v) => !v.includes('redis') || withRedis), url, dir);
    return void (await stopServer(upstream));
  }
  const rows: [string, Counts][] = [];
  for (const v of wanted) {
    if (v.includes('redis') && !withRedis) {
      log(`instructions: no Redis at ${REDIS_URL}; ${v} skipped`);
      continue;
    }
    log(`instructions: ${v} (${WARMUP} warm-up, ${REQUESTS} counted requests under callgrind)`);
    rows.push([v, await measure(v, url, dir)]);
  }
  await stopServer(upstream);
  const bare = rows[0]![1];
  const cell = (n: number | undefined, of: number | undefined): string =>
    `${Math.round(n ?? 0).toLocaleString('en-US').padStart(12)} ${`(${((n ?? 0) / (of || 1)).toFixed(2)})`.padStart(7)}`;
  process.stdout.write(`user-space instructions per request (callgrind, ${REQUESTS} requests after ${WARMUP}); (x bare)\n`);
  if (CACHE) process.stdout.write(`${''.padEnd(24)}${'instructions'.padStart(20)}${'I1 misses'.padStart(20)}${'D1 misses'.padStart(20)}${'LL misses'.padStart(20)}\n`);
  for (const [v, c] of rows) {
    const misses = CACHE ? `${cell(c.i1, bare.i1)}${cell(c.d1, bare.d1)}${cell(c.ll, bare.ll)}` : '';
    process.stdout.write(`${v.padEnd(24)}${cell(c.ir, bare.ir)}${misses}\n`);
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(`instructions: ${err instanceof Error ? err.message : String(err)}`);
    killChildren();
    process.exit(1);
  },
);

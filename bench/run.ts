/**
 * Side-by-side benchmark (`npm run bench`): the same small chat request, the same
 * upstream, several ways, in one run on one machine:
 *   direct         straight to the upstream
 *   bare           a bare http-proxy-3 pass-through with keyward's agent settings
 *   keyward        keyward, cached key, in-process limiter, no limits on the key
 *   keyward-redis  keyward with Redis limits: every request admitted and settled in Redis
 *   keyward-redis-budgets  (slot, not measured yet) Redis limits plus spend holds on budgets
 *   keyward-redis-w2       keyward-redis as `serve --workers 2`: a cluster primary and two
 *                  workers on one port; its CPU is the sum over the three processes. On a
 *                  2-core machine the load generator and the upstream compete with the workers.
 * Memory (RSS with 1,000 open SSE streams, during a 1 GiB upload): `npm run bench:memory`.
 *
 * Every server runs in a child process of its own, so the load generator (autocannon, in
 * this process) never shares an event loop with the server under test. Throughput:
 * a warm-up per variant, then ROUNDS rounds of DURATION seconds per variant, the order
 * rotated each round, median reported. Latency at a fixed rate below every variant's
 * saturation (half of the slowest variant's median throughput) for bare, keyward and
 * keyward-redis, twice: with autocannon's -R, and with an evenly paced open-loop
 * generator (see paced.ts for why both).
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
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { generateKey } from '../src/auth/keyformat.js';
import { paced, percentile } from './paced.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const env = (name: string, def: number) => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : def;
};
const ROUNDS = env('BENCH_ROUNDS', 3);
const DURATION = env('BENCH_DURATION', 5);
const WARMUP = env('BENCH_WARMUP', 3);
const CONNECTIONS = env('BENCH_CONNECTIONS', 32);
const RATE_CONNECTIONS = env('BENCH_RATE_CONNECTIONS', 8);
const RATE_FRACTION = env('BENCH_RATE_FRACTION', 0.5);
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
const PROFILE = process.env.BENCH_PROFILE === '1';
/** comma-separated subset of variants to run (bare always runs: it is the baseline) */
const ONLY = process.env.BENCH_VARIANTS ? process.env.BENCH_VARIANTS.split(',').map((v) => v.trim()) : null;
const PIN = process.env.BENCH_PIN === '1' && cpus().length >= 2 && spawnSync('taskset', ['-V']).status === 0;

const PATH = '/v1/chat/completions';
const KEY = generateKey();
const BODY = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Hello, how are you today?' }], max_tokens: 16 });
const HEADERS = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };

type Variant = 'direct' | 'bare' | 'keyward' | 'keyward-redis' | 'keyward-redis-budgets' | 'keyward-redis-w2';
const VARIANTS: Variant[] = ['direct', 'bare', 'keyward', 'keyward-redis', 'keyward-redis-budgets', 'keyward-redis-w2'];
/** measured for throughput only: the fixed-rate latency section keeps to one process per variant, for time */
const THROUGHPUT_ONLY = new Set<Variant>(['keyward-redis-w2']);

// ---- children ---------------------------------------------------------------------------

const children = new Set<ChildProcess>();

function killChildren(): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
}
process.on('exit', killChildren);
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    killChildren();
    process.exit(130);
  });
}

interface Started {
  child: ChildProcess;
  port: number;
  info: Record<string, unknown>;
}

/** Starts `bench/servers/<name>.ts` in its own node process; resolves with its port. */
function startServer(name: string, args: string[], opts: { cpu?: number; profile?: boolean } = {}): Promise<Started> {
  const nodeArgs = ['--import', 'tsx'];
  // One directory per server: node writes one profile per thread (tsx's loader has its own).
  if (opts.profile) nodeArgs.push('--cpu-prof', `--cpu-prof-dir=${join(root, '.bench', 'prof', [name, ...args.slice(1, 2)].join('-'))}`);
  const script = join(root, 'bench', 'servers', `${name}.ts`);
  const [cmd, argv] = PIN && opts.cpu !== undefined
    ? ['taskset', ['-c', String(opts.cpu), process.execPath, ...nodeArgs, script, ...args]]
    : [process.execPath, [...nodeArgs, script, ...args]];
  const child = spawn(cmd as string, argv as string[], {
    cwd: root,
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, KW_BENCH_KEY: KEY },
  });
  children.add(child);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start within 20 s`)), 20_000);
    child.once('exit', (code) => reject(new Error(`${name} exited early with ${code}`)));
    const lines = createInterface({ input: child.stdout! });
    lines.once('line', (line) => {
      clearTimeout(timer);
      const info = JSON.parse(line) as Record<string, unknown>;
      resolve({ child, port: Number(info.port), info });
    });
  });
}

function stopServer(s: Started): Promise<void> {
  return new Promise((resolve) => {
    if (s.child.exitCode !== null || s.child.signalCode !== null) return resolve();
    const timer = setTimeout(() => {
      s.child.kill('SIGKILL');
      resolve();
    }, 5_000);
    s.child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    s.child.stdin?.end();
  });
}

async function redisAvailable(url: string): Promise<boolean> {
  const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 1_000, retryStrategy: () => null });
  r.on('error', () => undefined);
  try {
    await r.connect();
    return (await r.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    r.disconnect();
  }
}

// ---- measuring --------------------------------------------------------------------------

interface Throughput {
  rps: number;
  cpuUsPerRequest: number;
  ok: number;
  non2xx: number;
  errors: number;
  p50: number;
  p99: number;
}

interface Latency {
  rate: number;
  achieved: number;
  p50: number;
  p99: number;
  samples: number;
  non2xx: number;
  errors: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function cannon(port: number, opts: { duration: number; connections: number; overallRate?: number; samples?: number[] }): PromiseLike<autocannon.Result> {
  const inst = autocannon({
    url: `http://127.0.0.1:${port}${PATH}`,
    method: 'POST',
    headers: HEADERS,
    body: BODY,
    connections: opts.connections,
    pipelining: 1,
    duration: opts.duration,
    ...(opts.overallRate ? { overallRate: opts.overallRate } : {}),
  });
  // autocannon's histograms keep whole milliseconds; the response events carry the
  // full-resolution time, which sub-millisecond differences need.
  if (opts.samples) {
    const samples = opts.samples;
    inst.on('response', (_client: unknown, status: number, _bytes: number, ms: number) => {
      if (status >= 200 && status < 300) samples.push(ms);
    });
  }
  return inst;
}

/** The pid and every descendant's (a cluster primary's workers), from /proc. */
function processTree(pid: number): number[] {
  const out = [pid];
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const kids = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      for (const k of kids ? kids.split(' ') : []) out.push(...processTree(Number(k)));
    }
  } catch {
    // gone, or no /proc: what was found so far
  }
  return out;
}

/** CPU seconds (user + system) a process and its descendants have used so far; null where /proc is missing. */
function cpuSeconds(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  const each = processTree(pid).map(ownCpuSeconds);
  return each[0] === null ? null : each.reduce<number>((a, c) => a + (c ?? 0), 0);
}

function ownCpuSeconds(pid: number): number | null {
  try {
    // the fields after the command name, which is in parentheses and may contain spaces
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return null;
  }
}
const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

async function throughput(port: number, duration: number, pid?: number): Promise<Throughput> {
  const samples: number[] = [];
  const cpu0 = cpuSeconds(pid);
  const r = await cannon(port, { duration, connections: CONNECTIONS, samples });
  const cpu1 = cpuSeconds(pid);
  samples.sort((a, b) => a - b);
  return {
    rps: r['2xx'] / r.duration,
    ok: r['2xx'],
    non2xx: r.non2xx,
    errors: r.errors + r.timeouts,
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    // The server's own CPU per request: steadier than req/s when other work shares the machine.
    cpuUsPerRequest: cpu0 !== null && cpu1 !== null && r['2xx'] > 0 ? ((cpu1 - cpu0) * 1e6) / r['2xx'] : NaN,
  };
}

async function latencyCannon(port: number, rate: number, duration: number): Promise<Latency> {
  const samples: number[] = [];
  const r = await cannon(port, { duration, connections: RATE_CONNECTIONS, overallRate: rate, samples });
  samples.sort((a, b) => a - b);
  return { rate, achieved: r['2xx'] / r.duration, p50: percentile(samples, 50), p99: percentile(samples, 99), samples: samples.length, non2xx: r.non2xx, errors: r.errors + r.timeouts };
}

const REQUEST = Buffer.from(
  `POST ${PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: ${HEADERS.authorization}\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(BODY)}\r\nconnection: keep-alive\r\n\r\n${BODY}`,
);

async function latencyPaced(port: number, rate: number, duration: number): Promise<Latency> {
  const r = await paced({ host: '127.0.0.1', port, request: REQUEST, rate, durationMs: duration * 1000 });
  const s = r.latencies.sort((a, b) => a - b);
  return { rate, achieved: r.latencies.length / duration, p50: percentile(s, 50), p99: percentile(s, 99), samples: s.length, non2xx: r.non2xx, errors: r.errors };
}

// ---- output -----------------------------------------------------------------------------

const f = (n: number, digits = 0) => (Number.isFinite(n) ? n.toFixed(digits) : 'n/a');
const ms = (n: number) => (Number.isFinite(n) ? `${n.toFixed(3)} ms` : 'n/a');
const pad = (s: string, n: number) => s.padEnd(n);
const lpad = (s: string, n: number) => s.padStart(n);
const log = (line: string) => process.stderr.write(`${line}\n`);

// ---- main -------------------------------------------------------------------------------

async function main(): Promise<void> {
  const started = Date.now();
  mkdirSync(join(root, '.bench'), { recursive: true });
  const withRedis = await redisAvailable(REDIS_URL);
  if (!withRedis) log(`bench: no Redis at ${REDIS_URL}; the keyward-redis variant is skipped`);
  log(`bench: node ${process.version}, ${cpus().length} CPUs, ${CONNECTIONS} connections, ${ROUNDS} rounds x ${DURATION} s${PIN ? ', pinned' : ''}`);

  const upstream = await startServer('upstream', [], { cpu: 0 });
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
  const servers: Partial<Record<Variant, Started>> = {};
  servers.bare = await startServer('bare', [upstreamUrl], { cpu: 1, profile: PROFILE });
  servers.keyward = await startServer('keyward', [upstreamUrl, 'memory'], { cpu: 1, profile: PROFILE });
  const wanted = (v: Variant) => ONLY === null || ONLY.includes(v);
  if (withRedis && wanted('keyward-redis')) servers['keyward-redis'] = await startServer('keyward', [upstreamUrl, 'redis', REDIS_URL], { cpu: 1, profile: PROFILE });
  // ---- SLOT: keyward with Redis limits and budgets (spend holds, DESIGN section 6) --------
  // To be filled in once spend holds exist: start a keyward whose key draws on a budget and
  // whose replica holds price records, so every request also takes and settles a hold, e.g.
  //   servers['keyward-redis-budgets'] = await startServer('keyward', [upstreamUrl, 'redis-budgets', REDIS_URL], { cpu: 1, profile: PROFILE });
  // (bench/servers/keyward.ts then needs that mode). The variant already has its row in the
  // table (printed as "not measured" until then), in the latency section and in results.json.
  // -------------------------------------------------------------------------------------------
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
  const latSummary = (v: Variant, kind: 'cannon' | 'paced') => ({
    p50: median(lat[v]![kind].map((r) => r.p50)),
    p99: median(lat[v]![kind].map((r) => r.p99)),
    achieved: median(lat[v]![kind].map((r) => r.achieved)),
    non2xx: lat[v]![kind].reduce((a, r) => a + r.non2xx, 0),
    errors: lat[v]![kind].reduce((a, r) => a + r.errors, 0),
  });

  // ---- Redis trouble during the run: admissions that fell back to the in-process limiter
  // were not measured with Redis, so the figures of that variant say so (read from each
  // keyward's admin /metrics; for keyward-redis-w2, the sum over its workers).
  const limiterTrouble: Partial<Record<Variant, { redisErrors: number; failOpen: number }>> = {};
  for (const [v, s] of Object.entries(servers) as [Variant, Started][]) {
    if (!v.startsWith('keyward') || !s.info.adminPort) continue;
    const text = await (await fetch(`http://127.0.0.1:${Number(s.info.adminPort)}/metrics`)).text();
    const read = (name: string) => Number(/^(\S+) (\S+)$/m.exec(text.split('\n').find((l) => l.startsWith(`${name} `)) ?? '')?.[2] ?? 0);
    limiterTrouble[v] = { redisErrors: read('keyward_redis_errors_total'), failOpen: read('keyward_fail_open_admissions_total') };
  }

  // ---- stop children (profiles are written on exit)
  await Promise.all([...Object.values(servers), upstream].map(stopServer));

  // ---- report
  const targets = { keywardOverBare: 0.85, redisOverBare: 0.8, addedP50Ms: 0.5, addedP99Ms: 3 };
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
  for (const v of VARIANTS.filter((x) => x === 'keyward-redis-budgets' || variants.includes(x))) {
    if (!variants.includes(v)) {
      out.push(`${pad(v, 23)}${lpad('not measured', 15)}  (slot: spend holds not benchmarked yet)`);
      continue;
    }
    const rounds = tp[v]!.map((r) => f(r.rps)).join(' / ');
    const target = v === 'keyward' ? targets.keywardOverBare : v === 'keyward-redis' ? targets.redisOverBare : null;
    out.push(
      `${pad(v, 23)}${lpad(f(rps[v]), 15)}${lpad(rounds, 26)}${lpad(f(ratio(v), 3), 10)}${lpad(target === null ? '' : `≥ ${target}`, 9)}${lpad(target === null ? '' : check(ratio(v) >= target), 8)}${lpad(f(cpu[v]), 19)}`,
    );
  }
  out.push('  (server CPU: user+system time of the server process under test per 2xx response, median of rounds; direct = the upstream alone;');
  out.push('   keyward-redis-w2: primary and both workers together. This machine has 2 cores: the load generator, the upstream and Redis compete with the workers)');
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
      `${pad(v, 23)} added p50 < ${targets.addedP50Ms} ms: paced ${check(p.p50 < targets.addedP50Ms)}, -R ${check(a.p50 < targets.addedP50Ms)};` +
        `  added p99 < ${targets.addedP99Ms} ms: paced ${check(p.p99 < targets.addedP99Ms)}, -R ${check(a.p99 < targets.addedP99Ms)}`,
    );
  }
  for (const [v, t] of Object.entries(limiterTrouble)) {
    if (t.redisErrors || t.failOpen) out.push('', `${v}: ${t.redisErrors} Redis errors or timeouts, ${t.failOpen} requests admitted by the in-process fallback (redis.onError: open) during the run`);
  }
  const problems = variants.flatMap((v) => tp[v]!.filter((r) => r.non2xx || r.errors).map((r) => `${v}: ${r.non2xx} non-2xx, ${r.errors} errors`));
  for (const v of latVariants) for (const k of ['autocannonR', 'paced'] as const) if (latency[v][k].non2xx || latency[v][k].errors) problems.push(`${v} ${k}: ${latency[v][k].non2xx} non-2xx, ${latency[v][k].errors} errors`);
  if (problems.length) out.push('', `non-2xx or errors: ${problems.join('; ')}`);
  const seconds = (Date.now() - started) / 1000;
  out.push('', `took ${f(seconds)} s; JSON in .bench/results.json${PROFILE ? '; CPU profiles in .bench/prof' : ''}`);
  process.stdout.write(`${out.join('\n')}\n`);

  writeFileSync(
    join(root, '.bench', 'results.json'),
    `${JSON.stringify(
      {
        at: new Date().toISOString(),
        node: process.version,
        cpus: cpus().length,
        settings: { rounds: ROUNDS, durationS: DURATION, warmupS: WARMUP, connections: CONNECTIONS, rateConnections: RATE_CONNECTIONS, rateFraction: RATE_FRACTION, pinned: PIN, redis: withRedis ? REDIS_URL : null },
        request: { method: 'POST', path: PATH, bodyBytes: Buffer.byteLength(BODY) },
        throughput: Object.fromEntries(variants.map((v) => [v, { medianRps: rps[v], medianCpuUsPerRequest: cpu[v], rounds: tp[v] }])),
        ratios: {
          keywardOverBare: ratio('keyward'),
          redisOverBare: withRedis ? ratio('keyward-redis') : null,
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

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    killChildren();
    process.exit(1);
  },
);

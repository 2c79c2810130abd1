/**
 * Instructions per request, counted by callgrind: a figure that does not move with the
 * machine's speed, for comparing a change on a shared machine whose CPU time per request
 * drifts between runs. Each server runs under `valgrind --tool=callgrind` with counting off;
 * after a warm-up it counts exactly N requests of `npm run bench`'s small chat request, then stops.
 *   npx tsx bench/instructions.ts [bare,keyward,keyward-redis,...]
 * (also keyward-redis-budgets, and bare-agent, bare-lines, bare-agent-lines: the bare proxy
 * with keyward's upstream agent and/or its header-lines pass, what Node's client is handed)
 * Environment: BENCH_IR_REQUESTS (3000), BENCH_IR_WARMUP (3000).
 * What it counts: every instruction in user space of the server process (all its threads:
 * JIT code, V8's compiler and GC, libuv), not the kernel's socket work, which is about half
 * of a bare proxy's CPU time (see README, Performance). Work that runs per unit of time
 * (timers, lease refreshes, slices that end by the clock) is stretched by valgrind's
 * slowdown, so the Redis variants repeat less well than the in-process one (runs of the
 * same tree spread by about 3% in memory; more with Redis).
 * Results: a table on stdout; callgrind's files in .bench/callgrind (callgrind_annotate).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { killChildren, redisAvailable, startServer, stopServer } from './lib/servers.js';
import { BODY, HEADERS, PATH, REDIS_URL, log, root } from './lib/settings.js';

const count = (name: string, fallback: number): number => (Number(process.env[name]) > 0 ? Number(process.env[name]) : fallback);
const REQUESTS = count('BENCH_IR_REQUESTS', 3000);
const WARMUP = count('BENCH_IR_WARMUP', 3000);
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

async function measure(variant: string, upstream: string, dir: string): Promise<number> {
  const [name, ...rest] = VARIANTS[variant]!;
  const out = join(dir, `${variant}.out`);
  const s = await startServer(name, [upstream, ...rest], {
    // --smc-check: V8 writes and rewrites machine code on the heap; counting starts switched off.
    wrap: ['valgrind', '-q', '--tool=callgrind', '--smc-check=all-non-file', '--instr-atstart=no', `--callgrind-out-file=${out}`],
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
  const file = readdirSync(dir).filter((f) => f.startsWith(`${variant}.out.`)).sort().at(-1);
  const total = file && /^totals: (\d+)/m.exec(readFileSync(join(dir, file), 'utf8'))?.[1];
  if (!total) throw new Error(`no callgrind summary for ${variant}`);
  return Number(total) / REQUESTS;
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
  const rows: [string, number][] = [];
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
  process.stdout.write(`user-space instructions per request (callgrind, ${REQUESTS} requests after ${WARMUP})\n`);
  for (const [v, ir] of rows) process.stdout.write(`${v.padEnd(24)}${Math.round(ir).toLocaleString('en-US').padStart(12)}   ${(ir / bare).toFixed(2)} x bare\n`);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(`instructions: ${err instanceof Error ? err.message : String(err)}`);
    killChildren();
    process.exit(1);
  },
);

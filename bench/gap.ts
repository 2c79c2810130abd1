/**
 * The outside-harness experiment, and where its gap goes (`npx tsx bench/gap.ts`): wrk -t1
 * -c32 with the ~1 KB chat body against bare and keyward-redis (Redis limits, a personal
 * key on a wallet), rounds interleaved (bare first, then keyward first, ...), medians.
 * In the middle of each round (the first and last quarter second or more left out) it
 * samples /proc for every process involved (proxy, upstream, redis-server, wrk):
 *   CPU µs/req        time on a core per 2xx response, all threads (schedstat)
 *   run delay µs/req  time runnable but waiting for a core, all threads
 *   busiest thread    share of wall time it ran / waited for a core / slept: for the event
 *                     loops (proxy, upstream, Redis) and wrk's thread, "slept" is time spent
 *                     waiting on sockets
 * and from Redis: reads (one per batch a client sent: round trips) and commands per
 * request, and the round trip a client on this machine sees (PING every 10 ms).
 * How to read it: on one machine req/s = cores our processes got / CPU per request, so the
 * last lines split the ratio into "CPU per request" (bare total / keyward total µs) and
 * "cores our processes got" (keyward / bare). A cores factor near 1 says the gap is CPU. Below
 * 1, the cores went elsewhere: other work (machine above ours), waiting for a core (run
 * delay), or a thread asleep on its sockets while cores were free (Redis round trips, the
 * upstream, the clients). A proxy thread that is on a core or waiting for one nearly all
 * the time is the bottleneck: req/s then follows that thread's µs per request.
 * Environment: BENCH_ROUNDS (3), BENCH_DURATION (5 s), BENCH_WARMUP (3 s), BENCH_CONNECTIONS
 * (32), BENCH_WRK_THREADS (1), BENCH_REDIS_URL (by default a private redis-server).
 * Results: a table on stdout and .bench/gap.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { percentile } from './paced.js';
import { checkAnswers, partiesOf, portOf, startFleet, stopFleet, type Fleet } from './lib/fleet.js';
import { median } from './lib/measure.js';
import { machineCpu, threadStats, type MachineCpu, type Sched } from './lib/procstat.js';
import { redisUnderTest } from './lib/redis-server.js';
import { f, lpad, pad } from './lib/report.js';
import { runMain } from './lib/servers.js';
import { CHAT_BODY, CONNECTIONS, DURATION, ROUNDS, WARMUP, WRK_THREADS, log, root } from './lib/settings.js';
import { startWrk, wrkAvailable } from './lib/wrk.js';

const SIDES = ['bare', 'keyward-redis'] as const;
type Side = (typeof SIDES)[number];
const PROCS = ['proxy', 'upstream', 'redis', 'wrk'] as const;
type Proc = (typeof PROCS)[number];

interface Snap {
  at: number;
  threads: Record<Proc, Map<string, Sched>>;
  machine: MachineCpu | null;
  redis: { reads: number; commands: number };
}

interface ProcWindow {
  cpuUs: number;
  waitUs: number;
  /** the busiest thread: its CPU µs per request, and shares of wall time */
  topUs: number;
  run: number;
  wait: number;
  idle: number;
}

interface Window {
  rps: number;
  procs: Record<Proc, ProcWindow>;
  totalCpuUs: number;
  cores: { ours: number; machine: number };
  redisReadsPerReq: number;
  redisCommandsPerReq: number;
  pingMs: { p50: number; p99: number };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const field = (info: string, name: string) => Number(new RegExp(`^${name}:(\\S+)`, 'm').exec(info)?.[1] ?? NaN);

async function snap(pids: Record<Proc, number | null>, client: Redis): Promise<Snap> {
  const info = await client.info('stats');
  const threads = Object.fromEntries(PROCS.map((p) => [p, threadStats(pids[p])])) as Record<Proc, Map<string, Sched>>;
  return { at: performance.now(), threads, machine: machineCpu(), redis: { reads: field(info, 'total_reads_processed'), commands: field(info, 'total_commands_processed') } };
}

function procWindow(a: Map<string, Sched>, b: Map<string, Sched>, wallNs: number, requests: number): ProcWindow {
  let run = 0;
  let wait = 0;
  let top = { run: 0, wait: 0 };
  for (const [tid, s] of b) {
    const d = { run: s.runNs - (a.get(tid)?.runNs ?? 0), wait: s.waitNs - (a.get(tid)?.waitNs ?? 0) };
    run += d.run;
    wait += d.wait;
    if (d.run > top.run) top = d;
  }
  if (b.size === 0) return { cpuUs: NaN, waitUs: NaN, topUs: NaN, run: NaN, wait: NaN, idle: NaN };
  return { cpuUs: run / 1e3 / requests, waitUs: wait / 1e3 / requests, topUs: top.run / 1e3 / requests, run: top.run / wallNs, wait: top.wait / wallNs, idle: 1 - (top.run + top.wait) / wallNs };
}

/** PINGs Redis every 10 ms until `stop.done`; the round trips in ms. */
async function pingLoop(client: Redis, stop: { done: boolean }): Promise<number[]> {
  const rtts: number[] = [];
  while (!stop.done) {
    const t = performance.now();
    await client.ping();
    rtts.push(performance.now() - t);
    await sleep(10);
  }
  return rtts;
}

/** One wrk run; /proc and Redis sampled over its middle. */
async function round(fleet: Fleet, side: Side, duration: number, client: Redis): Promise<Window> {
  const parties = partiesOf(fleet, side);
  const run = startWrk({ port: portOf(fleet, side), body: CHAT_BODY, duration, connections: CONNECTIONS, threads: WRK_THREADS });
  const pids: Record<Proc, number | null> = { proxy: parties.proxy, upstream: parties.upstream, redis: fleet.redis?.pid ?? null, wrk: run.pid };
  const margin = Math.min(1, duration / 4) * 1000;
  await sleep(margin);
  const a = await snap(pids, client);
  const stop = { done: false };
  const pings = pingLoop(client, stop);
  await sleep(duration * 1000 - 2 * margin);
  stop.done = true;
  const rtts = (await pings).sort((x, y) => x - y);
  const b = await snap(pids, client);
  const w = await run.done;
  const wallNs = (b.at - a.at) * 1e6;
  const rps = (w.requests - w.non2xx) / w.seconds;
  const requests = (rps * wallNs) / 1e9;
  const procs = Object.fromEntries(PROCS.map((p) => [p, procWindow(a.threads[p], b.threads[p], wallNs, requests)])) as Record<Proc, ProcWindow>;
  const totalCpuUs = PROCS.reduce((s, p) => s + (Number.isNaN(procs[p].cpuUs) ? 0 : procs[p].cpuUs), 0);
  // our own PINGs and the INFO between the snapshots are not the proxy's
  const own = rtts.length + 1;
  return {
    rps,
    procs,
    totalCpuUs,
    cores: { ours: (totalCpuUs * requests) / (wallNs / 1e3), machine: a.machine && b.machine ? (b.machine.busy - a.machine.busy) / (wallNs / 1e9) : NaN },
    redisReadsPerReq: (b.redis.reads - a.redis.reads - own) / requests,
    redisCommandsPerReq: (b.redis.commands - a.redis.commands - own) / requests,
    pingMs: { p50: percentile(rtts, 50), p99: percentile(rtts, 99) },
  };
}

/** The median of each figure over rounds. */
function medianWindow(ws: Window[]): Window {
  const m = (pick: (w: Window) => number) => median(ws.map(pick));
  const proc = (p: Proc): ProcWindow => ({ cpuUs: m((w) => w.procs[p].cpuUs), waitUs: m((w) => w.procs[p].waitUs), topUs: m((w) => w.procs[p].topUs), run: m((w) => w.procs[p].run), wait: m((w) => w.procs[p].wait), idle: m((w) => w.procs[p].idle) });
  return {
    rps: m((w) => w.rps),
    procs: Object.fromEntries(PROCS.map((p) => [p, proc(p)])) as Record<Proc, ProcWindow>,
    totalCpuUs: m((w) => w.totalCpuUs),
    cores: { ours: m((w) => w.cores.ours), machine: m((w) => w.cores.machine) },
    redisReadsPerReq: m((w) => w.redisReadsPerReq),
    redisCommandsPerReq: m((w) => w.redisCommandsPerReq),
    pingMs: { p50: m((w) => w.pingMs.p50), p99: m((w) => w.pingMs.p99) },
  };
}

function table(s: Record<Side, Window>, ratio: number): string[] {
  const row = (label: string, cell: (w: Window) => string) => `${pad(label, 34)}${SIDES.map((v) => lpad(cell(s[v]), 16)).join('')}`;
  const pct = (x: number) => f(100 * x);
  const out = [`${pad('', 34)}${SIDES.map((v) => lpad(v, 16)).join('')}`];
  out.push(row('req/s', (w) => f(w.rps)), row('ratio to bare (median of rounds)', (w) => (w === s.bare ? '1.000' : f(ratio, 3))));
  out.push(row(`latency per request (${CONNECTIONS}/rps) ms`, (w) => f((CONNECTIONS / w.rps) * 1000, 2)));
  out.push('CPU µs/req (on a core)');
  for (const p of PROCS) out.push(row(`  ${p}`, (w) => f(w.procs[p].cpuUs, 1)));
  out.push(row('  total', (w) => f(w.totalCpuUs, 1)));
  out.push('run delay µs/req (runnable, waiting for a core)');
  for (const p of PROCS) out.push(row(`  ${p}`, (w) => f(w.procs[p].waitUs, 1)));
  out.push('busiest thread: µs/req, % of wall run/wait/sleep');
  for (const p of PROCS) out.push(row(`  ${p}`, (w) => `${f(w.procs[p].topUs)} µs ${pct(w.procs[p].run)}/${pct(w.procs[p].wait)}/${pct(w.procs[p].idle)}`));
  out.push(row('cores busy: ours / machine', (w) => `${f(w.cores.ours, 2)}/${f(w.cores.machine, 2)}`));
  out.push(row('Redis reads (round trips) per req', (w) => f(w.redisReadsPerReq, 3)));
  out.push(row('Redis commands per req', (w) => f(w.redisCommandsPerReq, 3)));
  out.push(row('Redis PING round trip p50/p99 ms', (w) => `${f(w.pingMs.p50, 2)}/${f(w.pingMs.p99, 2)}`));
  return out;
}

/**
 * What the figures say. On one machine req/s = cores our processes got / CPU seconds per
 * request, so each round's ratio splits exactly into a CPU factor and a cores factor (the
 * medians printed need not multiply exactly); the cores our processes did not get went to
 * other work, to waiting for a core, or to sleeping on sockets.
 */
function reading(s: Record<Side, Window>, ratio: number): string[] {
  const b = s.bare;
  const k = s['keyward-redis'];
  const cpuFactor = b.totalCpuUs / k.totalCpuUs;
  const coresFactor = k.cores.ours / b.cores.ours;
  const thread = (w: Window) => `${f(100 * w.procs.proxy.run)}% on a core, ${f(100 * w.procs.proxy.wait)}% waiting for one, ${f(100 * w.procs.proxy.idle)}% asleep`;
  const sleeps = k.procs.proxy.idle >= 0.1;
  // /proc/stat counts in clock ticks, ours in ns: a difference below a tick's worth reads as none
  const others = (w: Window) => f(Math.max(0, w.cores.machine - w.cores.ours), 2);
  return [
    `ratio ${f(ratio, 3)} ≈ CPU per request ${f(cpuFactor, 3)} (bare / keyward total µs) x cores our processes got ${f(coresFactor, 3)} (keyward / bare: ${f(k.cores.ours, 2)} / ${f(b.cores.ours, 2)})`,
    `  the machine was busy ${f(b.cores.machine, 2)} / ${f(k.cores.machine, 2)} of 2 cores (bare / keyward rounds), ${others(b)} / ${others(k)} of it other work`,
    `proxy thread: keyward ${thread(k)}; bare ${thread(b)}`,
    sleeps
      ? `  keyward's thread sleeps ${f(100 * k.procs.proxy.idle)}%: it waits on sockets (Redis: ${f(k.redisReadsPerReq, 3)} round trips per request, PING p50 ${f(k.pingMs.p50, 2)} ms; the upstream; the clients)`
      : `  keyward's event loop is saturated (on a core or waiting for one): req/s follows its thread's ${f(k.procs.proxy.topUs)} µs per request (bare's ${f(b.procs.proxy.topUs)}: ${f(b.procs.proxy.topUs / k.procs.proxy.topUs, 3)}) ` +
        `and its wait for a core; Redis round trips (${f(k.redisReadsPerReq, 3)} per request, PING p50 ${f(k.pingMs.p50, 2)} ms) do not hold it up`,
  ];
}

async function main(): Promise<void> {
  mkdirSync(join(root, '.bench'), { recursive: true });
  if (!wrkAvailable()) throw new Error('gap needs wrk: `apt-get install wrk` (Debian package wrk)');
  const redis = await redisUnderTest();
  if (!redis) throw new Error('gap needs Redis: a redis-server on PATH or BENCH_REDIS_URL');
  const fleet = await startFleet({ redis, want: (v) => v === 'keyward-redis' });
  await checkAnswers(fleet, [CHAT_BODY]);
  const client = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  log(`gap: wrk -t${WRK_THREADS} -c${CONNECTIONS}, ${Buffer.byteLength(CHAT_BODY)} B body, ${ROUNDS} rounds x ${DURATION} s, warm-up ${WARMUP} s each`);
  for (const side of SIDES) await startWrk({ port: portOf(fleet, side), body: CHAT_BODY, duration: WARMUP, connections: CONNECTIONS, threads: WRK_THREADS }).done;
  const windows: Record<Side, Window[]> = { bare: [], 'keyward-redis': [] };
  for (let r = 0; r < ROUNDS; r++) {
    for (const side of r % 2 ? [...SIDES].reverse() : SIDES) {
      const w = await round(fleet, side, DURATION, client);
      windows[side].push(w);
      log(`round ${r + 1}/${ROUNDS} ${pad(side, 14)} ${lpad(f(w.rps), 6)} req/s  total ${f(w.totalCpuUs)} µs/req  cores ${f(w.cores.ours, 2)}/${f(w.cores.machine, 2)}`);
    }
  }
  client.disconnect();
  await stopFleet(fleet);
  const ratio = median(windows['keyward-redis'].map((w, i) => w.rps / windows.bare[i]!.rps));
  const s = { bare: medianWindow(windows.bare), 'keyward-redis': medianWindow(windows['keyward-redis']) };
  const head = `gap: wrk -t${WRK_THREADS} -c${CONNECTIONS}, ${Buffer.byteLength(CHAT_BODY)} B chat body, ${ROUNDS} interleaved rounds x ${DURATION} s, /proc sampled over the middle of each; medians`;
  process.stdout.write(`\n${[head, ...table(s, ratio), '', ...reading(s, ratio)].join('\n')}\n`);
  writeFileSync(join(root, '.bench', 'gap.json'), `${JSON.stringify({ at: new Date().toISOString(), node: process.version, settings: { rounds: ROUNDS, durationS: DURATION, connections: CONNECTIONS, wrkThreads: WRK_THREADS, bodyBytes: Buffer.byteLength(CHAT_BODY), redis: { own: redis.own } }, ratio, summary: s, rounds: windows }, null, 2)}\n`);
}

runMain('gap', main);

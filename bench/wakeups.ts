/**
 * What waking a process on the other core costs on this machine, and how much of a proxy's
 * ratio to bare it explains (docs/performance.md, "Wake-ups across cores").
 *   npx tsx bench/wakeups.ts [servers (bare,bare+12,bare+24,keyward,keyward-redis)]
 * 1. Ping-pong: this process and a child echo one byte over pipes, on one core and on two
 *    (taskset); the round trip's wall time and this process's CPU for it.
 * 2. The servers under wrk (-t1 -c32, the 1 KB chat body), rounds interleaved, first as
 *    `npm run bench` runs them (every process free to use both cores), then with every
 *    process on core 0 (this script again under `taskset -c 0`: upstream, proxies, a private
 *    Redis and wrk all inherit it). Per server: req/s, ratio to bare, the proxy's CPU µs a
 *    request, and per request the machine's function-call and rescheduling interrupts (the
 *    `CAL` and `RES` lines of /proc/interrupts: what a wake-up on the other core costs both
 *    cores) and context switches (`ctxt` of /proc/stat). `bare+E` spins E µs a request
 *    first (bench/servers/bare.ts): a proxy that is slower by a known amount and does
 *    nothing else. Ratios are to the first server named (bare by default).
 * Environment: BENCH_ROUNDS (3), BENCH_DURATION (5 s).
 */
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { fileURLToPath } from 'node:url';
import { median } from './lib/measure.js';
import { cpuSeconds } from './lib/procstat.js';
import { redisUnderTest } from './lib/redis-server.js';
import { runMain, startServer, stopServer, type Started } from './lib/servers.js';
import { CHAT_BODY, DURATION, ROUNDS, log } from './lib/settings.js';
import { startWrk, wrkAvailable } from './lib/wrk.js';

const INNER = '--servers';
const names = (process.argv[2] && process.argv[2] !== INNER ? process.argv[2] : process.argv[3] ?? 'bare,bare+12,bare+24,keyward,keyward-redis').split(',');

/** Per-request figures of one server, medians over rounds. */
interface Row {
  name: string;
  rate: number;
  ratio: number;
  proxyUs: number;
  cal: number;
  res: number;
  ctxt: number;
}

/** The machine's interrupt and context-switch counters, summed over its cores. */
function counters(): Record<'cal' | 'res' | 'ctxt', number> {
  const sum = (line: string | undefined) => (line ?? '').trim().split(/\s+/).slice(1).filter((f) => /^\d+$/.test(f)).reduce((a, f) => a + Number(f), 0);
  const irq = readFileSync('/proc/interrupts', 'utf8').split('\n');
  const ctxt = /^ctxt (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1];
  return { cal: sum(irq.find((l) => /^\s*CAL:/.test(l))), res: sum(irq.find((l) => /^\s*RES:/.test(l))), ctxt: Number(ctxt ?? 0) };
}

/** Round trips of one byte between this process (on core `a`) and an echoing child (on core `b`). */
async function pingPong(a: number, b: number, n: number): Promise<{ wallUs: number; cpuUs: number }> {
  spawnSync('taskset', ['-p', '-c', String(a), String(process.pid)], { stdio: 'ignore' });
  const echo = "process.stdin.on('data', (d) => process.stdout.write(d))";
  const child = spawn('taskset', ['-c', String(b), process.execPath, '-e', echo], { stdio: ['pipe', 'pipe', 'inherit'] });
  const byte = Buffer.from('x');
  const trips = (count: number) =>
    new Promise<void>((resolve) => {
      let left = count;
      const onData = () => {
        if (--left === 0) {
          child.stdout!.off('data', onData);
          resolve();
        } else child.stdin!.write(byte);
      };
      child.stdout!.on('data', onData);
      child.stdin!.write(byte);
    });
  await trips(2000); // the child is up and both sides are warm
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  await trips(n);
  const c = process.cpuUsage(c0);
  const wallUs = Number(process.hrtime.bigint() - t0) / 1e3 / n;
  child.kill();
  return { wallUs, cpuUs: (c.user + c.system) / n };
}

/** Part 2 for the affinity this process has: one JSON line of rows on stdout. */
async function measureServers(): Promise<void> {
  const redis = names.includes('keyward-redis') ? await redisUnderTest() : null;
  const upstream = await startServer('upstream', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  const servers: { name: string; started: Started; rates: number[]; ratios: number[]; us: number[]; per: Record<string, number[]> }[] = [];
  for (const name of names) {
    const [kind, spin] = name.split('+');
    const args = kind === 'bare' ? [url, spin ?? '0'] : kind === 'keyward' ? [url, 'memory'] : kind === 'keyward-redis' && redis ? [url, 'redis', redis.url] : null;
    if (!args) throw new Error(`${name}: not bare[+µs], keyward or keyward-redis, or no Redis for it`);
    servers.push({ name, started: await startServer(kind === 'bare' ? 'bare' : 'keyward', args), rates: [], ratios: [], us: [], per: { cal: [], res: [], ctxt: [] } });
  }
  for (const s of servers) await startWrk({ port: s.started.port, body: CHAT_BODY, duration: 2, connections: 32, threads: 1 }).done;
  for (let r = 0; r < ROUNDS; r++) {
    for (const s of servers.map((_, i) => servers[(i + r) % servers.length]!)) {
      const cpu0 = cpuSeconds(s.started.child.pid) ?? 0;
      const k0 = counters();
      const w = await startWrk({ port: s.started.port, body: CHAT_BODY, duration: DURATION, connections: 32, threads: 1 }).done;
      const k1 = counters();
      if (w.non2xx > 0) throw new Error(`${s.name}: ${w.non2xx} answers were not 2xx`);
      s.us.push((((cpuSeconds(s.started.child.pid) ?? 0) - cpu0) / w.requests) * 1e6);
      s.rates.push(w.requests / w.seconds);
      for (const k of ['cal', 'res', 'ctxt'] as const) s.per[k]!.push((k1[k] - k0[k]) / w.requests);
    }
    for (const s of servers) s.ratios.push(s.rates.at(-1)! / servers[0]!.rates.at(-1)!);
    log(`round ${r + 1}: ${servers.map((s) => `${s.name} ${s.rates.at(-1)!.toFixed(0)}`).join(', ')}`);
  }
  const rows: Row[] = servers.map((s) => ({ name: s.name, rate: median(s.rates), ratio: median(s.ratios), proxyUs: median(s.us), cal: median(s.per.cal!), res: median(s.per.res!), ctxt: median(s.per.ctxt!) }));
  for (const s of servers) await stopServer(s.started);
  await stopServer(upstream);
  await redis?.stop();
  process.stdout.write(`ROWS ${JSON.stringify(rows)}\n`);
}

/** Runs part 2 in a child of this script, on core 0 when `oneCore`, else on every core (the ping-pong pinned this process). */
function serversRun(oneCore: boolean): Promise<Row[]> {
  const me = fileURLToPath(import.meta.url);
  const cmd = ['taskset', '-c', oneCore ? '0' : `0-${cpus().length - 1}`, process.execPath, '--import', 'tsx', me, INNER, names.join(',')];
  const child = spawn(cmd[0]!, cmd.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  return new Promise((resolve, reject) => {
    child.once('close', (code) => {
      const rows = /^ROWS (.*)$/m.exec(out)?.[1];
      if (code !== 0 || !rows) return reject(new Error(`the servers run${oneCore ? ' on one core' : ''} failed (${code})`));
      resolve(JSON.parse(rows) as Row[]);
    });
  });
}

runMain('wakeups', async () => {
  if (process.argv[2] === INNER) return measureServers();
  if (spawnSync('taskset', ['-V']).status !== 0) throw new Error('taskset (util-linux) is needed');
  if (!wrkAvailable()) throw new Error('wrk is needed: apt-get install -y wrk');
  const pairs: [number, number][] = [[0, 0], [0, 1], [1, 1], [1, 0]];
  console.log('ping-pong, one byte each way over pipes, 20,000 round trips');
  for (const [a, b] of pairs) {
    const p = await pingPong(a, b, 20_000);
    console.log(`  core ${a} <-> core ${b}: ${p.wallUs.toFixed(1)} µs a round trip, ${p.cpuUs.toFixed(1)} µs of this process's CPU`);
  }
  for (const oneCore of [false, true]) {
    log(oneCore ? 'servers, every process on core 0' : 'servers, both cores');
    const rows = await serversRun(oneCore);
    console.log(`\nwrk -t1 -c32, 1 KB chat body, ${ROUNDS} interleaved rounds of ${DURATION} s, ${oneCore ? 'every process on core 0' : 'both cores'}; per request:`);
    console.log('| server | req/s | / bare | proxy CPU µs | CAL | RES | ctxt |');
    console.log('|---|---|---|---|---|---|---|');
    for (const r of rows) console.log(`| ${r.name} | ${r.rate.toFixed(0)} | ${r.ratio.toFixed(3)} | ${r.proxyUs.toFixed(1)} | ${r.cal.toFixed(2)} | ${r.res.toFixed(2)} | ${r.ctxt.toFixed(2)} |`);
  }
});

/**
 * One server alone under wrk (`-t1 -c32`, the 1 KB chat body) for consecutive rounds of
 * 5 s: req/s and CPU µs per request of the server in each round, its RSS, and what its
 * garbage collector did in that round (scavenges, full GCs and incremental-marking lines
 * from --trace-gc and --trace-incremental-marking). Tells a slow round the server caused
 * (a GC phase, a process that slows with age) from one the machine caused.
 *   npx tsx bench/rounds.ts [bare|memory|redis (memory)] [rounds (8)]
 * ROUNDS_NODE_ARGS adds node flags to the server (e.g. --trace-deopt: its lines are counted too).
 */
import { readFileSync } from 'node:fs';
import { cpuSeconds } from './lib/procstat.js';
import { runMain, startServer, stopServer } from './lib/servers.js';
import { CHAT_BODY, REDIS_URL } from './lib/settings.js';
import { startWrk } from './lib/wrk.js';

const mode = process.argv[2] ?? 'memory';
const rounds = Number(process.argv[3] ?? 8);

interface RoundGc {
  scavenges: number;
  scavengeMs: number;
  full: number;
  fullMs: number;
  marking: number;
  deopts: number;
}
const fresh = (): RoundGc => ({ scavenges: 0, scavengeMs: 0, full: 0, fullMs: 0, marking: 0, deopts: 0 });

/** Counts one line of the server's V8 tracing into `gc`. */
function count(gc: RoundGc, line: string): void {
  if (/IncrementalMarking/.test(line)) gc.marking++;
  if (/bailout|deoptimiz/i.test(line)) gc.deopts++;
  const m = /(Mark-Compact|Scavenge)\S*.*?([\d.]+) \/ [\d.]+ ms/.exec(line);
  if (!m) return;
  if (m[1] === 'Mark-Compact') {
    gc.full++;
    gc.fullMs += Number(m[2]);
  } else {
    gc.scavenges++;
    gc.scavengeMs += Number(m[2]);
  }
}

const rssMb = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;

runMain('rounds', async () => {
  const upstream = await startServer('upstream', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  const [name, args] = mode === 'bare' ? ['bare', [url]] : mode === 'redis' ? ['keyward', [url, 'redis', REDIS_URL]] : ['keyward', [url, 'memory']];
  let gc = fresh();
  const nodeArgs = ['--trace-gc', '--trace-incremental-marking', ...(process.env.ROUNDS_NODE_ARGS ?? '').split(' ').filter(Boolean)];
  const server = await startServer(name, args, { nodeArgs, onLine: (line) => count(gc, line) });
  const pid = server.child.pid!;
  console.log(`${mode}: ${rounds} rounds of 5 s, wrk -t1 -c32, 1 KB chat body`);
  for (let r = 0; r < rounds; r++) {
    const before = cpuSeconds(pid) ?? 0;
    gc = fresh();
    const res = await startWrk({ port: server.port, body: CHAT_BODY, duration: 5, connections: 32, threads: 1 }).done;
    const used = (cpuSeconds(pid) ?? 0) - before;
    console.log(
      `round ${r}: ${(res.requests / res.seconds).toFixed(0)} req/s, ${((used / res.requests) * 1e6).toFixed(0)} µs/req, rss ${rssMb(pid).toFixed(0)} MB, ` +
        `scavenges ${gc.scavenges} (${gc.scavengeMs.toFixed(0)} ms), full GCs ${gc.full} (${gc.fullMs.toFixed(0)} ms), marking lines ${gc.marking}, deopt lines ${gc.deopts}, non-2xx ${res.non2xx}`,
    );
  }
  await stopServer(server);
  await stopServer(upstream);
});

/**
 * System calls per request of each proxy process, all threads (`strace -c -f`), bare
 * against keyward in memory and with Redis limits, under the same load: autocannon with
 * the small chat request, 32 connections, exactly N requests after a warm-up.
 *   npx tsx bench/syscalls.ts [N (20000)]
 * strace slows the process it traces, so under it more requests share each event-loop turn
 * and each batched write (access lines, settlements) than in a real run: the per-turn and
 * per-batch calls (epoll_pwait, write, futex) read lower here than they are, the
 * per-request ones (read, writev) as they are.
 * Needs strace (Debian package `strace`).
 */
import { spawn, spawnSync } from 'node:child_process';
import autocannon from 'autocannon';
import { killChildren, redisAvailable, startServer, stopServer } from './lib/servers.js';
import { BODY, HEADERS, PATH, REDIS_URL, log } from './lib/settings.js';

const N = Number(process.argv[2]) > 0 ? Number(process.argv[2]) : 20000;

async function shoot(port: number, amount: number): Promise<void> {
  await autocannon({ url: `http://127.0.0.1:${port}${PATH}`, method: 'POST', headers: HEADERS, body: BODY, connections: 32, amount }).then((r) => {
    if (r['2xx'] !== amount) throw new Error(`${r['2xx']} of ${amount} requests answered 2xx`);
  });
}

/** strace's summary table as calls per name. */
function parseSummary(text: string): Map<string, number> {
  const calls = new Map<string, number>();
  for (const line of text.split('\n')) {
    const f = line.trim().split(/\s+/);
    // % time, seconds, usecs/call, calls, [errors,] name
    if (f.length >= 5 && /^[\d.]+$/.test(f[0]!) && /^\d+$/.test(f[3]!)) calls.set(f[f.length - 1]!, Number(f[3]));
  }
  return calls;
}

/** Traces `pid` while `amount` requests go to `port`; calls per name over the traced window. */
async function traced(pid: number, port: number): Promise<Map<string, number>> {
  const st = spawn('strace', ['-c', '-f', '-p', String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let out = '';
  st.stderr.on('data', (d: Buffer) => (out += d.toString()));
  // strace reports "Process N attached" per thread once it is in
  await new Promise<void>((resolve) => {
    const check = () => (out.includes('attached') ? resolve() : setTimeout(check, 20));
    check();
  });
  await shoot(port, N);
  st.kill('SIGINT');
  await new Promise((resolve) => st.once('exit', resolve));
  return parseSummary(out);
}

async function main(): Promise<void> {
  if (spawnSync('strace', ['-V']).status !== 0) throw new Error('strace is not installed (apt-get install strace)');
  const upstream = await startServer('upstream', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  const variants: [string, string, string[]][] = [['bare', 'bare', [url]], ['keyward', 'keyward', [url, 'memory']]];
  if (await redisAvailable(REDIS_URL)) variants.push(['keyward-redis', 'keyward', [url, 'redis', REDIS_URL]]);
  else log(`syscalls: no Redis at ${REDIS_URL}; keyward-redis skipped`);
  const results: [string, Map<string, number>][] = [];
  for (const [label, name, args] of variants) {
    const s = await startServer(name, args);
    try {
      await shoot(s.port, 5000);
      results.push([label, await traced(s.child.pid!, s.port)]);
    } finally {
      await stopServer(s);
    }
  }
  await stopServer(upstream);
  const names = [...new Set(results.flatMap(([, m]) => [...m.keys()]))].filter((n) => n !== 'total');
  const perReq = (m: Map<string, number>, n: string) => (m.get(n) ?? 0) / N;
  names.sort((a, b) => Math.max(...results.map(([, m]) => perReq(m, b))) - Math.max(...results.map(([, m]) => perReq(m, a))));
  process.stdout.write(`system calls per request (strace -c -f, ${N} requests)\n${'call'.padEnd(16)}${results.map(([l]) => l.padStart(15)).join('')}\n`);
  for (const n of names.slice(0, 12)) process.stdout.write(`${n.padEnd(16)}${results.map(([, m]) => perReq(m, n).toFixed(3).padStart(15)).join('')}\n`);
  const total = (m: Map<string, number>) => [...m].filter(([n]) => n !== 'total').reduce((a, [, c]) => a + c, 0) / N;
  process.stdout.write(`${'all'.padEnd(16)}${results.map(([, m]) => total(m).toFixed(3).padStart(15)).join('')}\n`);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    log(`syscalls: ${err instanceof Error ? err.message : String(err)}`);
    killChildren();
    process.exit(1);
  },
);

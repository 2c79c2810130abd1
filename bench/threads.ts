/**
 * CPU per request by thread, bare against keyward in memory and with Redis limits, under
 * the same load (autocannon, as `npm run bench`), from /proc/<pid>/task: the main thread
 * (user and system time apart) and the others together (V8's GC helpers, libuv's pool).
 *   npx tsx bench/threads.ts [rounds (2)]
 * XARGS passes node flags to every server (e.g. XARGS=--single-threaded-gc).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { throughput } from './lib/measure.js';
import { startServer, stopServer } from './lib/servers.js';
import { REDIS_URL } from './lib/settings.js';
const extra = (process.env.XARGS ?? '').split(' ').filter(Boolean);
const upstream = await startServer('upstream', []);
const url = `http://127.0.0.1:${upstream.port}`;
const snap = (pid: number) => {
  const m = new Map<string, number>();
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const s = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      const k = t === String(pid) ? 'main' : 'others';
      if (k === 'main') { m.set('mainU', Number(f[11]) / 100); m.set('mainS', Number(f[12]) / 100); }
      m.set(k, (m.get(k) ?? 0) + (Number(f[11]) + Number(f[12])) / 100);
    } catch { /* thread gone */ }
  }
  return m;
};
const variants: [string, string[]][] = [['bare', [url]], ['keyward', [url, 'memory']], ['keyward', [url, 'redis', REDIS_URL]]];
const servers = [];
for (const [n, a] of variants) servers.push(await startServer(n, a, { nodeArgs: extra }));
for (let round = 0; round < Number(process.argv[2] ?? 2); round++) {
  for (const [i, s] of servers.entries()) {
    await throughput(s.port, 2);
    const a = snap(s.child.pid!);
    const t = await throughput(s.port, 5);
    const b = snap(s.child.pid!);
    const parts = [...b].map(([k, v]) => [k, ((v - (a.get(k) ?? 0)) * 1e6) / t.ok] as const).filter(([, v]) => v > 0.5);
    console.log(`${variants[i]![0]}-${variants[i]![1][1] ?? ''} ${Math.round(t.rps)} req/s  ` + parts.map(([k, v]) => `${k}=${v.toFixed(1)}`).join(' ') + `  total=${parts.filter(([k]) => k !== 'mainU' && k !== 'mainS').reduce((x, [, v]) => x + v, 0).toFixed(1)} µs/req`);
  }
}
for (const s of servers) await stopServer(s);
await stopServer(upstream);
process.exit(0);

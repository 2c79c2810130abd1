/**
 * Where keyward's own time goes, against the bare proxy: each server runs under --cpu-prof
 * and serves exactly N requests (after 20,000 of warm-up, which the division counts too:
 * both servers get the same), and the report lists self time per request by function,
 * keyward minus bare, largest first, then the functions where bare spends more.
 *   npx tsx bench/profile-diff.ts [N (60000)] [memory|redis|redis-budgets (redis)] [rows (45)]
 *   PROFILE_BASE=memory npx tsx bench/profile-diff.ts 60000 redis   (keyward against itself in process)
 * Main-thread time only (what the sampler sees); GC on V8's helper threads and the kernel's
 * work outside a syscall are not in it.
 */
import autocannon from 'autocannon';
import { readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { startServer, stopServer } from './lib/servers.js';
import { BODY, HEADERS, PATH, REDIS_URL, root } from './lib/settings.js';
const N = Number(process.argv[2] ?? 60000);
const mode = process.argv[3] ?? 'redis';
const upstream = await startServer('upstream', []);
const url = `http://127.0.0.1:${upstream.port}`;
const shoot = (port: number, amount: number) => new Promise<void>((res) => autocannon({ url: `http://127.0.0.1:${port}${PATH}`, method: 'POST', headers: HEADERS, body: BODY, connections: 32, amount }).then(() => res(), () => res()));
type Node = { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] };
const selfPerFn = async (name: string, args: string[]): Promise<Map<string, number>> => {
  const dir = join(root, '.bench', 'prof', [name, ...args.slice(1, 2)].join('-'));
  rmSync(dir, { recursive: true, force: true });
  const s = await startServer(name, args, { profile: true });
  await shoot(s.port, 20000); // warm-up (in the profile too: subtracted below by a second run)
  await shoot(s.port, N);
  await stopServer(s);
  const file = readdirSync(dir).map((f) => join(dir, f)).sort((a, b) => statSync(b).size - statSync(a).size)[0]!;
  const p = JSON.parse(readFileSync(file, 'utf8')) as { nodes: Node[]; samples: number[]; timeDeltas: number[] };
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const m = new Map<string, number>();
  p.samples.forEach((id, i) => {
    const n = byId.get(id)!;
    if (n.callFrame.functionName === '(idle)') return;
    const u = n.callFrame.url.replace(/^.*\/(node_modules|dist)\//, '');
    const k = `${n.callFrame.functionName || '(anon)'} ${u}:${n.callFrame.lineNumber}`;
    m.set(k, (m.get(k) ?? 0) + (p.timeDeltas[i] ?? 0));
  });
  for (const [k, v] of m) m.set(k, v / (N + 20000));
  return m;
};
// PROFILE_BASE=memory compares keyward in a Redis mode against keyward in process instead of bare.
const baseMode = process.env.PROFILE_BASE;
const bare = baseMode ? await selfPerFn('keyward', [url, baseMode, REDIS_URL]) : await selfPerFn('bare', [url]);
const kw = await selfPerFn('keyward', [url, mode, REDIS_URL]);
const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
console.log(`busy µs/request: bare ${sum(bare).toFixed(1)}, keyward ${sum(kw).toFixed(1)}`);
const keys = new Set([...bare.keys(), ...kw.keys()]);
const rows = [...keys].map((k) => [k, (kw.get(k) ?? 0) - (bare.get(k) ?? 0), kw.get(k) ?? 0, bare.get(k) ?? 0] as const).sort((a, b) => b[1] - a[1]);
for (const [k, d, a, b] of rows.slice(0, Number(process.argv[4] ?? 45))) console.log(`${d.toFixed(2).padStart(7)}  kw ${a.toFixed(2).padStart(6)} bare ${b.toFixed(2).padStart(6)}  ${k}`);
console.log('... most negative:');
for (const [k, d, a, b] of rows.slice(-8)) console.log(`${d.toFixed(2).padStart(7)}  kw ${a.toFixed(2).padStart(6)} bare ${b.toFixed(2).padStart(6)}  ${k}`);
await stopServer(upstream);
process.exit(0);

/**
 * Summarises a V8 .cpuprofile (node --cpu-prof): self time by function and by file,
 * and inclusive time of keyward and proxy frames.
 *   tsx bench/profile-top.ts .bench/prof/<file>.cpuprofile [top N] [--requests N] [--callers NAME]
 * --requests N   also print µs per request (N: requests served while the profile ran)
 * --callers NAME who calls the functions named NAME, by self time spent under them
 */
import { readFileSync } from 'node:fs';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  hitCount?: number;
  children?: number[];
}
interface Profile {
  nodes: Node[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

const args = process.argv.slice(2);
const flag = (name: string): string | undefined => {
  const i = args.indexOf(name);
  if (i === -1) return undefined;
  const [, v] = args.splice(i, 2);
  return v;
};
const requests = Number(flag('--requests') ?? NaN);
const callersOf = flag('--callers');
const file = args[0];
if (!file) throw new Error('usage: tsx bench/profile-top.ts <file.cpuprofile> [N] [--requests N] [--callers NAME]');
const top = Number(args[1] ?? 40);
const prof = JSON.parse(readFileSync(file, 'utf8')) as Profile;
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const parent = new Map<number, number>();
for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

// self time per node from the sample stream
const self = new Map<number, number>();
for (let i = 0; i < prof.samples.length; i++) {
  const dt = prof.timeDeltas[i + 1] ?? 0;
  self.set(prof.samples[i]!, (self.get(prof.samples[i]!) ?? 0) + dt);
}
const total = [...self.values()].reduce((a, b) => a + b, 0);
const idle = [...self.entries()].filter(([id]) => byId.get(id)!.callFrame.functionName === '(idle)').reduce((a, [, t]) => a + t, 0);
const busy = total - idle;

const short = (url: string) => url.replace(/^file:\/\//, '').replace(/^.*\/node_modules\//, 'node_modules/').replace(/^.*\/(src|bench|test)\//, '$1/');
const label = (n: Node) => `${n.callFrame.functionName || '(anonymous)'} ${short(n.callFrame.url) || '(native)'}:${n.callFrame.lineNumber + 1}`;
const perRequest = (t: number) => (Number.isFinite(requests) && requests > 0 ? `${(t / requests).toFixed(2).padStart(7)} µs` : '');
const pct = (t: number) => `${((100 * t) / busy).toFixed(1).padStart(5)}%${perRequest(t)}`;

const fnSelf = new Map<string, number>();
const fileSelf = new Map<string, number>();
const inclusive = new Map<string, number>();
const callers = new Map<string, number>();
for (const [id, t] of self) {
  const n = byId.get(id)!;
  if (n.callFrame.functionName === '(idle)') continue;
  fnSelf.set(label(n), (fnSelf.get(label(n)) ?? 0) + t);
  const f = short(n.callFrame.url) || `(${n.callFrame.functionName})`;
  fileSelf.set(f, (fileSelf.get(f) ?? 0) + t);
  // inclusive: charge every distinct ancestor frame once
  const seen = new Set<string>();
  for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
    const node = byId.get(cur)!;
    const l = label(node);
    if (callersOf !== undefined && node.callFrame.functionName === callersOf) {
      // the chain of up to four frames above it
      const chain: string[] = [];
      for (let up = parent.get(cur), k = 0; up !== undefined && k < 4; up = parent.get(up), k++) chain.push(label(byId.get(up)!));
      const c = chain.join(' < ');
      callers.set(c, (callers.get(c) ?? 0) + t);
    }
    if (seen.has(l)) continue;
    seen.add(l);
    inclusive.set(l, (inclusive.get(l) ?? 0) + t);
  }
}
const sorted = (m: Map<string, number>) => [...m.entries()].sort((a, b) => b[1] - a[1]);
console.log(`${file}: ${(total / 1e6).toFixed(1)} s sampled, busy ${(busy / 1e6).toFixed(1)} s (${((100 * busy) / total).toFixed(0)}%)${perRequest(busy) ? `, busy per request ${perRequest(busy).trim()}` : ''}`);
if (callersOf !== undefined) {
  console.log(`\ncallers of ${callersOf} (time under it, % of busy):`);
  for (const [l, t] of sorted(callers).slice(0, top)) console.log(`${pct(t)}  ${l}`);
}
console.log(`\nself time by function (% of busy):`);
for (const [l, t] of sorted(fnSelf).slice(0, top)) console.log(`${pct(t)}  ${l}`);
console.log(`\nself time by file:`);
for (const [l, t] of sorted(fileSelf).slice(0, 25)) console.log(`${pct(t)}  ${l}`);
console.log(`\ninclusive time, keyward and http-proxy-3 frames:`);
for (const [l, t] of sorted(inclusive).filter(([l]) => /(\bsrc\/|\.bench\/dist\/|http-proxy-3|pino|prom-client|ioredis)/.test(l)).slice(0, top)) console.log(`${pct(t)}  ${l}`);

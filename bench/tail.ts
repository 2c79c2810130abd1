/**
 * Where the fixed-rate latency tail comes from: bare and keyward variants under the paced
 * generator (paced.ts), each server recording its GC pauses and event-loop delay
 * (servers/stalls.ts). Slow requests are grouped into episodes (requests scheduled
 * within 5 ms of each other) and each episode is matched against the server's GC pauses
 * that overlap it, so a tail can be charged to GC, or shown to happen with no GC at all.
 *   tsx bench/tail.ts
 * Environment: TAIL_RATE (2253), TAIL_DURATION (3 s), TAIL_ROUNDS (3), TAIL_LOAD (3 s of
 * autocannon at full speed per variant first, as `npm run bench` does before its latency
 * section), TAIL_SLOW_MS (4), BENCH_VARIANTS (keyward,keyward-redis), BENCH_NODE_ARGS.
 */
import { readFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { paced, percentile } from './paced.js';
import { recordStalls } from './servers/stalls.js';
import { redisAvailable, startServer, stopServer, type Started } from './lib/servers.js';
import { BODY, HEADERS, PATH, RAW_REQUEST, REDIS_URL, env as num, log } from './lib/settings.js';

const RATE = num('TAIL_RATE', 2253);
const DURATION = num('TAIL_DURATION', 3);
const ROUNDS = num('TAIL_ROUNDS', 3);
const LOAD = Number(process.env.TAIL_LOAD ?? 3);
const SLOW = num('TAIL_SLOW_MS', 4);
const want = (process.env.BENCH_VARIANTS ?? 'keyward,keyward-redis').split(',');
process.env.BENCH_STALLS = '1';
// the load generator's own loop, recorded the same way
const own = recordStalls()!;


interface Gc { kind: string; at: number; ms: number }
/** CPU seconds a process has used so far (user + system), from /proc; NaN without it. */
const cpuOf = (pid: number | undefined): number => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return NaN;
  }
};
interface Gap { at: number; ms: number; cpuMs: number }
interface Episode { start: number; end: number; worst: number; n: number }

const upstream = await startServer('upstream', []);
const url = `http://127.0.0.1:${upstream.port}`;
const servers: Record<string, Started> = { bare: await startServer('bare', [url]) };
if (want.includes('keyward')) servers.keyward = await startServer('keyward', [url, 'memory']);
if (want.includes('keyward-redis') && (await redisAvailable(REDIS_URL))) servers['keyward-redis'] = await startServer('keyward', [url, 'redis', REDIS_URL]);
const names = Object.keys(servers);

if (LOAD > 0) {
  for (const v of names) {
    await autocannon({ url: `http://127.0.0.1:${servers[v]!.port}${PATH}`, method: 'POST', headers: HEADERS, body: BODY, connections: 32, duration: LOAD });
  }
}
for (const v of names) await paced({ host: '127.0.0.1', port: servers[v]!.port, request: RAW_REQUEST, rate: RATE, durationMs: 1000 });

const slow: Record<string, Episode[]> = Object.fromEntries(names.map((v) => [v, []]));
const windows: Record<string, [number, number][]> = Object.fromEntries(names.map((v) => [v, []]));
for (let round = 0; round < ROUNDS; round++) {
  for (const v of names.map((_, i) => names[(i + round) % names.length]!)) {
    const cpu0 = cpuOf(servers[v]!.child.pid);
    const r = await paced({ host: '127.0.0.1', port: servers[v]!.port, request: RAW_REQUEST, rate: RATE, durationMs: DURATION * 1000 });
    // the server's share of one core at this rate: the higher, the longer a stall's queue takes to drain
    const busy = (cpuOf(servers[v]!.child.pid) - cpu0) / DURATION;
    const at = r.scheduled.map((t) => performance.timeOrigin + t);
    windows[v]!.push([Math.min(...at), Math.max(...at) + 50]);
    const eps: Episode[] = [];
    r.latencies.forEach((l, i) => {
      if (l < SLOW) return;
      const last = eps[eps.length - 1];
      if (last && at[i]! - last.end < 5) {
        last.end = Math.max(last.end, at[i]!);
        last.worst = Math.max(last.worst, l);
        last.n++;
      } else eps.push({ start: at[i]!, end: at[i]!, worst: l, n: 1 });
    });
    slow[v]!.push(...eps);
    const s = [...r.latencies].sort((a, b) => a - b);
    log(`round ${round + 1} ${v.padEnd(14)} p50 ${percentile(s, 50).toFixed(2)} p99 ${percentile(s, 99).toFixed(2)} max ${s[s.length - 1]!.toFixed(1)} ms  server CPU ${(busy * 100).toFixed(0)}% of a core  slow(>=${SLOW}ms) ${r.latencies.filter((l) => l >= SLOW).length} in ${eps.length} episodes`);
  }
}

await Promise.all([...Object.values(servers), upstream].map(stopServer));
for (const v of names) {
  const st = servers[v]!.later.find((l) => 'stalls' in l)?.stalls as { gcs: Gc[]; gaps: Gap[]; eld: Record<string, number> } | undefined;
  if (!st) continue;
  const inWin = st.gcs.filter((g) => windows[v]!.some(([a, b]) => g.at >= a && g.at <= b));
  const byKind = new Map<string, { n: number; total: number; max: number }>();
  for (const g of inWin) {
    const k = byKind.get(g.kind) ?? { n: 0, total: 0, max: 0 };
    k.n++;
    k.total += g.ms;
    k.max = Math.max(k.max, g.ms);
    byKind.set(g.kind, k);
  }
  const eps = slow[v]!;
  // an episode is charged to a GC that ran between a few ms before its first slow request was scheduled and its last
  const withGc = eps.filter((e) => inWin.some((g) => g.at + g.ms >= e.start - 1 && g.at <= e.end + SLOW));
  log(`\n${v}: event-loop delay (whole run) p50 ${st.eld.p50!.toFixed(2)} p99 ${st.eld.p99!.toFixed(2)} max ${st.eld.max!.toFixed(1)} ms`);
  log(`  GC during paced rounds: ${[...byKind].map(([k, s]) => `${k} ${s.n}x total ${s.total.toFixed(1)} ms max ${s.max.toFixed(2)} ms`).join('; ') || 'none'}`);
  log(`  slow episodes: ${eps.length}, overlapping a GC: ${withGc.length}; worst 5 without GC: ${eps.filter((e) => !withGc.includes(e)).sort((a, b) => b.worst - a.worst).slice(0, 5).map((e) => `${e.worst.toFixed(1)}ms/${e.n}req`).join(' ')}`);
  // the server's loop gaps that overlap an episode: on CPU (busy) or off it (not scheduled)
  const gapsIn = (e: Episode) => st.gaps.filter((g) => g.at + g.ms >= e.start - 1 && g.at <= e.end + SLOW);
  let busy = 0;
  let off = 0;
  let none = 0;
  for (const e of eps) {
    const gs = gapsIn(e);
    if (gs.length === 0) none++;
    else if (gs.reduce((a, g) => a + g.cpuMs, 0) >= 0.5 * gs.reduce((a, g) => a + g.ms, 0)) busy++;
    else off++;
  }
  log(`  slow episodes vs the server's loop gaps (>3 ms): busy on CPU ${busy}, off CPU ${off}, no gap ${none}`);
  const win = st.gaps.filter((g) => windows[v]!.some(([a, b]) => g.at >= a && g.at <= b));
  log(`  loop gaps during paced rounds: ${win.length}, total ${win.reduce((a, g) => a + g.ms, 0).toFixed(0)} ms, of which on CPU ${win.reduce((a, g) => a + Math.min(g.cpuMs, g.ms), 0).toFixed(0)} ms; worst: ${[...win].sort((a, b) => b.ms - a.ms).slice(0, 5).map((g) => `${g.ms.toFixed(1)}ms(cpu ${g.cpuMs.toFixed(1)})`).join(' ')}`);
  log(`  worst 5 with GC: ${withGc.sort((a, b) => b.worst - a.worst).slice(0, 5).map((e) => { const g = inWin.filter((x) => x.at + x.ms >= e.start - 1 && x.at <= e.end + SLOW); return `${e.worst.toFixed(1)}ms/${e.n}req [${g.map((x) => `${x.kind} ${x.ms.toFixed(1)}`).join(',')}]`; }).join(' ')}`);
}
// The upstream serves every variant: its own loop gaps during each variant's rounds.
const up = upstream.later.find((l) => 'stalls' in l)?.stalls as { gaps: Gap[] } | undefined;
const gen = own().gaps as Gap[];
for (const v of names) {
  const win = gen.filter((g) => windows[v]!.some(([a, b]) => g.at >= a && g.at <= b));
  const hit = slow[v]!.filter((e) => win.some((g) => g.at + g.ms >= e.start - 1 && g.at <= e.end + SLOW));
  log(`load generator during ${v}: loop gaps ${win.length} (off CPU ${win.filter((g) => g.cpuMs < 0.5 * g.ms).length}), overlapping ${hit.length} of ${v}'s ${slow[v]!.length} slow episodes`);
}
for (const v of up ? names : []) {
  const win = up!.gaps.filter((g) => windows[v]!.some(([a, b]) => g.at >= a && g.at <= b));
  const hit = slow[v]!.filter((e) => win.some((g) => g.at + g.ms >= e.start - 1 && g.at <= e.end + SLOW));
  const offCpu = win.filter((g) => g.cpuMs < 0.5 * g.ms);
  log(`upstream during ${v}: loop gaps ${win.length} (off CPU ${offCpu.length}, ${offCpu.reduce((a, g) => a + g.ms, 0).toFixed(0)} ms), overlapping ${hit.length} of ${v}'s ${slow[v]!.length} slow episodes`);
}
process.exit(0);

/**
 * What a ratio to bare leaves for a proxy's own work. The bare proxy is run as it is and
 * with a known amount of main-thread work added to every request (a spin of E µs before
 * web(); bench/servers/bare.ts), and keyward beside them, all under wrk (-t1 -c32, the
 * 1 KB chat body), rounds interleaved with their order rotated. For each server: req/s,
 * the ratio to plain bare in the same round (median over rounds), and the CPU µs per
 * request of the proxy process and of the whole machine. Read it as a budget: the row
 * whose ratio is 0.90 says how many µs of its own work per request a proxy can add to
 * bare and still reach 0.90 on this machine; keyward's row is read against it.
 *   npx tsx bench/headroom.ts [extra µs list (3,6,12,24,36)] [keyward modes (memory,redis)]
 * Environment: BENCH_ROUNDS (3), BENCH_DURATION (5 s), BENCH_REDIS_URL (by default the
 * Redis at 127.0.0.1:6379).
 */
import { cpuSeconds, machineCpu } from './lib/procstat.js';
import { median } from './lib/measure.js';
import { runMain, startServer, stopServer, type Started } from './lib/servers.js';
import { CHAT_BODY, DURATION, REDIS_URL, ROUNDS, log } from './lib/settings.js';
import { startWrk } from './lib/wrk.js';

const extras = (process.argv[2] ?? '3,6,12,24,36').split(',').map(Number).filter((n) => n > 0);
const modes = (process.argv[3] ?? 'memory,redis').split(',').filter(Boolean);

interface Server {
  name: string;
  started: Started;
  rates: number[];
  ratios: number[];
  proxyUs: number[];
  machineUs: number[];
}

/** One round of wrk on one server: req/s and CPU µs per request of the proxy and of the machine. */
async function round(s: Server): Promise<number> {
  const cpu0 = cpuSeconds(s.started.child.pid) ?? 0;
  const m0 = machineCpu();
  const res = await startWrk({ port: s.started.port, body: CHAT_BODY, duration: DURATION, connections: 32, threads: 1 }).done;
  const m1 = machineCpu();
  if (res.non2xx > 0) throw new Error(`${s.name}: ${res.non2xx} answers were not 2xx`);
  s.proxyUs.push((((cpuSeconds(s.started.child.pid) ?? 0) - cpu0) / res.requests) * 1e6);
  if (m0 && m1) s.machineUs.push(((m1.busy - m0.busy) / res.requests) * 1e6);
  const rate = res.requests / res.seconds;
  s.rates.push(rate);
  return rate;
}

runMain('headroom', async () => {
  const upstream = await startServer('upstream', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  const fresh = async (name: string, script: string, args: string[]): Promise<Server> => ({ name, started: await startServer(script, args), rates: [], ratios: [], proxyUs: [], machineUs: [] });
  const servers: Server[] = [await fresh('bare', 'bare', [url])];
  for (const e of extras) servers.push(await fresh(`bare +${e} µs`, 'bare', [url, String(e)]));
  for (const m of modes) servers.push(await fresh(`keyward ${m}`, 'keyward', m === 'memory' ? [url, m] : [url, m, REDIS_URL]));
  log(`headroom: ${servers.length} servers, ${ROUNDS} rounds of ${DURATION} s, wrk -t1 -c32, 1 KB chat body`);
  for (const s of servers) await startWrk({ port: s.started.port, body: CHAT_BODY, duration: 2, connections: 32, threads: 1 }).done; // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    const order = servers.map((_, i) => servers[(i + r) % servers.length]!);
    const rates = new Map<Server, number>();
    for (const s of order) rates.set(s, await round(s));
    const bare = rates.get(servers[0]!)!;
    for (const s of servers) s.ratios.push(rates.get(s)! / bare);
    log(`round ${r + 1}: ${order.map((s) => `${s.name} ${rates.get(s)!.toFixed(0)}`).join(', ')}`);
  }
  console.log('| server | req/s | / bare | proxy CPU µs/req | added over bare | machine CPU µs/req |');
  console.log('|---|---|---|---|---|---|');
  const bareUs = median(servers[0]!.proxyUs);
  for (const s of servers) {
    const us = median(s.proxyUs);
    console.log(`| ${s.name} | ${median(s.rates).toFixed(0)} | ${median(s.ratios).toFixed(3)} | ${us.toFixed(1)} | ${(us - bareUs).toFixed(1)} | ${s.machineUs.length ? median(s.machineUs).toFixed(1) : '?'} |`);
  }
  for (const s of servers) await stopServer(s.started);
  await stopServer(upstream);
});

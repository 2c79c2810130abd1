/**
 * Old against new: keyward's CPU per request from two source trees, run side by side on one
 * upstream with the same request (`npm run bench`'s small body), in alternating rounds, so that a
 * change is measured against what it replaced on the same machine at the same time.
 *   git worktree add /tmp/kw-old <commit> && ln -s "$PWD/node_modules" /tmp/kw-old/
 *   npx tsx bench/ab.ts /tmp/kw-old [memory|redis|redis-budgets]
 * Environment: BENCH_AB_ROUNDS (7), BENCH_DURATION (5 s per round and tree);
 * BENCH_AB_OTHER_ARGS and BENCH_AB_THIS_ARGS: node options for one side's server only, so a
 * runtime flag can be measured against its absence on one tree (`bench/ab.ts . memory`).
 * CPU per request (user + system of the sidecar process per 2xx response, from /proc) is
 * steadier than req/s on a shared machine; the median of the per-round ratios is what to
 * quote.
 */
import { resolve } from 'node:path';
import { median, throughput } from './lib/measure.js';
import { killChildren, startServer, stopServer, type Started } from './lib/servers.js';
import { DURATION, log, root } from './lib/settings.js';

const [otherArg, mode = 'memory'] = process.argv.slice(2);
if (!otherArg || !['memory', 'redis', 'redis-budgets'].includes(mode)) {
  log('usage: tsx bench/ab.ts <other tree> [memory|redis|redis-budgets]');
  process.exit(2);
}
const other = resolve(otherArg);
const rounds = Number(process.env.BENCH_AB_ROUNDS) > 0 ? Number(process.env.BENCH_AB_ROUNDS) : 7;

async function main(): Promise<void> {
  const upstream = await startServer('upstream', []);
  const target = `http://127.0.0.1:${upstream.port}`;
  const trees: { name: string; server: Started; cpu: number[]; rps: number[] }[] = [];
  for (const [name, tree, args] of [['other', other, process.env.BENCH_AB_OTHER_ARGS], ['this', root, process.env.BENCH_AB_THIS_ARGS]] as const) {
    const nodeArgs = (args ?? '').split(' ').filter(Boolean);
    trees.push({ name: `${name} (${tree}${nodeArgs.length ? ` ${nodeArgs.join(' ')}` : ''})`, server: await startServer('keyward', [target, mode], { tree, nodeArgs }), cpu: [], rps: [] });
  }
  for (const t of trees) await throughput(t.server.port, 2, t.server.child.pid); // warm-up
  for (let r = 0; r < rounds; r++) {
    // Alternate who goes first, so neither tree always runs on a machine just warmed by the other.
    for (const t of r % 2 ? [...trees].reverse() : trees) {
      const m = await throughput(t.server.port, DURATION, t.server.child.pid);
      if (m.non2xx || m.errors) throw new Error(`${t.name}: ${m.non2xx} non-2xx, ${m.errors} errors`);
      t.cpu.push(m.cpuUsPerRequest);
      t.rps.push(m.rps);
      log(`round ${r + 1}/${rounds} ${t.name}: ${Math.round(m.cpuUsPerRequest)} µs CPU/request, ${Math.round(m.rps)} req/s`);
    }
  }
  const [a, b] = trees.map((t) => ({ ...t, us: median(t.cpu), req: median(t.rps) }));
  // The machine's speed drifts between rounds (other tenants): each round's two runs are
  // back to back, so the median of the per-round ratios is the figure to quote.
  const paired = median(b!.cpu.map((us, i) => us / a!.cpu[i]!));
  process.stdout.write(
    `${mode}: ${rounds} rounds x ${DURATION} s, CPU per request (median)\n` +
      `  other ${Math.round(a!.us)} µs (${Math.round(a!.req)} req/s)\n` +
      `  this  ${Math.round(b!.us)} µs (${Math.round(b!.req)} req/s)\n` +
      `  this / other, median of the per-round ratios: ${paired.toFixed(3)}\n`,
  );
  for (const t of trees) await stopServer(t.server);
  await stopServer(upstream);
}

main().catch((err: unknown) => {
  log(String(err));
  killChildren();
  process.exit(1);
});

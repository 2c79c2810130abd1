/**
 * How far one Redis node, or one Cluster shard, carries a fleet (`npx tsx bench/scale-model.ts`).
 * Redis runs commands on one thread, so a node's budget is about one core: 1,000,000 µs of
 * CPU per second. From the cost of a request measured by bench/redis-cost.ts (read from
 * .bench/redis-cost.json and .bench/redis-cost-cluster.json when present, else the figures
 * below, measured the same way), this prints, per kind of key:
 *   - the requests/s one node and one shard carry at the target utilisation, without leasing
 *     and with leasing (an instance takes a slice of a key's bucket and slots and admits
 *     locally from it while far from the limit; what is left per request is the spend hold
 *     of keys that draw on a budget or wallet, and a share of the slice calls);
 *   - for each fleet size and per-instance rate: the Redis cores the fleet needs, whether one
 *     node does or how many shards it takes at the target utilisation, and a simulated queue
 *     at that node or shard (Poisson arrivals, the measured cost as service time): the wait a
 *     command sees before Redis runs it, to compare with redis.timeoutMs, past which a
 *     request follows onError.
 * Options (lists are comma separated):
 *   --from FILE, --from-cluster FILE   redis-cost JSON files (defaults under .bench/)
 *   --variant NAME          limits | wallet | budgets (default: all three)
 *   --cpr N                 commands per request without leasing, overriding the measured figure
 *   --us-per-command N      Redis CPU µs per command, overriding the measured figures
 *   --from-lease FILE, --from-lease-cluster FILE   the same measured with leasing on
 *                           (defaults .bench/redis-cost-lease.json, redis-cost-cluster-lease.json)
 *   --leased-cpr N          commands per request with leasing, overriding the measured figure
 *   --instances LIST        fleet sizes (default 10,100)
 *   --per-instance LIST     requests/s per instance (default 500,4350: a busy gateway, and one
 *                           sidecar process at saturation with Redis limits, README Performance)
 *   --utilisation N         target share of the core (default 0.7)
 */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values: opt } = parseArgs({
  options: {
    from: { type: 'string' },
    'from-cluster': { type: 'string' },
    variant: { type: 'string' },
    cpr: { type: 'string' },
    'us-per-command': { type: 'string' },
    'from-lease': { type: 'string' },
    'from-lease-cluster': { type: 'string' },
    'leased-cpr': { type: 'string' },
    instances: { type: 'string', default: '10,100' },
    'per-instance': { type: 'string', default: '500,4350' },
    utilisation: { type: 'string', default: '0.7' },
  },
});

interface Cost {
  variant: string;
  commandsPerRequest: number;
  /** Redis main-thread CPU per command sent, network reads and replies included. */
  cpuUsPerCommand: number;
}

/**
 * `npm run bench:redis [-- --cluster] [-- --no-lease]` on the 2-core development machine
 * (Redis 7.0, one run each, settlements batched per tick): a single node, and a Cluster of
 * three masters (summed over the shards, so per request the fleet pays this on whichever
 * shards its keys live on). With leasing, what is left per request is the spend hold of keys
 * that draw on a wallet or budget; the slice and block calls are few but carry a batch each.
 */
const MEASURED_NODE: Cost[] = [
  { variant: 'limits', commandsPerRequest: 1.063, cpuUsPerCommand: 25.6 },
  { variant: 'wallet', commandsPerRequest: 2.063, cpuUsPerCommand: 23.3 },
  { variant: 'budgets', commandsPerRequest: 2.063, cpuUsPerCommand: 29.1 },
];
const MEASURED_SHARD: Cost[] = [
  { variant: 'limits', commandsPerRequest: 1.075, cpuUsPerCommand: 38.4 },
  { variant: 'wallet', commandsPerRequest: 2.604, cpuUsPerCommand: 33.4 },
  { variant: 'budgets', commandsPerRequest: 2.621, cpuUsPerCommand: 39.3 },
];
const MEASURED_LEASED: Cost[] = [
  { variant: 'limits', commandsPerRequest: 0.038, cpuUsPerCommand: 239.1 },
  { variant: 'wallet', commandsPerRequest: 1.066, cpuUsPerCommand: 28.3 },
  { variant: 'budgets', commandsPerRequest: 1.064, cpuUsPerCommand: 39.7 },
];
const MEASURED_LEASED_SHARD: Cost[] = [
  { variant: 'limits', commandsPerRequest: 0.037, cpuUsPerCommand: 265.9 },
  { variant: 'wallet', commandsPerRequest: 1.134, cpuUsPerCommand: 37.6 },
  { variant: 'budgets', commandsPerRequest: 1.168, cpuUsPerCommand: 45.8 },
];

function loadCosts(file: string | undefined, fallback: string, builtIn: Cost[]): { costs: Cost[]; source: string } {
  const path = file ?? join(root, '.bench', fallback);
  if (!existsSync(path)) return { costs: builtIn, source: 'the figures in bench/scale-model.ts' };
  const data = JSON.parse(readFileSync(path, 'utf8')) as { measuredAt: string; variants: Cost[] };
  return { costs: data.variants.filter((v) => v.commandsPerRequest > 0), source: `${path} (${data.measuredAt})` };
}

/** A kind of key's cost with leasing: measured, or the cost without it at --leased-cpr commands. */
function leasedCost(c: Cost, measured: Map<string, Cost>): Cost {
  const m = measured.get(c.variant) ?? { ...c, commandsPerRequest: 0.001 };
  return leasedCpr === null ? m : { ...m, commandsPerRequest: leasedCpr };
}

const list = (s: string): number[] => s.split(',').map(Number).filter((n) => Number.isFinite(n) && n > 0);
const utilisation = Number(opt.utilisation);
const leasedCpr = opt['leased-cpr'] === undefined ? null : Number(opt['leased-cpr']);
const CORE_US = 1_000_000;

/** Deterministic pseudo-random numbers, so two runs print the same table. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * One shard as a single-server queue (Lindley's recursion): commands arrive as a Poisson
 * stream at `perSecond`, each takes `serviceUs`. Returns the wait before service, p50 and p99, µs.
 */
function simulateShard(perSecond: number, serviceUs: number, n = 200_000): { p50: number; p99: number } | null {
  if (perSecond * serviceUs >= CORE_US) return null; // overloaded: the queue grows without bound
  const random = rng(42);
  const waits = new Float64Array(n);
  let wait = 0;
  for (let i = 1; i < n; i++) {
    const gap = (-Math.log(1 - random()) / perSecond) * CORE_US;
    wait = Math.max(0, wait + serviceUs - gap);
    waits[i] = wait;
  }
  waits.sort();
  return { p50: waits[Math.floor(n * 0.5)]!, p99: waits[Math.floor(n * 0.99)]! };
}

/** Past a million requests/s a node is no longer what limits the fleet: the sidecars are. */
const leased = (n: number): string => (n > 1_000_000 ? '> 1,000,000 req/s' : `~${fmt(n)} req/s`);
const fmt = (n: number): string => (n >= 100 ? Math.round(n).toLocaleString('en-US') : n >= 10 ? n.toFixed(0) : n >= 0.01 || n === 0 ? n.toFixed(2) : n.toPrecision(2));

function main(): void {
  const adjust = (cs: Cost[]): Cost[] =>
    cs
      .filter((c) => !opt.variant || c.variant === opt.variant)
      .map((c) => ({
        ...c,
        commandsPerRequest: opt.cpr ? Number(opt.cpr) : c.commandsPerRequest,
        cpuUsPerCommand: opt['us-per-command'] ? Number(opt['us-per-command']) : c.cpuUsPerCommand,
      }));
  const node = loadCosts(opt.from, 'redis-cost.json', MEASURED_NODE);
  const shard = loadCosts(opt['from-cluster'], 'redis-cost-cluster.json', MEASURED_SHARD);
  const nodeCosts = adjust(node.costs);
  const shardCost = new Map(adjust(shard.costs).map((c) => [c.variant, c]));
  const lease = loadCosts(opt['from-lease'], 'redis-cost-lease.json', MEASURED_LEASED);
  const leaseCost = new Map(lease.costs.map((c) => [c.variant, c]));
  const leaseShard = new Map(loadCosts(opt['from-lease-cluster'], 'redis-cost-cluster-lease.json', MEASURED_LEASED_SHARD).costs.map((c) => [c.variant, c]));
  console.log(`single node: ${node.source}\ncluster: ${shard.source}\nwith leasing: ${lease.source}\ntarget utilisation ${utilisation} of one core per node or shard\n`);

  const carries = (c: Cost, cpr = c.commandsPerRequest): number => (utilisation * CORE_US) / (cpr * c.cpuUsPerCommand);
  console.log('| key kind | commands/request | Redis CPU/request, node | one node carries | CPU/request, Cluster | one shard carries | leasing: commands/request | leasing: one node carries |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const c of nodeCosts) {
    const sc = shardCost.get(c.variant) ?? c;
    const lc = leasedCost(c, leaseCost);
    console.log(
      `| ${c.variant} | ${c.commandsPerRequest} | ${fmt(c.commandsPerRequest * c.cpuUsPerCommand)} µs | ~${fmt(carries(c))} req/s ` +
        `| ${fmt(sc.commandsPerRequest * sc.cpuUsPerCommand)} µs | ~${fmt(carries(sc))} req/s | ${fmt(lc.commandsPerRequest)} | ${leased(carries(lc))} |`,
    );
  }

  console.log('\n| key kind | instances | req/s each | fleet req/s | leasing | Redis cores | Redis needed | queue wait p50 / p99 |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const c of nodeCosts) {
    const sc = shardCost.get(c.variant) ?? c;
    for (const instances of list(opt.instances)) {
      for (const each of list(opt['per-instance'])) {
        const lc = leasedCost(c, leaseCost);
        const lsc = leasedCost(sc, leaseShard);
        for (const [leasing, nc, shc] of [['no', c, sc], ['yes', lc, lsc]] as const) {
          const fleet = instances * each;
          const cpr = nc.commandsPerRequest;
          // One node while it stays under the target; past it, shards at the Cluster's cost.
          const nodeCores = (fleet * cpr * nc.cpuUsPerCommand) / CORE_US;
          const oneNode = nodeCores <= utilisation;
          const cost = oneNode ? nc : shc;
          const cores = oneNode ? nodeCores : (fleet * shc.commandsPerRequest * shc.cpuUsPerCommand) / CORE_US;
          const shards = oneNode ? 1 : Math.ceil(cores / utilisation);
          const q = simulateShard((fleet * cost.commandsPerRequest) / shards, cost.cpuUsPerCommand);
          const wait = q ? `${fmt(q.p50)} / ${fmt(q.p99)} µs` : 'overloaded';
          const needed = oneNode ? `one node (${(nodeCores * 100).toFixed(nodeCores < 0.01 ? 2 : 0)}% of a core)` : `${shards} shards`;
          console.log(`| ${c.variant} | ${instances} | ${fmt(each)} | ${fmt(fleet)} | ${leasing} | ${cores.toFixed(cores < 0.1 ? 4 : 2)} | ${needed} | ${wait} |`);
        }
      }
    }
  }

  // What one node does as its load rises: the wait grows steeply near a full core.
  const ref = nodeCosts[0];
  if (ref) {
    console.log(`\nOne node, ${ref.variant} keys (${ref.commandsPerRequest} commands of ${fmt(ref.cpuUsPerCommand)} µs): wait before Redis runs a command`);
    console.log('| utilisation | req/s on the node | p50 | p99 |');
    console.log('|---|---|---|---|');
    for (const u of [0.5, 0.7, 0.9, 0.95, 0.99]) {
      const commands = (u * CORE_US) / ref.cpuUsPerCommand;
      const q = simulateShard(commands, ref.cpuUsPerCommand)!;
      console.log(`| ${u} | ~${fmt(commands / ref.commandsPerRequest)} | ${fmt(q.p50)} µs | ${fmt(q.p99)} µs |`);
    }
  }
}

main();

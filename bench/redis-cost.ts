/**
 * What one request costs Redis (`npm run bench:redis`): a real sidecar (startSidecar, Redis
 * limits) in front of a local upstream, on a private redis-server this bench starts, so
 * nothing else on the machine touches the counters. Per variant: CONFIG RESETSTAT, REQUESTS
 * requests (CONCURRENCY at once), wait until every settlement has landed, then read
 *   INFO commandstats  calls and usec per command: the commands the sidecar sends (EVALSHA)
 *                      and, counted apart, those its scripts run inside Redis
 *   INFO cpu           the main thread's CPU time (user + sys): what a request really costs
 *                      the single-threaded server, network reads and replies included
 * Variants (each key with RPM, TPM and concurrency limits, none of them reached):
 *   limits   team key, project without budget: admission + settlement, no spend hold
 *   wallet   personal key drawing on its user's wallet, priced model: + hold + its settlement
 *   budgets  team key with a budget in a project with a budget: one hold on both holders
 *   free     team key without limits or budget: no Redis at all
 * Options: --no-lease (redis.lease off: one admission call per request however far from
 * the limit), --requests N (5000), --concurrency N (16), --cluster (a local Redis Cluster of
 * three masters instead of one node: counters summed over the masters, so the figures are
 * what the shards together pay per request), --json FILE (also written to
 * .bench/redis-cost[-cluster][-lease].json, which bench/scale-model.ts reads).
 */
import { execFileSync } from 'node:child_process';
import http from 'node:http';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Writable } from 'node:stream';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../src/auth/hash.js';
import { generateKey } from '../src/auth/keyformat.js';
import { configSchema } from '../src/config/schema.js';
import { createLogger } from '../src/obs/logger.js';
import { startSidecar } from '../src/app/sidecar.js';
import { ReplicaStore } from '../src/replica/store.js';
import type { SyncRecord } from '../src/protocol/records.js';
import { startRedisCluster } from '../test/helpers/redis-cluster.js';
import { REDIS_SERVER, spawnRedisOnSomePort } from '../test/helpers/redis-server.js';
import { startFakeUpstream } from '../test/helpers/upstream.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values: opt } = parseArgs({
  options: {
    requests: { type: 'string', default: '5000' },
    concurrency: { type: 'string', default: '16' },
    json: { type: 'string' },
    cluster: { type: 'boolean', default: false },
    'no-lease': { type: 'boolean', default: false },
  },
});
const REQUESTS = Number(opt.requests);
const CONCURRENCY = Number(opt.concurrency);
/** Commands a client sends; every other command counted ran inside a script. */
const SENT = new Set(['evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'script|load', 'script', 'fcall']);
/** This bench's own reads of the counters. */
const OWN = new Set(['info', 'config|resetstat', 'config', 'ping']);

interface CommandStat {
  calls: number;
  usec: number;
}

const high = { rpm: 1_000_000_000, tpm: 1_000_000_000_000, concurrency: 100_000 };
const VARIANTS = {
  limits: { id: 'k_limits', spec: { kind: 'team', user: null, project: 'p_free', budget: null, ...high } },
  wallet: { id: 'k_wallet', spec: { kind: 'personal', user: 'u_bench', project: null, budget: null, ...high } },
  budgets: { id: 'k_budgets', spec: { kind: 'team', user: null, project: 'p_budget', budget: 1_000_000, ...high } },
  free: { id: 'k_free', spec: { kind: 'team', user: null, project: 'p_free', budget: null, rpm: null, tpm: null, concurrency: null } },
} as const;
type Variant = keyof typeof VARIANTS;

/** The Redis under test: its URL for the sidecar, and a plain connection to each node that serves keys. */
async function startTarget(): Promise<{ url: string; nodes: Redis[]; stop(): Promise<void> }> {
  if (opt.cluster) {
    const cluster = await startRedisCluster({ masters: 3 });
    const nodes = cluster.ports.map((port) => new Redis({ port, host: '127.0.0.1' }));
    return { url: cluster.url, nodes, stop: async () => (nodes.forEach((n) => n.disconnect()), await cluster.stop()) };
  }
  const { port, server } = await spawnRedisOnSomePort(() => ['--save', '', '--appendonly', 'no']);
  const node = new Redis({ port, host: '127.0.0.1' });
  return { url: `redis://127.0.0.1:${port}`, nodes: [node], stop: async () => (node.disconnect(), await server.stop()) };
}

/** The sidecar under test, with one key per variant in its replica, in front of an upstream that reports usage. */
async function startSidecarUnder(target: { url: string }) {
  const up = await startFakeUpstream((_q, res) => {
    const text = JSON.stringify({ id: 'x', choices: [], usage: { prompt_tokens: 20, completion_tokens: 12, total_tokens: 32 } });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  const dir = mkdtempSync(join(tmpdir(), 'kw-redis-cost-'));
  const config = configSchema.parse({
    server: { port: 0 },
    admin: { port: 0 },
    upstreams: { default: { url: up.url } },
    replica: { path: join(dir, 'replica.sqlite') },
    redis: { url: target.url, prefix: 'kwcost', timeoutMs: 1_000, lease: { enabled: !opt['no-lease'] } },
    logging: { level: 'warn' },
  });
  const hash = makeKeyHasher(config.keys);
  const secrets = {} as Record<Variant, string>;
  const records: SyncRecord[] = [
    { type: 'wallet', user: 'u_bench', balance: 1_000_000 },
    { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 },
    { type: 'project', id: 'p_budget', status: 'enabled', budget: 1_000_000, spent: 0 },
    { type: 'price', model: 'gpt-4o*', input: 2.5, output: 10, per: 1_000_000 },
  ];
  for (const [name, v] of Object.entries(VARIANTS) as [Variant, (typeof VARIANTS)[Variant]][]) {
    secrets[name] = generateKey();
    records.push({ type: 'key', id: v.id, hash: hash(secrets[name]), status: 'active', spent: 0, models: null, routing: null, ...v.spec });
  }
  const replica = new ReplicaStore({ path: config.replica.path });
  replica.applySnapshot({ version: 1, records: records.map((record, i) => ({ line: i + 2, record })), source: 'bench' });
  const logger = createLogger({ level: 'warn', destination: new Writable({ write: (_c, _e, cb) => cb() }) });
  const sidecar = await startSidecar({ config, logger, replica });
  const close = async (): Promise<void> => {
    await sidecar.close({ graceMs: 500 });
    await replica.close();
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  };
  return { sidecar, secrets, close };
}

/** Sends `n` chat requests with a key, CONCURRENCY at a time; any answer but 200 fails the run. */
function loadGenerator(url: string) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const body = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'How many commands does this take?' }], max_tokens: 64 });
  const post = (key: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const req = http.request(`${url}/v1/chat/completions`, {
        method: 'POST', agent, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      }, (res) => {
        res.resume();
        res.once('end', () => resolve(res.statusCode ?? 0));
      });
      req.once('error', reject);
      req.end(body);
    });
  const send = async (key: string, n: number): Promise<void> => {
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < n) {
        next++;
        const status = await post(key);
        if (status !== 200) throw new Error(`request answered ${status}`);
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  };
  return { send, destroy: () => agent.destroy() };
}

/** What the nodes count. commandstats is summed over the nodes; a Cluster's own chatter (CLUSTER SLOTS and the like) is counted apart. */
function redisCounters(nodes: Redis[]) {
  const commandstats = async (): Promise<Map<string, CommandStat>> => {
    const out = new Map<string, CommandStat>();
    for (const node of nodes) {
      for (const line of (await node.info('commandstats')).split('\n')) {
        const m = /^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/.exec(line.trim());
        if (!m || OWN.has(m[1]!)) continue;
        const had = out.get(m[1]!) ?? { calls: 0, usec: 0 };
        out.set(m[1]!, { calls: had.calls + Number(m[2]), usec: had.usec + Number(m[3]) });
      }
    }
    return out;
  };
  const mainThreadCpuUs = async (): Promise<number> => {
    let total = 0;
    for (const node of nodes) {
      const info = await node.info('cpu');
      const read = (name: string): number => Number(new RegExp(`${name}:([\\d.]+)`).exec(info)?.[1] ?? 0);
      total += (read('used_cpu_user_main_thread') + read('used_cpu_sys_main_thread')) * 1e6;
    }
    return Math.round(total);
  };
  return { commandstats, mainThreadCpuUs, reset: () => Promise.all(nodes.map((n) => n.config('RESETSTAT'))) };
}

/** One variant's figures, from what the nodes counted over REQUESTS requests and the time they took. */
function figures(name: Variant, stats: Map<string, CommandStat>, cpuUs: number, seconds: number): Record<string, unknown> {
  const sent = [...stats].filter(([c]) => SENT.has(c));
  const inner = [...stats].filter(([c]) => !SENT.has(c) && !c.startsWith('cluster'));
  const clusterCalls = [...stats].filter(([c]) => c.startsWith('cluster')).reduce((a, [, x]) => a + x.calls, 0);
  const sum = (xs: [string, CommandStat][], f: (c: CommandStat) => number): number => xs.reduce((a, [, c]) => a + f(c), 0);
  const sentCalls = sum(sent, (c) => c.calls);
  return {
    variant: name,
    requests: REQUESTS,
    requestsPerSecond: Math.round(REQUESTS / seconds),
    commandsPerRequest: +(sentCalls / REQUESTS).toFixed(3),
    sent: Object.fromEntries(sent.map(([c, s]) => [c, { perRequest: +(s.calls / REQUESTS).toFixed(3), usecPerCall: +(s.usec / s.calls).toFixed(2) }])),
    ...(opt.cluster ? { clusterCommandsPerRequest: +(clusterCalls / REQUESTS).toFixed(4) } : {}),
    scriptInnerCommandsPerRequest: +(sum(inner, (c) => c.calls) / REQUESTS).toFixed(2),
    usecPerCommand: sentCalls ? +(sum(sent, (c) => c.usec) / sentCalls).toFixed(2) : 0,
    commandUsecPerRequest: +(sum(sent, (c) => c.usec) / REQUESTS).toFixed(1),
    cpuUsPerRequest: +(cpuUs / REQUESTS).toFixed(1),
    cpuUsPerCommand: sentCalls ? +(cpuUs / sentCalls).toFixed(1) : 0,
  };
}

/** Prints the figures and writes the JSON that the fleet model reads. */
function report(results: Record<string, unknown>[]): void {
  for (const r of results) {
    console.log(`${String(r.variant).padEnd(8)} ${String(r.commandsPerRequest).padStart(6)} commands/request  ` +
      `${String(r.commandUsecPerRequest).padStart(6)} µs in commands/request  ${String(r.cpuUsPerRequest).padStart(6)} µs Redis CPU/request  ` +
      `(${r.requestsPerSecond} req/s through one sidecar)`);
    if (Object.keys(r.sent as object).length) console.log(`         sent: ${JSON.stringify(r.sent)}; run inside scripts: ${r.scriptInnerCommandsPerRequest}/request`);
  }
  const summary = {
    measuredAt: new Date().toISOString(),
    redis: execFileSync(REDIS_SERVER, ['--version']).toString().trim(),
    topology: opt.cluster ? 'cluster of 3 masters' : 'single node',
    lease: !opt['no-lease'],
    concurrency: CONCURRENCY,
    variants: results,
  };
  // The fleet model reads the figures without leasing from redis-cost(-cluster).json and
  // those with leasing from redis-cost(-cluster)-lease.json.
  const file = `redis-cost${opt.cluster ? '-cluster' : ''}${opt['no-lease'] ? '' : '-lease'}.json`;
  mkdirSync(join(root, '.bench'), { recursive: true });
  writeFileSync(join(root, '.bench', file), `${JSON.stringify(summary, null, 2)}\n`);
  if (opt.json) writeFileSync(opt.json, `${JSON.stringify(summary, null, 2)}\n`);
  console.log(`\n${summary.topology}; written to .bench/${file} (bench/scale-model.ts --from reads it)`);
}

async function main(): Promise<void> {
  const target = await startTarget();
  const { sidecar, secrets, close } = await startSidecarUnder(target);
  const load = loadGenerator(sidecar.url);
  const counters = redisCounters(target.nodes);
  /** Settlements leave after the answer; wait until the sidecar holds nothing and the counters stand still. */
  const settled = async (): Promise<void> => {
    let last = -1;
    for (;;) {
      const s = sidecar.limiter.stats();
      const calls = [...(await counters.commandstats()).values()].reduce((a, c) => a + c.calls, 0);
      if (s.slotsHeld === 0 && s.holdsHeld === 0 && calls === last) return;
      last = calls;
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  const results: Record<string, unknown>[] = [];
  try {
    for (const name of Object.keys(VARIANTS) as Variant[]) {
      await load.send(secrets[name], 200); // scripts loaded, buckets and ledgers created
      await settled();
      await counters.reset();
      const cpuBefore = await counters.mainThreadCpuUs();
      const started = performance.now();
      await load.send(secrets[name], REQUESTS);
      const seconds = (performance.now() - started) / 1000;
      await settled();
      const cpuUs = (await counters.mainThreadCpuUs()) - cpuBefore;
      results.push(figures(name, await counters.commandstats(), cpuUs, seconds));
    }
  } finally {
    load.destroy();
    await close();
    await target.stop();
  }
  report(results);
}

await main();

/**
 * A master of a real 3-master/3-replica Redis Cluster that hangs (SIGSTOP: no error, no
 * redirection, no closed connection: a frozen VM, a partition that drops packets) under
 * load, behind two sidecars. Shown: once the replica is promoted, the sidecars use it
 * within DESIGN's node timeout plus 5 s (section 6, "Scale and faults"), and a burst on a
 * key of the hung shard is exact again across both.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { hashSlot } from '../../src/limits/redis/hash-slot.js';
import { chatRequest, printFigures, startLoad, trackLastChange } from '../helpers/load.js';
import { type LocalCluster, startRedisCluster } from '../helpers/redis-cluster.js';
import { waitFor } from '../helpers/redis-server.js';
import { type Harness, type KeySpec, startHarness } from '../helpers/sidecar.js';
import { type FakeUpstream, startFakeUpstream } from '../helpers/upstream.js';
import { generateKey } from '../../src/auth/keyformat.js';

const TIMEOUT_MS = 100;
const NODE_TIMEOUT_MS = 2_000;
/** per master: 4 load keys, then an rpm-5 key for the burst */
const KEYS_PER_MASTER = 5;
const prefix = `kwst${randomBytes(3).toString('hex')}`;

let cluster: LocalCluster;
let up: FakeUpstream;
let a: Harness;
let b: Harness;
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
const byMaster = new Map<number, string[]>();
const specs: Record<string, KeySpec> = {};

before(async () => {
  cluster = await startRedisCluster({ masters: 3, replicas: 1, fullCoverage: false, nodeTimeoutMs: NODE_TIMEOUT_MS });
  up = await startFakeUpstream((_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'x', usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } }));
  });
  for (let i = 0; byMaster.size < 3 || [...byMaster.values()].some((ks) => ks.length < KEYS_PER_MASTER); i++) {
    const id = `k${i}`;
    const port = await cluster.masterOf(hashSlot(`{${prefix}:k:${id}}`));
    assert.ok(port, 'every slot has a master');
    const list = byMaster.get(port) ?? [];
    byMaster.set(port, list);
    if (list.length < KEYS_PER_MASTER) list.push(id);
  }
  for (const ids of byMaster.values()) ids.forEach((id, i) => (specs[id] = { secret: generateKey(), ...(i < 4 ? { rpm: 1_000_000 } : { rpm: 5 }) }));
  const config = { redis: { url: cluster.url, prefix, timeoutMs: TIMEOUT_MS, onError: 'open' }, logging: { level: 'warn' } };
  a = await startHarness({ upstream: up.url, keys: specs, config });
  b = await startHarness({ upstream: up.url, keys: specs, config });
});
after(async () => {
  agent.destroy();
  await Promise.all([a?.close(), b?.close()]);
  await up?.close();
  await cluster?.stop();
});

const failOpen = (): number => a.sidecar.limiter.stats().failOpenAdmissions + b.sidecar.limiter.stats().failOpenAdmissions;

/** The master serving `slot` as the node at `port` sees it (never asks the hung node). */
async function masterVia(port: number, slot: number): Promise<number | null> {
  const out = await cluster.cli(port, 'cluster', 'nodes').catch(() => '');
  for (const line of out.split('\n')) {
    const f = line.split(' ');
    if (f.length < 9 || !f[2]!.includes('master') || f[2]!.includes('fail')) continue;
    for (const range of f.slice(8)) {
      const [lo, hi] = range.split('-').map(Number);
      if (lo !== undefined && !Number.isNaN(lo) && slot >= lo && slot <= (hi ?? lo)) return Number(f[1]!.split(/[:@]/)[1]);
    }
  }
  return null;
}

test('a master that hangs: once its replica is promoted, both sidecars use it within the node timeout plus 5 s', { timeout: 60_000 }, async (t) => {
  const [hung, witness] = [...byMaster.keys()];
  const hungKeys = byMaster.get(hung!)!;
  const burstKey = hungKeys[4]!;
  const slot = hashSlot(`{${prefix}:k:${burstKey}}`);
  const loadKeys = [...byMaster.values()].flatMap((ids) => ids.slice(0, 4));
  const load = startLoad({ urls: [a.url, b.url], keys: loadKeys.map((id) => a.keys[id]!), clients: 8 });
  const fallbacks = trackLastChange(failOpen);
  const node = cluster.nodes.find((n) => n.port === hung)!;
  try {
    await waitFor(() => load.samples.length > 200, 10_000, 'load to run');
    const stoppedAt = performance.now();
    node.server.proc.kill('SIGSTOP');
    await waitFor(async () => {
      const m = await masterVia(witness!, slot);
      return m !== null && m !== hung;
    }, 20_000, 'the replica to be promoted', 50);
    const promotedAt = performance.now();
    await waitFor(() => performance.now() - Math.max(fallbacks.last(), promotedAt) >= 500, NODE_TIMEOUT_MS + 5_000, 'the sidecars to use the promoted replica', 20);
    const exactAgainMs = Math.round(Math.max(0, fallbacks.last() - promotedAt));
    const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => chatRequest((i % 2 ? a : b).url, a.keys[burstKey]!, agent)));
    const admitted = rs.filter((r) => r.status === 200).length;
    printFigures(t, 'cluster stall', { promotionAfterStopMs: Math.round(promotedAt - stoppedAt), exactAgainAfterPromotionMs: exactAgainMs, burstAfterPromotion: `${admitted} of 6 (rpm 5)` });
    assert.ok(failOpen() > 0, 'the hang was felt');
    assert.ok(exactAgainMs <= NODE_TIMEOUT_MS + 5_000, `fallback admissions ${exactAgainMs} ms after the promotion`);
    assert.equal(admitted, 5, 'the burst after the promotion is exact across both sidecars');
  } finally {
    fallbacks.stop();
    node.server.proc.kill('SIGCONT');
    await load.stop();
  }
});

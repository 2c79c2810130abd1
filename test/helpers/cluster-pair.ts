/**
 * Two sidecars (`onError: open`) sharing a real 3-master/3-replica Redis Cluster
 * (`cluster-require-full-coverage no`) in front of an upstream that reports usage, with
 * `keysPerMaster` keys on each master: what the Cluster fault tests start from.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { generateKey } from '../../src/auth/keyformat.js';
import { hashSlot } from '../../src/limits/redis/hash-slot.js';
import { chatRequest } from './load.js';
import { type LocalCluster, startRedisCluster } from './redis-cluster.js';
import { type Harness, type KeySpec, startHarness } from './sidecar.js';
import { type FakeUpstream, startFakeUpstream } from './upstream.js';

export interface ClusterPair {
  cluster: LocalCluster;
  a: Harness;
  b: Harness;
  /** key ids by the port of the master that serves them, `keysPerMaster` each */
  byMaster: Map<number, string[]>;
  /** sends `n` requests at once on key `id`, alternating between the sidecars; returns the number admitted */
  burst(id: string, n: number): Promise<number>;
  /** admissions both sidecars took in process because Redis failed */
  failOpen(): number;
  agent: http.Agent;
  close(): Promise<void>;
}

export interface ClusterPairOptions {
  prefix: string;
  nodeTimeoutMs: number;
  /** redis.timeoutMs */
  timeoutMs: number;
  keysPerMaster: number;
  /** the limits of the i-th key on each master */
  spec(i: number): Omit<KeySpec, 'secret'>;
}

export async function startClusterPair(o: ClusterPairOptions): Promise<ClusterPair> {
  const cluster = await startRedisCluster({ masters: 3, replicas: 1, fullCoverage: false, nodeTimeoutMs: o.nodeTimeoutMs });
  const up: FakeUpstream = await startFakeUpstream((_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'x', usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } }));
  });
  const byMaster = new Map<number, string[]>();
  for (let i = 0; byMaster.size < 3 || [...byMaster.values()].some((ks) => ks.length < o.keysPerMaster); i++) {
    const id = `k${i}`;
    const port = await cluster.masterOf(hashSlot(`{${o.prefix}:k:${id}}`));
    assert.ok(port, 'every slot has a master');
    const list = byMaster.get(port) ?? [];
    byMaster.set(port, list);
    if (list.length < o.keysPerMaster) list.push(id);
  }
  const specs: Record<string, KeySpec> = {};
  for (const ids of byMaster.values()) ids.forEach((id, i) => (specs[id] = { secret: generateKey(), ...o.spec(i) }));
  const config = { redis: { url: cluster.url, prefix: o.prefix, timeoutMs: o.timeoutMs, onError: 'open' }, logging: { level: 'warn' } };
  const a = await startHarness({ upstream: up.url, keys: specs, config });
  const b = await startHarness({ upstream: up.url, keys: specs, config });
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  return {
    cluster,
    a,
    b,
    byMaster,
    agent,
    async burst(id, n) {
      const rs = await Promise.all(Array.from({ length: n }, (_, i) => chatRequest((i % 2 ? a : b).url, a.keys[id]!, agent)));
      for (const r of rs) assert.ok(r.status === 200 || r.headers['x-keyward-error'] === 'rpm_exceeded', `unexpected ${r.status}`);
      return rs.filter((r) => r.status === 200).length;
    },
    failOpen: () => a.sidecar.limiter.stats().failOpenAdmissions + b.sidecar.limiter.stats().failOpenAdmissions,
    async close() {
      agent.destroy();
      await Promise.all([a.close(), b.close()]);
      await up.close();
      await cluster.stop();
    },
  };
}

/**
 * A master of a real 3-master/3-replica Redis Cluster killed under load, behind two sidecars
 * sharing it (`cluster-require-full-coverage no`). Measured: the slowest answer, the
 * admissions that went to the fallback, the time until limits are exact again. Shown: a key
 * on a healthy shard stays exact while the master is gone, and once the sidecars follow the
 * promotion (within DESIGN's node timeout plus 5 s) the first burst on a key of the failed
 * shard is exact, fresh or already partly spent.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { hashSlot } from '../../src/limits/redis/hash-slot.js';
import { type Sample, chatRequest, percentile, printFigures, startLoad, trackLastChange } from '../helpers/load.js';
import { type ClusterPair, startClusterPair } from '../helpers/cluster-pair.js';
import type { LocalCluster } from '../helpers/redis-cluster.js';
import { waitFor } from '../helpers/redis-server.js';
import type { Harness } from '../helpers/sidecar.js';

const TIMEOUT_MS = 100;
const NODE_TIMEOUT_MS = 2_000;
/** 8 load keys, a fresh and a healthy shard's burst key, and the candidates to spend three of. */
const KEYS_PER_MASTER = 18;
const prefix = `kws${randomBytes(3).toString('hex')}`;

let pair: ClusterPair;
let cluster: LocalCluster;
let a: Harness;
let b: Harness;
let agent: http.Agent;
/** Key ids by the port of the master that serves them. */
let byMaster: Map<number, string[]>;

before(async () => {
  // Per master: 8 keys for the load, then one for each burst below (the rest are the
  // candidates spendThreeInRedis may pass over).
  pair = await startClusterPair({
    prefix,
    nodeTimeoutMs: NODE_TIMEOUT_MS,
    timeoutMs: TIMEOUT_MS,
    keysPerMaster: KEYS_PER_MASTER,
    spec: (i) => (i < 8 ? { rpm: 1_000_000, concurrency: 50 } : { rpm: 5 }),
  });
  ({ cluster, a, b, agent, byMaster } = pair);
});
after(async () => {
  await pair?.close();
});

const burst = (id: string, n: number): Promise<number> => pair.burst(id, n);
const failOpen = (): number => pair.failOpen();

test('a master killed under load: answers stay fast, healthy shards stay exact, the promoted replica is used at once', { timeout: 60_000 }, async (t) => {
  const [dead, ...healthy] = [...byMaster.keys()];
  const deadKeys = byMaster.get(dead!)!;
  const healthyKeys = healthy.flatMap((p) => byMaster.get(p)!);
  const loadKeys = loadKeysOf(byMaster);
  const [onHealthy] = [byMaster.get(healthy[0]!)![8]!];
  const fresh = deadKeys[8]!;

  // Before: 3 of `spent`'s 5 go, counted in Redis, and the replica has them before its master dies.
  const spent = await spendThreeInRedis(deadKeys.slice(9), loadKeysOf(byMaster));
  const replicaPort = await waitForReplicaInSync(dead!);

  const load = startLoad({ urls: [a.url, b.url], keys: loadKeys.map((id) => a.keys[id]!), clients: 12 });
  const fallbacks = trackLastChange(failOpen);
  try {
    await waitFor(() => load.samples.length > 200, 10_000, 'load to run');
    const failOpenBefore = failOpen();
    const node = cluster.nodes.find((n) => n.port === dead)!;
    const killedAt = performance.now();
    node.server.proc.kill('SIGKILL');
    await node.server.exited;

    // While the master is gone: 6 at once on a healthy shard's rpm-5 key admit 5, across both sidecars.
    const healthyAdmitted = await burst(onHealthy, 6);
    const ranBeforePromotion = (await cluster.masterOf(hashSlot(`{${prefix}:k:${fresh}}`))) !== replicaPort;
    printFigures(t, 'cluster failover', { healthyShardBurst: `${healthyAdmitted} of 6 (rpm 5)`, healthyBurstBeforePromotion: ranBeforePromotion });
    assert.equal(healthyAdmitted, 5, 'a key on a healthy shard keeps its shared limit');
    assert.ok(ranBeforePromotion, 'the burst ran before the promotion');

    const slot = hashSlot(`{${prefix}:k:${fresh}}`);
    await waitFor(async () => (await cluster.masterOf(slot)) === replicaPort && (await cluster.healthy()), 20_000, 'the replica to be promoted', 20);
    const promotedAt = performance.now();
    // DESIGN: exact again within the node timeout plus 5 s of the promotion. A sidecar follows
    // once its slot map names the new master (re-read every 250 ms while a shard is down); then
    // the load on the failed shard's keys stops falling back.
    await waitFor(() => performance.now() - Math.max(fallbacks.last(), promotedAt) >= 300, NODE_TIMEOUT_MS + 5_000, 'the sidecars to use the promoted replica', 20);
    const followedMs = Math.max(0, Math.round(fallbacks.last() - promotedAt));
    // Then the first burst on a fresh key and on a partly spent key of the failed shard.
    const [freshAdmitted, spentAdmitted] = await Promise.all([burst(fresh, 6), burst(spent, 4)]);
    printFigures(t, 'cluster failover', { followedPromotionMs: followedMs, freshKeyBurstAfterPromotion: `${freshAdmitted} of 6 (rpm 5)`, spentKeyBurstAfterPromotion: `${spentAdmitted} of 4 (2 left)` });
    assert.equal(freshAdmitted, 5, 'the first burst after the promotion is exact');
    assert.equal(spentAdmitted, 2, 'the promoted replica carries what its master had counted');

    await new Promise((r) => setTimeout(r, 1_500)); // load keeps running on the whole Cluster again
    const samples = await load.stop();
    fallbacks.stop();
    const after = samples.filter((s) => s.at >= killedAt);
    const report = summarize(after, { killedAt, promotedAt, lastFallback: fallbacks.last(), fallbacks: failOpen() - failOpenBefore });
    printFigures(t, 'cluster failover', report);

    assert.deepEqual([...new Set(after.map((s) => s.status))], [200], 'every request answered 200');
    assert.ok(report.fallbackAdmissions > 0, 'the kill was felt');
    assert.ok(report.slowestMs < 1_000, `slowest answer ${report.slowestMs} ms`);
    // DESIGN: exact again within the node timeout plus 5 s of the promotion.
    assert.ok(report.exactAgainAfterPromotionMs <= NODE_TIMEOUT_MS + 5_000, `fallback admissions ${report.exactAgainAfterPromotionMs} ms after the promotion`);
    assert.ok(healthyKeys.length > 0);
  } finally {
    fallbacks.stop();
    await load.stop();
  }
});

const loadKeysOf = (keys: Map<number, string[]>): string[] => [...keys.values()].flatMap((ids) => ids.slice(0, 8));

/**
 * Takes 3 of an rpm-5 key's 5 in Redis and returns that key. Just after start a sidecar's
 * first calls to the Cluster may pass the 100 ms timeout and be admitted in process
 * (onError: open), which Redis never counts: both sidecars are warmed on load keys first,
 * and a burst that still fell back leaves its key for the next of the nine candidates.
 */
async function spendThreeInRedis(candidates: string[], warmKeys: string[]): Promise<string> {
  // Warm until two rounds in a row stayed in Redis: on a loaded host one clean round can be luck.
  for (let round = 0, clean = 0; round < 30 && clean < 2; round++) {
    const before = failOpen();
    await Promise.all([a, b].flatMap((h) => warmKeys.map((id) => chatRequest(h.url, h.keys[id]!, agent))));
    clean = failOpen() === before ? clean + 1 : 0;
  }
  for (const id of candidates) {
    const before = failOpen();
    const admitted = await burst(id, 3);
    if (failOpen() !== before) continue;
    assert.equal(admitted, 3);
    return id;
  }
  throw new Error('every first burst fell back to the in-process limiter');
}

/** Waits until the replica of `masterPort` has every write of its master; returns the replica's port. */
async function waitForReplicaInSync(masterPort: number): Promise<number> {
  let replicaPort = 0;
  await waitFor(async () => {
    const info = await cluster.cli(masterPort, 'info', 'replication');
    const m = /slave0:ip=[^,]+,port=(\d+),state=online,offset=(\d+)/.exec(info);
    const own = /master_repl_offset:(\d+)/.exec(info);
    if (!m || !own) return false;
    replicaPort = Number(m[1]);
    return Number(m[2]) >= Number(own[1]);
  }, 5_000, 'the replica to catch up', 10);
  return replicaPort;
}

function summarize(s: Sample[], t: { killedAt: number; promotedAt: number; lastFallback: number; fallbacks: number }) {
  const ms = s.map((x) => x.ms);
  return {
    requests: s.length,
    slowestMs: Math.round(Math.max(...ms)),
    p99Ms: Math.round(percentile(ms, 99)),
    fallbackAdmissions: t.fallbacks,
    promotionAfterKillMs: Math.round(t.promotedAt - t.killedAt),
    exactAgainAfterKillMs: Math.round(Math.max(t.lastFallback, t.killedAt) - t.killedAt),
    exactAgainAfterPromotionMs: Math.round(Math.max(0, t.lastFallback - t.promotedAt)),
  };
}

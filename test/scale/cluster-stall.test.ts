/**
 * A master of a real 3-master/3-replica Redis Cluster that hangs (SIGSTOP: no error, no
 * redirection, no closed connection: a frozen VM, a partition that drops packets) under
 * load, behind two sidecars. Shown: once the replica is promoted, the sidecars use it
 * within DESIGN's node timeout plus 5 s (section 6, "Scale and faults"), and a burst on a
 * key of the hung shard is exact again across both.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { hashSlot } from '../../src/limits/redis/hash-slot.js';
import { type ClusterPair, startClusterPair } from '../helpers/cluster-pair.js';
import { printFigures, startLoad, trackLastChange } from '../helpers/load.js';
import { waitFor } from '../helpers/redis-server.js';

const TIMEOUT_MS = 100;
const NODE_TIMEOUT_MS = 2_000;
const prefix = `kwst${randomBytes(3).toString('hex')}`;

let pair: ClusterPair;

before(async () => {
  // per master: 4 load keys, then an rpm-5 key for the burst
  pair = await startClusterPair({ prefix, nodeTimeoutMs: NODE_TIMEOUT_MS, timeoutMs: TIMEOUT_MS, keysPerMaster: 5, spec: (i) => (i < 4 ? { rpm: 1_000_000 } : { rpm: 5 }) });
});
after(async () => {
  await pair?.close();
});

test('a master that hangs: once its replica is promoted, both sidecars use it within the node timeout plus 5 s', { timeout: 60_000 }, async (t) => {
  const { a, b, cluster, byMaster, failOpen } = pair;
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
      const m = await cluster.masterOf(slot, witness);
      return m !== null && m !== hung;
    }, 20_000, 'the replica to be promoted', 50);
    const promotedAt = performance.now();
    await waitFor(() => performance.now() - Math.max(fallbacks.last(), promotedAt) >= 500, NODE_TIMEOUT_MS + 5_000, 'the sidecars to use the promoted replica', 20);
    const exactAgainMs = Math.round(Math.max(0, fallbacks.last() - promotedAt));
    const admitted = await pair.burst(burstKey, 6);
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

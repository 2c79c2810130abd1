import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { Cluster } from 'ioredis';
import { createRedisClient } from '../../src/limits/client.js';
import type { Limiter } from '../../src/limits/limiter.js';
import { type LocalCluster, startRedisCluster } from '../helpers/redis-cluster.js';
import { redisHarness } from '../helpers/redis-harness.js';
import { keyBudget, projectBudget, wallet } from '../helpers/limits-conformance-ledger.js';
import { input, leaseOf, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';
import { createRedisLimiter } from '../../src/limits/redis.js';

let cluster: LocalCluster;
before(async () => {
  cluster = await startRedisCluster(3);
});
after(async () => cluster?.stop());

runLimiterConformance('redis cluster (3 masters)', () => redisHarness({ url: cluster.url }));
runLimiterConformance('redis cluster (3 masters) with bucket slices', () => redisHarness({ url: cluster.url, lease: { sliceMs: 1000 } }));

describe('redis cluster: route and key live in different slots', () => {
  let client: Cluster;
  let lim: Limiter;
  const prefix = uid('kwtest');
  before(async () => {
    client = createRedisClient({ url: cluster.url, timeoutMs: 2_000 }) as Cluster;
    await new Promise((resolve) => client.once('ready', resolve));
    lim = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000 });
  });
  after(async () => {
    await lim.close();
    client.disconnect();
  });

  test('keys are spread over the masters and admission still works for each', async () => {
    const route = { name: uid('route'), concurrency: 50, rpm: 1000 };
    const keys = Array.from({ length: 30 }, () => uid('k'));
    const rs = await Promise.all(keys.map((k) => lim.admit(input(k, { limits: { rpm: 1, concurrency: 1 }, route }))));
    assert.ok(rs.every((r) => r.ok));
    const slotsByNode = new Set<string>();
    for (const k of keys) {
      const slot = await client.cluster('KEYSLOT', `{${prefix}:k:${k}}:rpm`);
      const owner = (await client.cluster('SLOTS')).find((s) => (s[0] as number) <= slot && slot <= (s[1] as number));
      slotsByNode.add(String((owner?.[2] as unknown[])?.[1]));
    }
    assert.ok(slotsByNode.size >= 2, 'keys land on more than one master');
    for (const r of rs) leaseOf(r).finish({ tokens: null });
  });

  test('a hold on several holders is one script in the slot of its tag, on every master', async () => {
    const tags = Array.from({ length: 30 }, () => uid('p'));
    const rs = await Promise.all(
      tags.map((tag) =>
        lim.hold({
          requestId: uid('req'),
          tag,
          holders: [keyBudget(uid('k'), { base: 0, limit: 1 }), projectBudget(tag, { base: 0, limit: 1 }), wallet(uid('u'), { base: 1 })],
          amount: 0.5,
        }),
      ),
    );
    assert.ok(rs.every((r) => r.ok));
    const owners = new Set<string>();
    const slots = await client.cluster('SLOTS');
    for (const tag of tags) {
      const slot = await client.cluster('KEYSLOT', `{${prefix}:t:${tag}}:l:x`);
      owners.add(String((slots.find((s) => (s[0] as number) <= slot && slot <= (s[1] as number))?.[2] as unknown[])?.[1]));
    }
    assert.ok(owners.size >= 2, 'tags land on more than one master');
    for (const r of rs) if (r.ok) r.hold.settle(0.25);
  });
});

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Cluster } from 'ioredis';
import { createRedisClient, disconnectRedisClient, whenServing } from '../../src/limits/redis/client.js';
import type { Limiter } from '../../src/limits/limiter.js';
import { type LocalCluster, startRedisCluster } from '../helpers/redis-cluster.js';
import { blocksIn, redisHarness } from '../helpers/redis-harness.js';
import { keyBudget, projectBudget, wallet } from '../helpers/limits-conformance-ledger.js';
import { input, leaseOf, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';
import { createRedisLimiter } from '../../src/limits/redis/limiter.js';
import { scriptRunner } from '../../src/limits/redis/scripts.js';

let cluster: LocalCluster;
before(async () => {
  cluster = await startRedisCluster(3);
});
after(async () => cluster?.stop());

runLimiterConformance('redis cluster (3 masters)', () => redisHarness({ url: cluster.url }));
runLimiterConformance('redis cluster (3 masters) with leasing (bucket slices, slot blocks, spend slices)', () => redisHarness({ url: cluster.url, lease: { sliceMs: 1000 } }));

describe('redis cluster: route and key live in different slots', () => {
  let client: Cluster;
  let lim: Limiter;
  const prefix = uid('kwtest');
  before(async () => {
    client = createRedisClient({ url: cluster.url, timeoutMs: 2_000 }) as Cluster;
    await whenServing(client);
    lim = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000 });
  });
  after(async () => {
    await lim.close();
    disconnectRedisClient(client);
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

  test('the calls of one event-loop turn, over every master, each get their own answer', async (t) => {
    // A connection of its own: the limiter's timers (settlement batch, refresh) write on the other.
    const own = createRedisClient({ url: cluster.url, timeoutMs: 2_000 }) as Cluster;
    t.after(() => disconnectRedisClient(own));
    await whenServing(own);
    const run = scriptRunner(own);
    const keys = Array.from({ length: 30 }, () => `{${prefix}:k:${uid('k')}}`);
    await own.set(`${keys[0]}:rpm`, 'not a bucket');
    const peekAll = () => Promise.allSettled(keys.map((k, i) => run('keywardPeek', [`${k}:rpm`, `${k}:tpm`], [10 + i, 0])));
    // twice: the first turn sends EVAL on each connection, the second EVALSHA
    for (let round = 0; round < 2; round++) {
      const figures = await peekAll();
      assert.equal(figures[0]!.status, 'rejected', 'the call on a key that is not a bucket fails alone');
      for (let i = 1; i < keys.length; i++) {
        const f = figures[i]!;
        assert.ok(f.status === 'fulfilled' && (f.value as number[])[0] === 10 + i, `call ${i} got its own answer`);
      }
    }
    await own.del(`${keys[0]}:rpm`);
  });

  test('a hold on several holders is one script in the slot of its tag, on every master', async () => {
    const tags = Array.from({ length: 30 }, () => uid('p'));
    const rs = await Promise.all(
      tags.map((tag) =>
        lim.hold({
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

describe('redis cluster: blocks of concurrency slots', () => {
  const prefix = uid('kwtest');
  const clients: Cluster[] = [];
  const lims: ReturnType<typeof createRedisLimiter>[] = [];
  before(async () => {
    for (let i = 0; i < 2; i++) {
      const c = createRedisClient({ url: cluster.url, timeoutMs: 2_000 }) as Cluster;
      await whenServing(c);
      clients.push(c);
      lims.push(createRedisLimiter({ redis: c, prefix, leaseMs: 30_000, lease: { sliceMs: 1000 } }));
    }
  });
  after(async () => {
    for (const l of lims) await l.close();
    for (const c of clients) disconnectRedisClient(c);
  });

  test('six keys over the masters: far from the limit a block, near it C+1 at once across two instances admit exactly C', async () => {
    const C = 64;
    const limits = { concurrency: C };
    const [a, b] = lims as [(typeof lims)[0], (typeof lims)[0]];
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        const key = uid('k');
        for (let i = 0; i < 10; i++) leaseOf(await a.admit(input(key, { limits }))).finish({ tokens: null });
        const blocks = blocksIn(await clients[0]!.zrange(`{${prefix}:k:${key}}:conc`, '0', '-1'));
        assert.equal(blocks.size, 1, 'a block is recorded under the key');
        const [slots] = [...blocks.values()];
        assert.deepEqual(slots, Array.from({ length: slots!.length }, (_, j) => j + 1), 'its members are #1..#k');
        assert.ok(slots!.length >= 2, `a block of several slots (${slots!.length})`);
        const held = [];
        for (let i = 0; i < 40; i++) held.push(leaseOf(await (i % 2 ? a : b).admit(input(key, { limits }))));
        const rs = await Promise.all(Array.from({ length: C - 40 + 1 }, (_, i) => (i % 2 ? a : b).admit(input(key, { limits }))));
        assert.equal(rs.filter((r) => r.ok).length, C - 40, `${C - 40} free, ${C - 40 + 1} sent`);
        for (const l of held) l.finish({ tokens: null });
        for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
      }),
    );
    assert.ok(a.slotBlocksHeld() > 0);
  });
});

test('a Cluster client closed while it reads the slot map lets its process exit', { timeout: 60_000 }, async () => {
  const main = join(import.meta.dirname, '../helpers/cluster-close-main.ts');
  const child = spawn(process.execPath, ['--import', 'tsx', main, cluster.url], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b));
  const exited = once(child, 'exit');
  // The slot-map timer that outlives the close reads every second forever; the close's
  // own wait is about 2 s. 20 s is far past both.
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'still running'>((resolve) => (timer = setTimeout(() => resolve('still running'), 20_000)));
  const first = await Promise.race([exited.then(([code]) => code), late]);
  clearTimeout(timer);
  if (first === 'still running') child.kill('SIGKILL');
  assert.equal(out, 'closed\n', 'the client was closed from inside a slot-map read');
  assert.equal(first, 0, 'the process exited by itself');
});

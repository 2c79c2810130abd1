/**
 * News of over-committed ledgers (src/limits/redis/ledger-news.ts) under a Redis user whose
 * ACL allows no pub/sub channel, as Redis 7 gives new users by default: settle.lua's publish
 * is refused, yet every settlement applies and none counts as a Redis error, and another
 * instance still stops at its own next settlement's answer, the path there was before.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { type Cluster, Redis } from 'ioredis';
import { createRedisClient, whenServing } from '../../src/limits/redis/client.js';
import { createRedisLimiter, type RedisLimiter } from '../../src/limits/redis/limiter.js';
import { held, keyBudget, refused, req } from '../helpers/limits-conformance-ledger.js';
import { uid } from '../helpers/redis-limits-conformance.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const admin = new Redis(TEST_REDIS_URL, { lazyConnect: true });
const user = uid('kw-nochannels');
const password = uid('pw');
const prefix = uid('kwtest');
const clients: (Redis | Cluster)[] = [];
const errors: string[] = [];

async function instance(): Promise<RedisLimiter> {
  const url = new URL(TEST_REDIS_URL);
  url.username = user;
  url.password = password;
  const client = createRedisClient({ url: url.toString(), timeoutMs: 2_000 });
  clients.push(client);
  await whenServing(client);
  const limiter = createRedisLimiter({ redis: client, prefix, leaseMs: 30_000, lease: { sliceMs: 1000 }, onError: (op, err) => errors.push(`${op}: ${(err as Error).message}`) });
  await limiter.listening();
  return limiter;
}

before(async () => {
  await admin.connect();
  await admin.call('ACL', 'SETUSER', user, 'on', `>${password}`, '~*', '+@all', 'resetchannels');
});
after(async () => {
  await deleteByPrefix(admin, prefix);
  await admin.call('ACL', 'DELUSER', user);
  for (const c of clients) c.disconnect();
  admin.disconnect();
});

test('a user without channels: the publish is refused, the settlements apply, and another instance stops at its next settlement', async () => {
  const a = await instance();
  const b = await instance();
  try {
    assert.match(String(await admin.call('ACL', 'DRYRUN', user, 'PUBLISH', 'keyward:ledger-over', 'x')), /permissions|channel/i, 'the user may not publish');
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 10 });
    const over = held(await a.hold(req(tag, [key], 0.01)));
    for (let i = 0; i < 40; i++) held(await (i % 2 ? b : a).hold(req(tag, [key], 0.01))).settle(0.01);
    assert.ok(a.spendSlicesHeld() > 0 && b.spendSlicesHeld() > 0, 'both instances hold spend slices');
    over.settle(10);
    refused(await a.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
    // b heard nothing; its own settlement's answer tells it its slice is void
    const onB = await b.hold(req(tag, [key], 0.01));
    if (onB.ok) onB.hold.settle(0.01);
    await b.ledger({ tag, holders: [key] });
    refused(await b.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
    const [figure] = await a.ledger({ tag, holders: [key] });
    assert.ok(figure!.live >= 10, `the overspend counts in Redis (live ${figure!.live})`);
    assert.deepEqual(errors, [], 'no settlement failed');
  } finally {
    await a.close();
    await b.close();
  }
});

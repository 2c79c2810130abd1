import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createRedisLimiter } from '../../src/limits/redis.js';
import { redisHarness } from '../helpers/redis-harness.js';
import { input, leaseOf, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';

const URL = process.env.KW_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

runLimiterConformance('redis (single node)', () => redisHarness({ url: URL }));

describe('redis limiter: key layout and expiry', () => {
  let redis: Redis;
  const prefix = uid('kwtest');
  before(() => {
    redis = new Redis(URL);
  });
  after(async () => {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, found] = await redis.scan(cursor, 'MATCH', `{${prefix}:*`, 'COUNT', 500);
      cursor = next;
      keys.push(...found);
    } while (cursor !== '0');
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  test("one key's state shares a hash tag; every key has a TTL; full buckets go away", async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const route = { name: 'route a', concurrency: 5, rpm: 100 };
    const lease = leaseOf(await lim.admit(input('k_1', { limits: { rpm: 10, tpm: 1000, concurrency: 2 }, tokens: 100, route })));
    const tag = `{${prefix}:k:k_1}`;
    const rtag = `{${prefix}:r:route%20a}`;
    for (const k of [`${tag}:rpm`, `${tag}:tpm`, `${tag}:conc`, `${rtag}:rpm`, `${rtag}:conc`]) {
      const ttl = await redis.pttl(k);
      assert.ok(ttl > 0, `${k} has a TTL (${ttl})`);
    }
    // A bucket expires once it would be full again: 1 of 10 per minute is 6 s, 100 of 1000 is 6 s.
    assert.ok((await redis.pttl(`${tag}:rpm`)) <= 6_000);
    assert.ok((await redis.pttl(`${tag}:conc`)) <= 5_000);
    lease.finish({ tokens: 0 });
    await lim.close(); // waits for the settlement
    assert.equal(await redis.exists(`${tag}:tpm`), 0, 'a full TPM bucket is deleted');
    assert.equal(await redis.zcard(`${tag}:conc`), 0);
    assert.equal(await redis.zcard(`${rtag}:conc`), 0);
  });
});

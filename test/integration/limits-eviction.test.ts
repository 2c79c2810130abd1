/**
 * A Redis that may evict keyward's keys (maxmemory with a policy other than noeviction)
 * would turn limits off without an error anywhere: every key keyward writes has a TTL, so
 * volatile-* policies take them first. The limiter says so in a warning when it connects.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createLimiter } from '../../src/limits/create.js';
import { evictionRiskOf } from '../../src/limits/redis/eviction.js';
import { spawnRedisOnSomePort, type RedisProcess } from '../helpers/redis-server.js';
import { EventEmitter } from 'node:events';

const servers: RedisProcess[] = [];
after(async () => {
  for (const s of servers) await s.stop();
});

async function limiterOn(extra: string[]) {
  const { port, server } = await spawnRedisOnSomePort(() => ['--save', '', '--appendonly', 'no', ...extra]);
  servers.push(server);
  const events = new EventEmitter();
  const lines: { event: string; fields: Record<string, unknown> }[] = [];
  const limiter = createLimiter({
    leaseMs: 30_000,
    redis: { url: `redis://127.0.0.1:${port}`, prefix: 'kwevict', timeoutMs: 500, onError: 'open', lease: { enabled: true, sliceMs: 1000 } },
    log: (event, fields) => {
      lines.push({ event, fields });
      events.emit(event, fields);
    },
  });
  return { limiter, lines, events };
}

test('maxmemory with volatile-lru: one warning naming the policy', { timeout: 5_000 }, async () => {
  const { limiter, events } = await limiterOn(['--maxmemory', '64mb', '--maxmemory-policy', 'volatile-lru']);
  const [fields] = (await once(events, 'limits_redis_may_evict')) as [Record<string, unknown>];
  assert.equal(fields.policy, 'volatile-lru');
  assert.equal(fields.maxmemory, 64 * 1024 * 1024);
  assert.match(String(fields.hint), /noeviction/);
  await limiter.close();
});

test('noeviction, or no maxmemory: no warning', async () => {
  for (const extra of [['--maxmemory', '64mb', '--maxmemory-policy', 'noeviction'], ['--maxmemory-policy', 'allkeys-lru']]) {
    const { limiter, lines } = await limiterOn(extra);
    // The check runs at once on connecting; a round trip later it has answered.
    await limiter.peek({ keyId: 'k', limits: { rpm: 1, tpm: null, concurrency: null } });
    await limiter.peek({ keyId: 'k', limits: { rpm: 1, tpm: null, concurrency: null } });
    assert.deepEqual(lines.filter((l) => l.event === 'limits_redis_may_evict'), [], extra.join(' '));
    await limiter.close();
  }
});

test('INFO memory read: maxmemory 0 is no limit, whatever the policy', () => {
  assert.equal(evictionRiskOf('maxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n', 'n'), null);
  assert.deepEqual(evictionRiskOf('maxmemory:1024\r\nmaxmemory_policy:allkeys-lfu\r\n', 'n'), { node: 'n', policy: 'allkeys-lfu', maxmemory: 1024 });
  assert.equal(evictionRiskOf('maxmemory:1024\r\nmaxmemory_policy:noeviction\r\n', 'n'), null);
});

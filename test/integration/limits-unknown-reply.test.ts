/**
 * A script reply this build does not know (an outcome, code or check that another version of
 * a script could send) is an error, never a refusal: the Redis limiter rejects with
 * UnknownScriptReplyError and counts it, and the failover rules apply `onError` as for any
 * Redis failure. The scripts are replaced on a real Redis connection under the command names
 * the limiter runs them by (ioredis' defineCommand, before the limiter defines its own).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import { admitWithFailover, type Failover, HashTags, Shards } from '../../src/limits/failover.js';
import { RedisGuard } from '../../src/limits/failover-guard.js';
import { holdWithFailover } from '../../src/limits/failover-money.js';
import type { AdmitInput, HoldInput } from '../../src/limits/limiter.js';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import { createRedisClient, whenServing } from '../../src/limits/redis/client.js';
import { createRedisLimiter, type RedisLimiter } from '../../src/limits/redis/limiter.js';
import { UnknownScriptReplyError } from '../../src/limits/redis/replies.js';
import { keyBudget } from '../helpers/limits-conformance-ledger.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';
import { input, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

/** Each script answers by what its first key names: the test picks the answer through the key id or tag. */
const NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000";
const FAKE_ADMIT = `${NOW}
if string.find(KEYS[1], 'outcome', 1, true) then return {7, 0, 0, now} end
if string.find(KEYS[1], 'mismatch', 1, true) then return {0, 2, 100, now, 0, 0, 0, 0, 1} end
if string.find(KEYS[1], 'nocheck', 1, true) then return {0, 2, 100, now} end
if string.find(KEYS[1], 'text', 1, true) then return 'admitted' end
return {0, 9, 100, now, 0, 0, 0, 0, 3}`;
const FAKE_LEASE = `${NOW}
if string.find(KEYS[1], 'outcome', 1, true) then return {2, 0, 0, now} end
return {0, 1, 100, now, 0, 0, 0, 0, 0}`;
const FAKE_HOLD = `${NOW}
if string.find(KEYS[1], 'outcome', 1, true) then return {now, 5, 0} end
if string.find(KEYS[1], 'text', 1, true) then return 'held' end
return {now, 0, 9}`;

let client: Redis;
let prefix: string;

/** A client whose admit, lease and hold scripts answer as above. */
async function fakedClient(): Promise<Redis> {
  const c = createRedisClient({ url: TEST_REDIS_URL, timeoutMs: 2_000 }) as Redis;
  c.defineCommand('keywardAdmit', { lua: FAKE_ADMIT });
  c.defineCommand('keywardLease', { lua: FAKE_LEASE });
  c.defineCommand('keywardHold', { lua: FAKE_HOLD });
  await whenServing(c);
  return c;
}

before(async () => {
  client = await fakedClient();
  prefix = uid('kwunknown');
});
after(async () => {
  await deleteByPrefix(client, prefix);
  client.disconnect();
});

const rpmKey = (what: string): AdmitInput => input(uid(what), { limits: { rpm: 10 } });
const hold = (what: string): HoldInput => ({ tag: uid(what), holders: [keyBudget(uid('k'), { base: 0, limit: 1 })], amount: 0.1 });

describe('the Redis limiter reads only replies it knows', () => {
  let lim: RedisLimiter;
  let leasing: RedisLimiter;
  const errors: string[] = [];
  before(() => {
    lim = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000, onError: (op, err) => void errors.push(`${op} ${(err as Error).name}`) });
    leasing = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000, lease: { sliceMs: 1_000 } });
  });
  after(async () => {
    await lim.close();
    await leasing.close();
  });

  test('admit.lua: an unknown code, outcome, or a check that does not answer with the code is an error, counted', async () => {
    for (const what of ['code', 'outcome', 'mismatch', 'nocheck', 'text']) {
      // Per-request path: the key has a per-model limit, so admit.lua answers even with slices on.
      await assert.rejects(lim.admit({ ...rpmKey(what), modelLimit: { pattern: '*', rpm: 5, tpm: null } }), UnknownScriptReplyError, what);
    }
    assert.equal(lim.stats().redisErrors, 5);
    assert.deepEqual(errors, Array.from({ length: 5 }, () => 'admit UnknownScriptReplyError'));
  });

  test('lease.lua: an unknown code or outcome is an error, counted', async () => {
    const before = leasing.stats().redisErrors;
    await assert.rejects(leasing.admit(rpmKey('code')), /lease\.lua answered \[0,1,100,/);
    await assert.rejects(leasing.admit(rpmKey('outcome')), UnknownScriptReplyError);
    assert.equal(leasing.stats().redisErrors, before + 2);
  });

  test('hold.lua: an unknown outcome, or a refusing holder the hold does not have, is an error, counted', async () => {
    const before = lim.stats().redisErrors;
    for (const what of ['outcome', 'holder', 'text']) await assert.rejects(lim.hold(hold(what)), UnknownScriptReplyError, what);
    assert.equal(lim.stats().redisErrors, before + 3);
    assert.equal(lim.stats().holdsHeld, 0);
  });
});

describe('through the failover rules an unknown reply is a Redis failure: onError applies', () => {
  const make = (onError: 'open' | 'closed') => {
    const shared = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000 });
    const events: string[] = [];
    const failover: Failover = {
      shared,
      local: createMemoryLimiter({ leaseMs: 5_000 }),
      shards: new Shards(client, (event) => void events.push(event)),
      guard: new RedisGuard(client, 1_000),
      tags: new HashTags(prefix),
      onError,
      failedOpen: { admissions: 0, holds: 0 },
    };
    return { failover, shared, events };
  };

  test('open: admitted and held in process, counted as fail-open and as Redis errors; never rpm_exceeded', async () => {
    const { failover, shared, events } = make('open');
    const r = await admitWithFailover(failover, rpmKey('code'));
    assert.ok(r.ok, `admitted by the in-process limiter, got ${JSON.stringify(r)}`);
    r.lease.finish({ tokens: null });
    const h = await holdWithFailover(failover, hold('outcome'));
    assert.ok(h.ok);
    h.hold.settle(0);
    assert.deepEqual(failover.failedOpen, { admissions: 1, holds: 1 });
    assert.equal(shared.stats().redisErrors, 2);
    assert.ok(events.includes('limits_redis_down'), events.join());
    await shared.close();
    await failover.local.close();
  });

  test('closed: 503 limits_unavailable for the admission and the hold', async () => {
    const { failover, shared } = make('closed');
    const r = await admitWithFailover(failover, rpmKey('mismatch'));
    assert.deepEqual(r.ok ? 'admitted' : r.code, 'limits_unavailable');
    const h = await holdWithFailover(failover, hold('holder'));
    assert.deepEqual(h.ok ? 'held' : h.code, 'limits_unavailable');
    assert.deepEqual(failover.failedOpen, { admissions: 0, holds: 0 });
    assert.equal(shared.stats().redisErrors, 2);
    await shared.close();
    await failover.local.close();
  });
});

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createRedisClient, whenServing } from '../../src/limits/redis/client.js';
import { CallTimeoutError } from '../../src/limits/redis/deadlines.js';
import { createRedisLimiter } from '../../src/limits/redis/limiter.js';
import { countWrites, redisHarness, deleteByPrefix } from '../helpers/redis-harness.js';
import { keyBudget, projectBudget, wallet } from '../helpers/limits-conformance-ledger.js';
import { denied, input, leaseOf, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const URL = TEST_REDIS_URL;

runLimiterConformance('redis (single node)', () => redisHarness({ url: URL }));

describe('redis limiter: key layout and expiry', () => {
  let redis: Redis;
  const prefix = uid('kwtest');
  before(() => {
    redis = new Redis(URL, { enableAutoPipelining: true });
  });
  after(async () => {
    await deleteByPrefix(redis, prefix);
    redis.disconnect();
  });

  test("one key's state shares a hash tag; every key has a TTL; a bucket is kept one window, then goes away", async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const route = { name: 'route a', concurrency: 5, rpm: 100 };
    const lease = leaseOf(await lim.admit(input('k_1', { limits: { rpm: 10, tpm: 1000, concurrency: 2 }, tokens: 100, route })));
    const tag = `{${prefix}:k:k_1}`;
    const rtag = `{${prefix}:r:route%20a}`;
    for (const k of [`${tag}:rpm`, `${tag}:tpm`, `${tag}:conc`, `${rtag}:rpm`, `${rtag}:conc`]) {
      const ttl = await redis.pttl(k);
      assert.ok(ttl > 0, `${k} has a TTL (${ttl})`);
    }
    // A bucket is kept one window (it would be full again sooner: 1 of 10 per minute in 6 s),
    // so that a limit raised meanwhile finds its level rather than a full bucket.
    const rpmTtl = await redis.pttl(`${tag}:rpm`);
    assert.ok(rpmTtl > 59_000 && rpmTtl <= 60_000, `rpm TTL ${rpmTtl}`);
    assert.ok((await redis.pttl(`${tag}:conc`)) <= 5_000);
    lease.finish({ tokens: 0 });
    await lim.close(); // waits for the settlement
    assert.equal(await redis.hget(`${tag}:tpm`, 't'), '1000', 'a full TPM bucket is kept, full');
    assert.ok((await redis.pttl(`${tag}:tpm`)) <= 60_000, 'and goes away a window later');
    assert.equal(await redis.zcard(`${tag}:conc`), 0);
    assert.equal(await redis.zcard(`${rtag}:conc`), 0);
  });

  // The conformance suite's cancel test limits the key alone: these check the route's and a
  // per-model limit's RPM token come back too. At 1 a minute a token back by refill takes 60 s,
  // so only the undo can admit the second request.
  test("cancel gives the route's RPM token back, as it does the key's", async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const route = { name: uid('route'), concurrency: 0, rpm: 1 };
    leaseOf(await lim.admit(input(uid('k'), { route }))).cancel();
    leaseOf(await lim.admit(input(uid('k'), { route }))).finish({ tokens: null });
    denied(await lim.admit(input(uid('k'), { route })), 'route_capacity_exceeded');
    await lim.close();
  });

  test("cancel gives a per-model limit's RPM token back", async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const model = { ...input(uid('k')), modelLimit: { pattern: 'gpt-4o*', rpm: 1, tpm: null } };
    leaseOf(await lim.admit(model)).cancel();
    leaseOf(await lim.admit(model)).finish({ tokens: null });
    denied(await lim.admit(model), 'rpm_exceeded');
    await lim.close();
  });

  test("a call is written when it is made, not held behind an earlier call's reply", async () => {
    // The production client: ioredis' auto-pipelining would hold the second call until the
    // first one's pipeline is answered, which the pause below never lets happen.
    const client = createRedisClient({ url: URL, timeoutMs: 5_000 });
    await whenServing(client);
    const lim = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000 });
    await lim.admit(input(uid('k'), { limits: { rpm: 10 } })); // scripts loaded, connection up
    const writes = countWrites(client);
    const turn = () => new Promise((resolve) => setImmediate(resolve));
    // WRITE mode holds every script call (EVAL/EVALSHA) and lets CLIENT UNPAUSE through.
    await redis.call('CLIENT', 'PAUSE', '2000', 'WRITE');
    let calls: Promise<Awaited<ReturnType<typeof lim.admit>>>[] = [];
    try {
      calls = [lim.admit(input(uid('k'), { limits: { rpm: 10, concurrency: 2 } }))];
      await turn();
      await turn();
      calls.push(lim.admit(input(uid('k'), { limits: { rpm: 10, concurrency: 2 } })));
      await turn();
      await turn();
      assert.deepEqual(writes.counts(), [2], 'the second call left while the first waited for its reply');
    } finally {
      await redis.call('CLIENT', 'UNPAUSE');
      writes.restore();
      const rs = await Promise.all(calls);
      for (const r of rs) if (r.ok) leaseOf(r).finish({ tokens: null });
      await lim.close();
      client.disconnect();
      assert.ok(rs.every((r) => r.ok), 'each call got its own answer');
    }
  });

  test('a call Redis does not answer is rejected after callTimeoutMs, with no timer of its own', async () => {
    const client = createRedisClient({ url: URL, timeoutMs: 200 });
    await whenServing(client);
    assert.equal((client as Redis).options.commandTimeout, undefined, 'the client arms no timer per command');
    const errors: unknown[] = [];
    const lim = createRedisLimiter({ redis: client, prefix, leaseMs: 5_000, callTimeoutMs: 200, onError: (_op, err) => errors.push(err) });
    await lim.admit(input(uid('k'), { limits: { rpm: 10 } })); // scripts loaded, connection up
    await redis.call('CLIENT', 'PAUSE', '3000', 'WRITE');
    try {
      const started = performance.now();
      await assert.rejects(lim.admit(input(uid('k'), { limits: { rpm: 10 } })), CallTimeoutError);
      const ms = performance.now() - started;
      assert.ok(ms >= 200 && ms < 1_500, `rejected after ${ms.toFixed(0)} ms`);
      assert.equal(errors.length, 1, 'counted as one Redis error');
    } finally {
      await redis.call('CLIENT', 'UNPAUSE');
      await lim.close();
      client.disconnect();
    }
  });

  test('per-model buckets live under the key hash tag and expire a window after their last write', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const modelLimit = { pattern: 'gpt-4o*', rpm: 10, tpm: 1000 };
    const r = await lim.admit({ ...input('k_2', { tokens: 100 }), modelLimit });
    leaseOf(r).finish({ tokens: 100 });
    const m = `{${prefix}:k:k_2}:m:gpt-4o*`;
    for (const k of [`${m}:rpm`, `${m}:tpm`]) {
      const ttl = await redis.pttl(k);
      assert.ok(ttl > 59_000 && ttl <= 60_000, `${k} is kept one window (${ttl})`);
    }
    await lim.close();
  });

  test('a raised limit finds the level its bucket had, not a full bucket (DESIGN section 12)', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const key = uid('k_raise');
    leaseOf(await lim.admit(input(key, { limits: { rpm: 600 } }))).finish({ tokens: null });
    // 1 of 600 a minute is back in 100 ms: past that, a bucket that expired when full at 600
    // would read full at the raised 6,000.
    await new Promise((r) => setTimeout(r, 120));
    let admitted = 0;
    for (; admitted < 1_000; admitted++) {
      const r = await lim.admit(input(key, { limits: { rpm: 6_000 } }));
      if (!r.ok) break;
      r.lease.finish({ tokens: null });
    }
    // 599 left, refilling at 100 a second from the raise (the loop's own time adds a few)
    assert.ok(admitted >= 600 && admitted < 800, `admitted ${admitted} after the raise`);
    await lim.close();
  });

  test('a bucket in debt is kept until full at the capacity it is read with: a lowered TPM keeps the debt', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const key = uid('k_debt');
    const tpm = `{${prefix}:k:${key}}:tpm`;
    // The bucket refills 0.1 token a millisecond until the settlement, and every millisecond
    // from here to the TTL read takes one off it: the bound below allows for the time taken.
    const t0 = performance.now();
    leaseOf(await lim.admit(input(key, { limits: { tpm: 6_000 }, tokens: 100 }))).finish({ tokens: 7_000 });
    await lim.close(); // the settlement: about -1,000 at 6,000 a minute, full again in 70 s
    const lim2 = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    assert.ok((await redis.pttl(tpm)) <= 70_000);
    const r = await lim2.admit(input(key, { limits: { tpm: 600 }, tokens: 10 }));
    assert.equal(r.ok, false, 'still in debt at the lowered limit');
    // (600 + 1,000) at 600 a minute: 160 s, less 10 ms for each millisecond of refill at 6,000
    const kept = await redis.pttl(tpm);
    const took = performance.now() - t0;
    assert.ok(kept > 160_000 - 11 * took - 50 && kept <= 160_000, `kept ${kept} ms, ${took.toFixed(1)} ms after the first admission`);
    await lim2.close();
  });

  test('claims: pending for their claimer, renewed, done for good, released or taken over once lapsed (claim.lua)', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const at = { tag: 'p:p_1', holder: uid('key:k'), epoch: 1, name: 'alert:0.8', ttlMs: 60_000, pendingMs: 1_000 };
    assert.equal(await lim.claimOnce({ ...at, token: 'a' }), 'claimed');
    assert.equal(await lim.claimOnce({ ...at, token: 'b' }), 'held');
    assert.equal(await lim.claimOnce({ ...at, token: 'b', turn: 'release' }), 'held', 'a turn by another token changes nothing');
    assert.equal(await lim.claimOnce({ ...at, token: 'a', turn: 'renew' }), 'claimed');
    // Redis keeps the time; a second pending leaves room for a stalled machine between the calls.
    await new Promise((r) => setTimeout(r, 1_100));
    assert.equal(await lim.claimOnce({ ...at, token: 'b' }), 'claimed', 'lapsed: taken over');
    assert.equal(await lim.claimOnce({ ...at, token: 'a', turn: 'done' }), 'held', 'a no longer holds it: b does, pending');
    assert.equal(await lim.claimOnce({ ...at, token: 'b', turn: 'release' }), 'claimed');
    assert.equal(await lim.claimOnce({ ...at, token: 'c' }), 'claimed', 'released: taken over at once');
    assert.equal(await lim.claimOnce({ ...at, token: 'c', turn: 'done' }), 'claimed');
    await new Promise((r) => setTimeout(r, 1_100));
    assert.equal(await lim.claimOnce({ ...at, token: 'd' }), 'taken', 'done: for good');
    assert.equal(await lim.claimOnce({ ...at, token: 'c' }), 'claimed');
    assert.equal(await lim.claimOnce({ ...at, token: 'd' }), 'taken', 'its claimer asking again does not make it pending');
    assert.equal(await lim.claimOnce({ ...at, epoch: 2, token: 'e', turn: 'done' }), 'taken', 'a turn for an epoch not recorded');
    assert.ok((await redis.pttl(`{${prefix}:t:${encodeURIComponent(at.tag)}}:c:${encodeURIComponent(at.holder)}`)) > 59_000, 'the turn wrote nothing: the hash keeps its TTL');
    assert.equal(await lim.claimedBy({ ...at, pendingMs: undefined, name: 'start', token: '5' }), '5', 'a claim for good, as before');
    await lim.close();
  });

  test("spend holds: a request's holders share its hash tag; ledgers expire a day after last use; money is integer nano-units", async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const holders = [keyBudget('k_1', { base: 0.1, limit: 1 }), projectBudget('p_1', { base: 2, limit: 10 }), wallet('u_1', { base: 3 })];
    const r = await lim.hold({ tag: 'p_1', holders, amount: 0.3 });
    assert.ok(r.ok);
    const tag = `{${prefix}:t:p_1}`;
    for (const id of ['key%3Ak_1', 'project%3Ap_1', 'wallet%3Au_1']) {
      const ledger = `${tag}:l:${id}`;
      const holds = `${tag}:lh:${id}`;
      for (const k of [ledger, holds]) {
        const ttl = await redis.pttl(k);
        assert.ok(ttl > 86_000_000 && ttl <= 86_400_000, `${k} expires a day after last use (${ttl})`);
      }
      assert.equal(await redis.hget(ledger, 'h'), '300000000');
      assert.equal(await redis.zcard(holds), 1);
      const [, score] = await redis.zrange(holds, '0', '0', 'WITHSCORES');
      const [sec] = await redis.time();
      const inMs = Number(score) - Number(sec) * 1000;
      assert.ok(inMs > 3_000 && inMs <= 6_000, `a hold expires after the lease time unless refreshed (${inMs})`);
    }
    r.hold.settle(0.123456789);
    await lim.close();
    for (const id of ['key%3Ak_1', 'project%3Ap_1', 'wallet%3Au_1']) {
      assert.deepEqual(await redis.hmget(`${tag}:l:${id}`, 'h', 's'), ['0', '123456789']);
      assert.equal(await redis.zcard(`${tag}:lh:${id}`), 0);
    }
  });

  test('the holds of one event-loop turn are one script call, taken in the order they were asked for', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const user = uid('u');
    const purse = wallet(user, { base: 1 });
    await lim.hold({ tag: user, holders: [purse], amount: 0 }); // scripts loaded
    // Every command the limiter sends passes here on its way to Redis.
    const sent: string[] = [];
    const sendCommand = redis.sendCommand.bind(redis);
    redis.sendCommand = ((cmd: { name: string }, ...rest: unknown[]) => {
      sent.push(cmd.name);
      return (sendCommand as (...a: unknown[]) => unknown)(cmd, ...rest);
    }) as typeof redis.sendCommand;
    try {
      const others = Array.from({ length: 3 }, () => uid('u'));
      const rs = await Promise.all([
        ...Array.from({ length: 5 }, () => lim.hold({ tag: user, holders: [purse], amount: 0.3 })),
        ...others.map((u) => lim.hold({ tag: u, holders: [wallet(u, { base: 1 })], amount: 0.5 })),
      ]);
      assert.deepEqual(sent, ['evalsha'], 'eight holds, one call');
      // 0.3 each on a balance of 1: the first three fit, in the order asked, the fourth does not.
      assert.deepEqual(rs.map((r) => r.ok), [true, true, true, false, false, true, true, true]);
      assert.deepEqual(rs.slice(3, 5).map((r) => !r.ok && r.code), ['insufficient_balance', 'insufficient_balance']);
      assert.equal(await redis.hget(`{${prefix}:t:${user}}:l:wallet%3A${user}`, 'h'), '900000000');
      for (const r of rs) if (r.ok) r.hold.settle(0);
    } finally {
      delete (redis as { sendCommand?: unknown }).sendCommand;
      await lim.close();
    }
  });

  test('in one call, a hold at a new epoch restarts the ledger for the holds after it, keeping the one in flight', async () => {
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const user = uid('u');
    try {
      // One turn: 0.6 at epoch 1, then 0.6 and 0.4 at epoch 2 (a top-up to 1.6 seen mid-turn).
      const rs = await Promise.all([
        lim.hold({ tag: user, holders: [wallet(user, { base: 1, epoch: 1 })], amount: 0.6 }),
        lim.hold({ tag: user, holders: [wallet(user, { base: 1.6, epoch: 2 })], amount: 0.6 }),
        lim.hold({ tag: user, holders: [wallet(user, { base: 1.6, epoch: 2 })], amount: 0.6 }),
      ]);
      // The restart keeps the first hold: 1.6 - 0.6 leaves room for one more of 0.6, not two.
      assert.deepEqual(rs.map((r) => r.ok), [true, true, false]);
      const L = `{${prefix}:t:${user}}:l:wallet%3A${user}`;
      assert.deepEqual(await redis.hmget(L, 'e', 'b0', 'h'), ['2', '1600000000', '1200000000']);
      assert.ok((await redis.pttl(L)) > 0, 'the restarted ledger keeps a TTL');
      assert.ok((await redis.pttl(`{${prefix}:t:${user}}:lh:wallet%3A${user}`)) > 0, 'so does its hold set');
      for (const r of rs) if (r.ok) r.hold.settle(0);
    } finally {
      await lim.close();
    }
  });

  test("a hold from an instance still at an older epoch is judged on the ledger's base, not its own stale one", async () => {
    // An instance whose replica has not seen the console's reset yet still sends the old
    // epoch's figures; the ledger restarted from the new ones (DESIGN section 6) and must use them.
    const lim = createRedisLimiter({ redis, prefix, leaseMs: 5_000 });
    const key = uid('k');
    const budget = (base: number, epoch: number) => [keyBudget(key, { base, limit: 1, epoch })];
    try {
      // Epoch 1: 0.9 of 1 spent. Epoch 2 (a reset): 0 spent.
      const rs = [await lim.hold({ tag: key, holders: budget(0.9, 1), amount: 0.05 })];
      rs.push(await lim.hold({ tag: key, holders: budget(0, 2), amount: 0.05 }));
      // 0.2 at epoch 1: 0 + 0.1 in flight + 0.2 fits 1; on its stale 0.9 it would not.
      rs.push(await lim.hold({ tag: key, holders: budget(0.9, 1), amount: 0.2 }));
      assert.deepEqual(rs.map((r) => r.ok), [true, true, true]);
      assert.equal(await redis.hget(`{${prefix}:t:${key}}:l:key%3A${key}`, 'h'), '300000000', 'all three in flight');
      for (const r of rs) if (r.ok) r.hold.settle(0);
    } finally {
      await lim.close();
    }
  });
});

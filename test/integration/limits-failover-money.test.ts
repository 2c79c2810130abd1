/**
 * Spend holds, quota reads and claims under createLimiter's onError rules, against a private
 * redis-server (unix socket, never the shared server) that the tests pause and kill.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createLimiter } from '../../src/limits/create.js';
import { createRedisLimiter } from '../../src/limits/redis/limiter.js';
import { LimitsUnavailableError, newRedisWait, type HoldInput, type HoldResult, type Limiter } from '../../src/limits/limiter.js';
import type { Holder } from '../../src/policy/holders.js';
import { keyBudget, projectBudget, wallet } from '../helpers/limits-conformance-ledger.js';
import { input, leaseOf, uid } from '../helpers/redis-limits-conformance.js';
import { type SocketRedis, startSocketRedis, waitFor } from '../helpers/redis-server.js';

const TIMEOUT_MS = 100;
/** Event-loop jitter on a busy 2-core machine plus the guard's own slack. */
const MARGIN_MS = 100;
const RECOVERY_MS = 5_000;

let server: SocketRedis;

before(async () => {
  server = await startSocketRedis('failover-money');
});
after(() => server?.close());

const make = (onError: 'open' | 'closed'): Limiter =>
  createLimiter({ redis: { url: `unix://${server.sock}`, prefix: uid('kwfm'), timeoutMs: TIMEOUT_MS, onError, lease: { enabled: true, sliceMs: 1_000 } }, leaseMs: 5_000 });

const req = (tag: string, holders: Holder[], amount: number): HoldInput => ({ tag, holders, amount });

async function timed<T>(p: Promise<T>): Promise<T> {
  const start = performance.now();
  const r = await p;
  const ms = performance.now() - start;
  assert.ok(ms < TIMEOUT_MS + MARGIN_MS, `answered after ${ms.toFixed(1)} ms`);
  return r;
}

/** True when a hold that needs Redis was answered by Redis. */
async function redisHolds(lim: Limiter): Promise<boolean> {
  const before = lim.stats().failOpenHolds;
  const r = await lim.hold(req(uid('probe'), [keyBudget(uid('k'), { base: 0, limit: 1 })], 0.1));
  if (r.ok) r.hold.settle(0);
  return r.ok && lim.stats().failOpenHolds === before;
}

const liveOf = async (lim: Limiter, tag: string, h: Holder): Promise<number> => (await lim.ledger({ tag, holders: [h] }))[0]!.live;

describe('spend holds with onError: open', { timeout: 30_000 }, () => {
  test('Redis paused: holds come from the in-process ledger within the timeout and are counted; a late hold changes nothing', async (t) => {
    const lim = make('open');
    t.after(() => lim.close());
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds');
    const inRedis = { tag: uid('tag'), holder: keyBudget(uid('k'), { base: 0, limit: 1 }) };
    const h1 = await lim.hold(req(inRedis.tag, [inRedis.holder], 0.5));
    assert.ok(h1.ok);
    const opened = lim.stats().failOpenHolds;

    server.proc.kill('SIGSTOP');
    const late = { tag: uid('tag'), holder: keyBudget(uid('k'), { base: 0, limit: 1 }) };
    let local: HoldResult[];
    try {
      // Sent to Redis, which runs it only after SIGCONT, past its deadline.
      const first = await timed(lim.hold(req(late.tag, [late.holder], 0.9)));
      assert.ok(first.ok);
      // The in-process ledger still enforces, per instance: R = 0.3, holds of 0.12.
      const tag = uid('tag');
      const holder = keyBudget(uid('k'), { base: 0.7, limit: 1 });
      local = await Promise.all(Array.from({ length: 20 }, () => timed(lim.hold(req(tag, [holder], 0.12)))));
      assert.equal(local.filter((r) => r.ok).length, 2);
      for (const r of local) if (!r.ok) assert.equal(r.code, 'key_budget_exhausted');
      assert.equal(lim.stats().failOpenHolds, opened + 21);
      assert.ok(Math.abs((await timed(lim.ledger({ tag, holders: [holder] })))[0]!.live - 0.94) < 1e-9);
      const q = await timed(lim.peek({ keyId: uid('k'), limits: { rpm: 5, tpm: null, concurrency: null } }));
      assert.equal(q.requests?.remaining, 5);
      first.hold.settle(0);
    } finally {
      server.proc.kill('SIGCONT');
    }
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds after SIGCONT');
    // Redis ran the timed-out hold late and refused it: nothing is held there.
    assert.equal(await liveOf(lim, late.tag, late.holder), 0);
    // The hold taken before the pause is still in Redis and settles there.
    assert.equal(await liveOf(lim, inRedis.tag, inRedis.holder), 0.5);
    h1.hold.settle(0.1);
    await waitFor(async () => Math.abs((await liveOf(lim, inRedis.tag, inRedis.holder)) - 0.1) < 1e-9, 2_000, 'the settlement in Redis');
    for (const r of local) if (r.ok) r.hold.settle(0.1);
    assert.equal(lim.stats().holdsHeld, 0, 'fallback holds settle where they were taken');
  });
});

describe('one wait a request', { timeout: 30_000 }, () => {
  test('Redis paused: a request\'s admission and hold together wait at most the timeout, not one timeout each', async (t) => {
    const lim = make('open');
    t.after(() => lim.close());
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds');
    const wait = newRedisWait();
    const admission = { ...input(uid('k'), { limits: { rpm: 5 } }), wait };
    const hold = { ...req(uid('tag'), [keyBudget(admission.keyId, { base: 0, limit: 1 })], 0.1), wait };
    server.proc.kill('SIGSTOP');
    try {
      const start = performance.now();
      const admitted = await lim.admit(admission);
      const held = await lim.hold(hold);
      const ms = performance.now() - start;
      assert.ok(admitted.ok && held.ok, 'both answered by the in-process limiter (onError: open)');
      // One timeout (100 ms) and jitter; a wait of its own for the hold would make it two.
      assert.ok(ms < TIMEOUT_MS * 1.6, `both steps answered after ${ms.toFixed(1)} ms`);
      assert.equal(lim.stats().failOpenHolds, 1, 'the hold went to the fallback');
      admitted.lease.finish({ tokens: 0 });
      held.hold.settle(0);
    } finally {
      server.proc.kill('SIGCONT');
    }
  });
});

describe('spend holds with onError: closed', { timeout: 30_000 }, () => {
  test('paused or killed Redis: limits_unavailable within the timeout, reads too; recovers by itself', async (t) => {
    const lim = make('closed');
    t.after(() => lim.close());
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds');
    const holder = keyBudget(uid('k'), { base: 0.2, limit: 1 });
    const unavailable = async (): Promise<void> => {
      const r = await timed(lim.hold(req(uid('tag'), [holder], 0.1)));
      assert.equal(r.ok, false);
      if (!r.ok) {
        assert.equal(r.code, 'limits_unavailable');
        assert.ok((r.retryAfterMs ?? 0) > 0);
      }
    };

    server.proc.kill('SIGSTOP');
    try {
      for (let i = 0; i < 5; i++) await unavailable();
      // Nothing to hold needs no Redis.
      assert.ok((await timed(lim.hold(req(uid('tag'), [], 1)))).ok);
      // no figure of this instance alone stands for the shared one (GET /v1/key answers 503)
      await assert.rejects(timed(lim.ledger({ tag: uid('tag'), holders: [holder] })), (err: Error) => err instanceof LimitsUnavailableError && err.retryAfterMs > 0);
    } finally {
      server.proc.kill('SIGCONT');
    }
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds after SIGCONT');

    server.proc.kill('SIGKILL');
    await server.exited;
    for (let i = 0; i < 5; i++) await unavailable();
    await server.restart();
    await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds after a restart');
    assert.equal(lim.stats().failOpenHolds, 0);
  });
});

describe('claims when Redis fails', { timeout: 30_000 }, () => {
  for (const onError of ['open', 'closed'] as const) {
    test(`onError ${onError}: unavailable within the timeout, never granted by the instance; a grant Redis makes late stays with its token`, async (t) => {
      const lim = make(onError);
      t.after(() => lim.close());
      await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds');
      const at = { tag: uid('tag'), holder: `key:${uid('k')}`, epoch: 1, name: 'alert:0.8', ttlMs: 60_000 };
      const first = uid('tok');
      server.proc.kill('SIGSTOP');
      try {
        assert.equal(await timed(lim.claimOnce({ ...at, token: first })), 'unavailable');
        assert.equal(await timed(lim.claimOnce({ ...at, token: uid('tok') })), 'unavailable');
      } finally {
        server.proc.kill('SIGCONT');
      }
      await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds after SIGCONT');
      // Redis ran both claims once it woke: the first token holds it, asking again finds it so.
      assert.equal(await lim.claimOnce({ ...at, token: first }), 'claimed');
      assert.equal(await lim.claimOnce({ ...at, token: uid('tok') }), 'taken');
      assert.equal(lim.stats().failOpenHolds, 0);
    });
  }
});

describe('reads for budget alerts when Redis fails', { timeout: 30_000 }, () => {
  for (const onError of ['open', 'closed'] as const) {
    test(`onError ${onError}: who holds a claim, and the shared figures alone, reject; answered by Redis once it is back`, async (t) => {
      const lim = make(onError);
      t.after(() => lim.close());
      await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds');
      const at = { tag: uid('tag'), holder: `wallet:${uid('u')}`, epoch: 1, name: 'start', ttlMs: 60_000 };
      const first = uid('tok');
      assert.equal(await lim.claimedBy({ ...at, token: first }), first);
      const holder = keyBudget(uid('k'), { base: 0.5, limit: 1 });
      server.proc.kill('SIGSTOP');
      try {
        await assert.rejects(timed(lim.claimedBy({ ...at, token: uid('tok') })), LimitsUnavailableError);
        await assert.rejects(timed(lim.ledger({ tag: at.tag, holders: [holder], sharedOnly: true })), LimitsUnavailableError);
        if (onError === 'open') assert.equal((await timed(lim.ledger({ tag: at.tag, holders: [holder] })))[0]!.live, 0.5, 'a plain read falls back');
      } finally {
        server.proc.kill('SIGCONT');
      }
      await waitFor(() => redisHolds(lim), RECOVERY_MS, 'Redis holds after SIGCONT');
      assert.equal(await lim.claimedBy({ ...at, token: uid('tok') }), first, 'the first claimer\'s token');
      assert.equal(await lim.claimedBy({ ...at, epoch: 0, token: uid('tok') }), null, 'an older epoch');
      assert.equal((await lim.ledger({ tag: at.tag, holders: [holder], sharedOnly: true }))[0]!.live, 0.5);
    });
  }
});

describe('round trips', () => {
  test('admission with a per-model limit, a hold on three holders, a settlement, peek and ledger are one script call each; no holders, none', async () => {
    const redis = new Redis({ path: server.sock });
    const lim = createRedisLimiter({ redis, prefix: uid('kwrt'), leaseMs: 5_000, refreshEveryMs: 0 });
    const calls = async (): Promise<number> => {
      const info = await redis.info('commandstats');
      return [...info.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0);
    };
    const count = async (what: () => Promise<unknown>): Promise<number> => {
      const before = await calls();
      await what();
      return (await calls()) - before;
    };
    // Warm the script cache so that NOSCRIPT fallbacks do not count.
    const warm = await lim.hold(req(uid('tag'), [keyBudget(uid('k'), { base: 0, limit: 1 })], 0));
    if (warm.ok) warm.hold.settle(0);
    leaseOf(await lim.admit({ ...input(uid('k'), { limits: { rpm: 5 }, tokens: 1 }), modelLimit: { pattern: 'a*', rpm: 1, tpm: 5 } })).finish({ tokens: 1 });
    await lim.peek({ keyId: uid('k'), limits: { rpm: 1, tpm: null, concurrency: null } });
    await lim.ledger({ tag: uid('tag'), holders: [wallet(uid('u'), { base: 1 })] });

    const key = uid('k');
    let lease: ReturnType<typeof leaseOf> | undefined;
    assert.equal(
      await count(async () => {
        lease = leaseOf(await lim.admit({ ...input(key, { limits: { rpm: 5, tpm: 100 }, tokens: 10 }), modelLimit: { pattern: 'a*', rpm: 1, tpm: 50 } }));
      }),
      1,
    );
    const tag = uid('tag');
    const holders = [keyBudget(uid('k'), { base: 0, limit: 1 }), projectBudget(tag, { base: 0, limit: 5 }), wallet(uid('u'), { base: 3 })];
    let hold: { settle(n: number): void } | undefined;
    assert.equal(
      await count(async () => {
        const r = await lim.hold(req(tag, holders, 0.2));
        assert.ok(r.ok);
        hold = r.hold;
      }),
      1,
    );
    assert.equal(await count(() => lim.hold(req(tag, [], 0.2))), 0);
    // Settling the lease and the hold in the same tick: one batched script call for both,
    // sent ahead of the next call on this connection.
    const settled = await count(async () => {
      lease!.finish({ tokens: 5 });
      hold!.settle(0.1);
      await lim.ledger({ tag, holders }); // queued behind both settlements on this connection
    });
    assert.equal(settled, 2);
    assert.equal(await count(() => lim.peek({ keyId: key, limits: { rpm: 5, tpm: 100, concurrency: null } })), 1);
    await lim.close();
    redis.disconnect();
  });
});

/**
 * A grant Redis made in time whose reply reached the instance after the call's deadline (a
 * link that stalled on the way back, an event loop that stalled past the deadline with the
 * reply unread) is undone as soon as the reply arrives: the request was answered by the
 * fallback, so nobody will finish the admission or settle the hold. Without that, its slot,
 * tokens, slice or held amount stay taken in Redis until their lease runs out, and a key with
 * a concurrency of 1 is locked for that long. Through a TCP proxy in front of the shared Redis
 * that holds Redis' replies from a chosen call on, for each script that grants: admit.lua (a
 * limit leasing does not cover), lease.lua (the leasing path) and hold.lua.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Redis } from 'ioredis';
import { createLimiter } from '../../src/limits/create.js';
import type { Limiter } from '../../src/limits/limiter.js';
import { startFreezeProxy, type FreezeProxy } from '../helpers/freeze-proxy.js';
import { held, req, wallet } from '../helpers/limits-conformance-ledger.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';
import { input, leaseOf, uid } from '../helpers/redis-limits-conformance.js';
import { waitFor } from '../helpers/redis-server.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

/** The call's deadline: the script runner's (timeoutMs) passes before the guard's (timeoutMs plus its slack). */
const TIMEOUT_MS = 100;
const prefix = uid('kwlate');
let direct: Redis;
let proxy: FreezeProxy;
/** Set: once the next call has passed on to Redis, its reply and everything after it are held until thaw. */
let holdNextReply = false;
let callSent = false;

before(async () => {
  direct = new Redis(TEST_REDIS_URL);
  proxy = await startFreezeProxy({
    target: new URL(TEST_REDIS_URL),
    seen: (_chunk, toClient) => {
      if (!holdNextReply) return;
      if (!toClient) callSent = true;
      else if (callSent) {
        holdNextReply = callSent = false;
        proxy.frozen = true;
      }
    },
  });
});
after(async () => {
  proxy.close();
  await deleteByPrefix(direct, prefix);
  direct.disconnect();
});

function limiter(lease: boolean): Limiter {
  return createLimiter({ redis: { url: proxy.url, prefix, timeoutMs: TIMEOUT_MS, onError: 'open', lease: { enabled: lease, sliceMs: 1_000 } }, leaseMs: 30_000 });
}

/** Waits until admissions are answered by Redis (connected, scripts loaded), then until the warm-up's settlements have left. */
async function serving(lim: Limiter): Promise<void> {
  await waitFor(async () => {
    const before = lim.stats().failOpenAdmissions;
    const r = await lim.admit(input(uid('warm'), { limits: { concurrency: 1 } }));
    if (r.ok) r.lease.finish({ tokens: null });
    return r.ok && lim.stats().failOpenAdmissions === before;
  }, 5_000, 'Redis admissions');
  await new Promise((r) => setTimeout(r, 50)); // the settlement tick after the warm-up
}

test('admit.lua: an admission granted in time and answered late is undone, its slot freed', async () => {
  const lim = limiter(false);
  try {
    await serving(lim);
    const key = uid('k');
    const limits = { concurrency: 1, rpm: 100 };
    const set = `{${prefix}:k:${key}}:conc`;
    holdNextReply = true;
    const opened = lim.stats().failOpenAdmissions;
    const local = leaseOf(await lim.admit(input(key, { limits })));
    assert.equal(lim.stats().failOpenAdmissions, opened + 1, 'the deadline passed: the fallback answered');
    assert.equal(await direct.zcard(set), 1, 'Redis admitted it all the same');
    proxy.thaw();
    local.finish({ tokens: null });
    await waitFor(async () => (await direct.zcard(set)) === 0, 5_000, 'the late grant undone in Redis');
    assert.equal(Number(await direct.hget(`{${prefix}:k:${key}}:rpm`, 't')), 100, 'its RPM token back');
    // The key's one slot is free for the next request, from Redis itself.
    const next = leaseOf(await lim.admit(input(key, { limits })));
    assert.equal(lim.stats().failOpenAdmissions, opened + 1, 'Redis admitted the next one');
    next.finish({ tokens: null });
  } finally {
    proxy.thaw();
    await lim.close();
  }
});

test("admit.lua: an admission granted but answered after the request's own wait ended is undone by the guard", async () => {
  // A call may take the whole timeout; the request has 20 ms of its wait left.
  const lim = createLimiter({ redis: { url: proxy.url, prefix, timeoutMs: 1_000, onError: 'open', lease: { enabled: false, sliceMs: 1_000 } }, leaseMs: 30_000 });
  try {
    await serving(lim);
    const key = uid('k');
    const set = `{${prefix}:k:${key}}:conc`;
    holdNextReply = true;
    const opened = lim.stats().failOpenAdmissions;
    const local = leaseOf(await lim.admit({ ...input(key, { limits: { concurrency: 1 } }), wait: { endsAt: performance.now() + 20 } }));
    assert.equal(lim.stats().failOpenAdmissions, opened + 1, 'answered by the fallback');
    assert.equal(await direct.zcard(set), 1, 'Redis admitted it all the same');
    proxy.thaw();
    local.finish({ tokens: null });
    await waitFor(async () => (await direct.zcard(set)) === 0, 5_000, 'the late grant undone in Redis');
  } finally {
    proxy.thaw();
    await lim.close();
  }
});

test('lease.lua: an admission granted in time and answered late gives back its slot, its tokens, its slice and its block', async () => {
  const lim = limiter(true);
  try {
    await serving(lim);
    const key = uid('k');
    const limits = { concurrency: 16, rpm: 1_000, tpm: 100_000 };
    const tag = `{${prefix}:k:${key}}`;
    const sliced = async (): Promise<boolean> => Object.keys(await direct.hgetall(`${tag}:rpm`)).some((f) => f.startsWith('s:'));
    // Demand first: the key's requests earn it a slice and a block, which go back when their time is up.
    await waitFor(async () => {
      leaseOf(await lim.admit(input(key, { limits, tokens: 500 }))).finish({ tokens: null });
      return sliced();
    }, 5_000, 'a slice granted on demand');
    await waitFor(async () => !(await sliced()) && (await direct.zcard(`${tag}:conc`)) === 0, 5_000, 'the slice and the block given back');
    const before = await direct.hmget(`${tag}:rpm`, 't', 'ts');
    // The next request asks Redis again, for a slice and a block besides its own slot.
    holdNextReply = true;
    const local = leaseOf(await lim.admit(input(key, { limits, tokens: 500 })));
    assert.ok(await sliced(), 'Redis granted a slice all the same');
    assert.ok((await direct.zcard(`${tag}:conc`)) >= 2, 'and a slot and a block');
    proxy.thaw();
    local.finish({ tokens: null });
    await waitFor(async () => !(await sliced()) && (await direct.zcard(`${tag}:conc`)) === 0, 5_000, 'the slot, slice and block back in Redis');
    const [t, ts] = await direct.hmget(`${tag}:rpm`, 't', 'ts');
    const refilled = ((Number(ts) - Number(before[1])) * 1_000) / 60_000;
    assert.ok(Number(t) >= Math.min(1_000, Number(before[0]) + refilled) - 1e-6, `the RPM tokens back: ${t} after ${before[0]}`);
  } finally {
    proxy.thaw();
    await lim.close();
  }
});

for (const lease of [false, true]) {
  test(`hold.lua${lease ? ' with spend slices' : ''}: a hold granted in time and answered late is released`, async () => {
    const lim = limiter(lease);
    try {
      await serving(lim);
      const tag = uid('t');
      const holder = wallet(uid('u'), { base: 1_000 });
      const ledger = `{${prefix}:t:${encodeURIComponent(tag)}}:l:${encodeURIComponent(holder.id)}`;
      holdNextReply = true;
      const opened = lim.stats().failOpenHolds;
      held(await lim.hold(req(tag, [holder], 10))).settle(0);
      assert.equal(lim.stats().failOpenHolds, opened + 1, 'the deadline passed: the in-process ledger held it');
      assert.ok(Number(await direct.hget(ledger, 'h')) > 0, 'Redis held it all the same');
      proxy.thaw();
      await waitFor(async () => Number((await direct.hget(ledger, 'h')) ?? 0) === 0, 5_000, 'the late hold (and any slice) released in Redis');
    } finally {
      proxy.thaw();
      await lim.close();
    }
  });
}

/**
 * Bucket slices (src/limits/redis-lease.ts, lua/lease.lua): the conformance suite with
 * slices on, exactness near the limit across instances, the sum admitted under load from
 * three instances, a dead instance's slice coming back by expiry, and the round trips a
 * request far from its limit costs.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import type { AdmitResult } from '../../src/limits/limiter.js';
import { admitShadowed } from '../../src/limits/shadow.js';
import { shadowSet } from '../../src/policy/shadow.js';
import { leasingInstances, redisHarness } from '../helpers/redis-harness.js';
import { watchEvals as watchRedisEvals } from '../helpers/redis-monitor.js';
import { waitFor } from '../helpers/redis-server.js';
import { input, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const URL = TEST_REDIS_URL;

runLimiterConformance('redis (single node) with leasing (bucket slices, slot blocks, spend slices)', () => redisHarness({ url: URL, lease: { sliceMs: 1000 } }));

describe('bucket slices', { timeout: 60_000 }, () => {
  const prefix = uid('kwtest');
  const fleet = leasingInstances(URL, prefix);
  /** An instance: its own connection, slices on. */
  const instance = (sliceMs: number) => fleet.instance({ sliceMs });
  after(() => fleet.close());
  const ok = (rs: AdmitResult[]): number => rs.filter((r) => r.ok).length;
  const leased = async (client: Redis, key: string, bucket: 'rpm' | 'tpm'): Promise<number> =>
    Number((await client.hget(`{${prefix}:k:${key}}:${bucket}`, 'l')) ?? 0);
  /** Counts the EVAL/EVALSHA calls on this suite's keys as Redis reports them. */
  const watchEvals = () => watchRedisEvals([URL], prefix);

  test('near the limit, N+1 requests at once across two instances admit exactly N', async () => {
    const a = await instance(200);
    const b = await instance(200);
    const key = uid('k');
    const limits = { rpm: 64 };
    // A busy key on instance a: it leases slices while the bucket is far from its limit.
    let sawSlice = false;
    for (let i = 0; i < 40; i++) {
      assert.ok((await a.lim.admit(input(key, { limits }))).ok);
      sawSlice ||= a.lim.slicesHeld() > 0;
    }
    assert.ok(sawSlice, 'far from its limit the key was leased a slice');
    // What is left goes back once the slice's time is over.
    await waitFor(() => a.lim.slicesHeld() === 0, 5_000, 'the slice is given back');
    await waitFor(async () => (await leased(a.client, key, 'rpm')) === 0, 5_000, 'the slice is closed in Redis');
    // The exact level: whole tokens from `remaining`, the fraction from the time until full.
    let q = await b.lim.peek({ keyId: key, limits: { ...limits, tpm: null, concurrency: null } });
    let level = 64 - (q.requests!.resetMs * 64) / 60_000;
    if (level - Math.floor(level) > 0.85) {
      // Too close to the next whole token to fire before it arrives: wait it out.
      await new Promise((r) => setTimeout(r, Math.ceil((1 - (level - Math.floor(level))) * 937) + 50));
      q = await b.lim.peek({ keyId: key, limits: { ...limits, tpm: null, concurrency: null } });
      level = 64 - (q.requests!.resetMs * 64) / 60_000;
    }
    const n = q.requests!.remaining;
    assert.ok(n > 0 && n < 32, `the key is near its limit (${n} left)`);
    const rs = await Promise.all(Array.from({ length: n + 1 }, (_, i) => (i % 2 ? a : b).lim.admit(input(key, { limits }))));
    assert.equal(ok(rs), n, `${n} left, ${n + 1} sent`);
    assert.equal(a.lim.slicesHeld() + b.lim.slicesHeld(), 0, 'no slice is leased near the limit');
    for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
  });

  test('under load from three instances the sum admitted never exceeds the limit', async (t) => {
    const all = await Promise.all([instance(1000), instance(1000), instance(1000)]);
    const key = uid('k');
    const limits = { rpm: 1200, tpm: 60_000 };
    let admitted = 0;
    let denials = 0;
    let slicesSeen = 0;
    const started = performance.now();
    await Promise.all(
      all.flatMap(({ lim }) =>
        Array.from({ length: 8 }, async () => {
          // Each worker stops after its second denial: the limit is reached.
          let mine = 0;
          while (mine < 2 && performance.now() - started < 10_000) {
            const r = await lim.admit(input(key, { limits, tokens: 100 }));
            slicesSeen = Math.max(slicesSeen, lim.slicesHeld());
            if (r.ok) {
              admitted++;
              r.lease.finish({ tokens: null }); // the reservation stands
            } else {
              mine++;
              denials++;
            }
          }
        }),
      ),
    );
    const elapsed = performance.now() - started;
    // TPM binds: 60000 tokens of 100 each, plus what refilled meanwhile (60000 per minute:
    // one token per ms, a request's worth every 100 ms).
    const bound = 600 + Math.ceil(elapsed / 100);
    t.diagnostic(`admitted ${admitted} (bound ${bound}), ${denials} denials, ${Math.round(elapsed)} ms`);
    assert.ok(slicesSeen > 0, 'instances admitted from slices');
    assert.ok(denials > 0);
    assert.ok(admitted <= bound, `admitted ${admitted}, limit ${bound} in ${Math.round(elapsed)} ms`);
    // Slices still out elsewhere may refuse a little early, never more than three slices' worth.
    assert.ok(admitted >= 600 - 3 * Math.floor(60_000 / 16 / 100), `admitted ${admitted}`);
  });

  test('shadow rpm with slices: admitted from slices while within the limit, then shadowed at Redis taking nothing; TPM takes throughout', async () => {
    const a = await instance(200);
    const b = await instance(200);
    const key = uid('k');
    const limits = { rpm: 64, tpm: 640_000 };
    const tokens = 1000;
    const shadow = { shadow: shadowSet(['rpm']), codes: [] as string[] };
    let sawSlice = false;
    let plain = 0;
    let shadowed = 0;
    const started = performance.now();
    for (let i = 0; shadowed < 20; i++) {
      assert.ok(i < 200, `${plain} admitted, ${shadowed} shadowed after ${i} requests`);
      const codes: string[] = [];
      const r = await admitShadowed((i % 4 ? a : b).lim, input(key, { limits, tokens }), { ...shadow, codes });
      assert.ok(r.ok, 'rpm is shadowed and TPM far from its limit');
      r.lease.finish({ tokens: null });
      if (codes.length === 0) plain++;
      else {
        assert.deepEqual(codes, ['rpm_exceeded']);
        assert.equal(r.quota.requests?.remaining, 0);
        shadowed++;
      }
      sawSlice ||= a.lim.slicesHeld() > 0;
    }
    const elapsed = performance.now() - started;
    assert.ok(sawSlice, 'far from its limit the key was leased a slice');
    // Exact: 64 and what refilled (one every 937.5 ms), less at most the slices still out.
    const refilled = Math.ceil(elapsed / 937.5);
    assert.ok(plain <= 64 + refilled && plain >= 64 - 2 * 4, `${plain} admitted in ${Math.round(elapsed)} ms`);
    // The twenty shadowed took no token: enforcing now lacks one token at most, not twenty.
    const wait = (await a.lim.admit(input(key, { limits, tokens })));
    assert.ok(!wait.ok && wait.code === 'rpm_exceeded' && wait.retryAfterMs <= 940, JSON.stringify(wait));
    // TPM is not shadowed: every request reserved on it, shadowed or not.
    await waitFor(() => a.lim.slicesHeld() + b.lim.slicesHeld() === 0, 5_000, 'the slices are given back');
    await waitFor(async () => (await leased(a.client, key, 'tpm')) === 0, 5_000, 'the slices are closed in Redis');
    const q = await b.lim.peek({ keyId: key, limits: { ...limits, concurrency: null } });
    const taken = 640_000 - q.tokens!.remaining;
    const sent = (plain + shadowed) * tokens;
    const refill = ((performance.now() - started) * 640_000) / 60_000;
    assert.ok(taken <= sent && taken >= sent - refill - tokens, `${taken} tokens taken for ${sent} reserved`);
  });

  test('a TPM bucket full to its ceiling admits one request estimated above the capacity while another instance holds a slice', async (t) => {
    // Instances of their own, closed at the end: their slices' give-backs stay out of the other tests' counts.
    const own = uid('kwtest');
    const pair = leasingInstances(URL, own);
    t.after(() => pair.close());
    const a = await pair.instance({ sliceMs: 1000 });
    const b = await pair.instance({ sliceMs: 1000 });
    const leased = async (client: Redis, key: string): Promise<number> => Number((await client.hget(`{${own}:k:${key}}:tpm`, 'l')) ?? 0);
    const key = uid('k');
    const limits = { tpm: 60_000 };
    // Instance a takes a few tokens and leases a slice of the bucket, which stays out.
    for (let i = 0; i < 20; i++) {
      const r = await a.lim.admit(input(key, { limits, tokens: 1 }));
      assert.ok(r.ok);
      r.lease.finish({ tokens: 1 });
    }
    assert.ok((await leased(a.client, key)) > 0, 'a slice of the bucket is out');
    // 20 tokens refill in 20 ms at 60,000 a minute: the bucket is back at its ceiling, full.
    await waitFor(async () => {
      const q = await b.lim.peek({ keyId: key, limits: { rpm: null, concurrency: null, ...limits } });
      return q.tokens!.remaining >= 60_000 - (await leased(a.client, key));
    }, 2_000, 'the bucket refilled to its ceiling');
    const big = await b.lim.admit(input(key, { limits, tokens: 100_000 }));
    assert.ok(big.ok, `a full bucket admits an oversized request alone: ${JSON.stringify(big)}`);
    big.lease.finish({ tokens: null });
    // Now in debt: the next request waits, as on a bucket without slices.
    assert.equal((await b.lim.admit(input(key, { limits, tokens: 1 }))).ok, false);
  });

  test("a dead instance's slice comes back by expiry; a live one gives back what is left", async () => {
    // Long enough that a stalled machine cannot let the slice lapse before the checks below.
    const sliceMs = 1_000;
    const dead = await instance(sliceMs);
    const live = await instance(sliceMs);
    const key = uid('k');
    const limits = { rpm: 6000 };
    for (let i = 0; i < 10; i++) assert.ok((await dead.lim.admit(input(key, { limits }))).ok);
    assert.ok(dead.lim.slicesHeld() > 0);
    const out = await leased(live.client, key, 'rpm');
    assert.ok(out > 0, 'the slice lowers the bucket ceiling while it is out');
    // Dies: no give-back, no close; its connection is gone.
    dead.client.disconnect();
    const diedAt = performance.now();
    assert.equal(await leased(live.client, key, 'rpm'), out, 'nothing gives it back early');
    // Any reader drops an expired slice (Redis time: 2 x sliceMs after the grant).
    await waitFor(async () => {
      await live.lim.peek({ keyId: key, limits: { rpm: 6000, tpm: null, concurrency: null } });
      return (await leased(live.client, key, 'rpm')) === 0;
    }, 10_000, 'the dead slice expires');
    const waited = performance.now() - diedAt;
    assert.ok(waited <= 2 * sliceMs + 1_000, `expired after ${Math.round(waited)} ms`);

    // A live instance gives its slice back by itself once sliceMs is over.
    const key2 = uid('k');
    for (let i = 0; i < 10; i++) assert.ok((await live.lim.admit(input(key2, { limits }))).ok);
    assert.ok((await leased(live.client, key2, 'rpm')) > 0);
    await waitFor(async () => (await leased(live.client, key2, 'rpm')) === 0, 5_000, 'the live slice is given back');
    assert.equal(live.lim.slicesHeld(), 0);
    // 10 admitted of 6000: once given back the bucket is as if no slice had been taken.
    const q = await live.lim.peek({ keyId: key2, limits: { rpm: 6000, tpm: null, concurrency: null } });
    assert.ok(q.requests!.remaining >= 5990 - 1, `remaining ${q.requests!.remaining}`);
  });

  test('far from its limit a request costs well under one Redis call', async (t) => {
    const { lim } = await instance(1000);
    const evals = await watchEvals();
    const keys = [uid('k'), uid('k')];
    const limits = { rpm: 1_000_000, tpm: 100_000_000 };
    // The script cache and demand history; not counted.
    for (const k of keys) for (let i = 0; i < 3; i++) assert.ok((await lim.admit(input(k, { limits, tokens: 10 }))).ok);
    await evals.settle();
    evals.calls = 0;
    const requests = 2_000;
    let sent = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (sent < requests) {
          sent++;
          const r = await lim.admit(input(keys[sent % 2]!, { limits, tokens: 100 }));
          assert.ok(r.ok);
          r.lease.finish({ tokens: 60 }); // a refund, settled in the batch
        }
      }),
    );
    await lim.close(); // flushes the batch and gives the slices back
    await evals.settle();
    evals.stop();
    const perRequest = evals.calls / requests;
    t.diagnostic(`${evals.calls} Redis calls for ${requests} requests`);
    assert.ok(perRequest < 0.25, `${evals.calls} Redis calls for ${requests} requests (${perRequest.toFixed(3)} per request)`);
  });

  test('a request admitted from a slice settles into it: no settlement call while the slice is live', async () => {
    const { lim, client } = await instance(5_000);
    const evals = await watchEvals();
    const key = uid('k');
    const limits = { tpm: 100_000_000 };
    // Demand first: the slice is sized by what the key used in the last window (here 4,000
    // tokens), and the last of these requests leaves a slice of about that size.
    for (let i = 0; i < 40; i++) {
      const r = await lim.admit(input(key, { limits, tokens: 100 }));
      assert.ok(r.ok);
      r.lease.finish({ tokens: 100 });
    }
    assert.equal(lim.slicesHeld(), 1, 'a slice is held');
    await new Promise((r) => setTimeout(r, 100)); // any batch of those 40 leaves
    await evals.settle();
    evals.calls = 0;
    const a = await lim.admit(input(key, { limits, tokens: 100 }));
    assert.ok(a.ok);
    a.lease.finish({ tokens: 40 }); // 60 of the 100 reserved come back
    const b = await lim.admit(input(key, { limits, tokens: 100 }));
    assert.ok(b.ok);
    b.lease.finish({ tokens: 130 }); // 30 more than reserved
    const c = await lim.admit(input(key, { limits, tokens: 100 }));
    assert.ok(c.ok);
    assert.equal(b.quota.tokens!.remaining, a.quota.tokens!.remaining - 40, "b's 100 less a's refund of 60");
    assert.equal(c.quota.tokens!.remaining, b.quota.tokens!.remaining - 130, "c's 100 and b's charge of 30");
    c.lease.finish({ tokens: 100 });
    // A batch would have left within a tick: give it many, then see all that reached Redis.
    await new Promise((r) => setTimeout(r, 200));
    await evals.settle();
    assert.equal(evals.calls, 0, 'no Redis call for three settlements from a live slice');
    const leasedOut = await leased(client, key, 'tpm');
    assert.ok(leasedOut > 0);
    await lim.close(); // gives back what is left of the slice, settlements included
    evals.stop();
    assert.equal(await leased(client, key, 'tpm'), 0, 'the slice, with what was settled into it, is back');
  });
});


/**
 * Bucket slices read from the bucket in Redis (lua/bucket.lua, lua/lease.lua, lua/settle.lua),
 * next to limits-lease.test.ts, which runs the limiter on them:
 * - a slice out lowers its bucket's ceiling (cap - leased), so the bucket and its slices never
 *   hold more than N together, even after a whole window of refill;
 * - a bucket is kept as long as a slice of it is out, past the one window a bucket is otherwise
 *   kept: gone, it would read full (absent = full) while the slice is still spent from;
 * - what is left of a slice that expired in Redis before its instance handed it back is not
 *   given back, by the next request (lease.lua) or by a settlement (settle.lua): the instance
 *   may have spent it, and its ceiling already came back;
 * - a slice is granted only when the bucket keeps `keep` after the request and the slice.
 * lease.lua and settle.lua are called as lease-path.ts and the settlement batch call them.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import type { AdmitResult } from '../../src/limits/limiter.js';
import { createRedisLimiter, type RedisLimiter } from '../../src/limits/redis/limiter.js';
import { type RunScript, scriptRunner } from '../../src/limits/redis/scripts.js';
import { leasingInstances } from '../helpers/redis-harness.js';
import { waitFor } from '../helpers/redis-server.js';
import { input, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const URL = TEST_REDIS_URL;

describe('bucket slices in Redis: the ceiling, the bucket kept, expired slices, the keep', { timeout: 60_000 }, () => {
  const prefix = uid('kwtest');
  const fleet = leasingInstances(URL, prefix);
  let client: Redis;
  let run: RunScript;
  before(async () => {
    client = await fleet.connect();
    run = scriptRunner(client);
  });
  after(() => fleet.close());
  const ok = (rs: AdmitResult[]): number => rs.filter((r) => r.ok).length;
  const keysOf = (key: string): string[] => {
    const t = `{${prefix}:k:${key}}`;
    return [`${t}:rpm`, `${t}:tpm`, `${t}:conc`, `${t}:concw`];
  };
  const redisNow = async (): Promise<number> => {
    const [sec, usec] = await client.time();
    return Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
  };
  /** Admits on instance `lim` until it holds a slice: a busy key far from its limit is leased one. */
  const untilSliced = async (lim: RedisLimiter, key: string, limits: { rpm: number }): Promise<void> => {
    for (let i = 0; i < 12 && lim.slicesHeld() === 0; i++) {
      const r = await lim.admit(input(key, { limits }));
      assert.ok(r.ok);
      r.lease.finish({ tokens: null });
    }
    assert.equal(lim.slicesHeld(), 1, 'a slice is out');
  };
  /**
   * One request on an RPM-only key through lease.lua: gives back `old` (id, rpm left) and asks
   * for a slice of `want` that Redis keeps `sliceMs`, granted if the bucket keeps `keep`.
   */
  const lease = async (key: string, rpm: number, o: { old?: [string, number]; id?: string; want?: number; sliceMs?: number; keep?: number } = {}): Promise<number[]> =>
    (await run('keywardLease', keysOf(key), [
      rpm, 0, 0, 0,
      o.old?.[0] ?? '', o.old?.[1] ?? 0, 0,
      o.id ?? uid('s'), o.want ?? 0, 0, o.sliceMs ?? 10_000, o.keep ?? 0, 0,
      0, '', 30_000, '', 0, 0,
    ])) as number[];
  /** Grants slice `id` of 30 on a fresh key at 600 a minute, kept 100 ms in Redis, and waits until Redis has let it expire. */
  const expiredSlice = async (id: string): Promise<string> => {
    const key = uid('k');
    const first = await lease(key, 600, { id, want: 30, sliceMs: 100, keep: 300 });
    assert.equal(first[4], 1, 'the slice is granted');
    assert.equal(first[5], 599, 'the request has its token; the slice is not counted in remaining');
    const expiry = Number(first[3]) + 100;
    await waitFor(async () => (await redisNow()) > expiry, 5_000, 'the slice to expire in Redis');
    return key;
  };

  test('a bucket refilled for a whole window with a slice out admits N less the slice, and the slice the rest: N in all', async () => {
    // A long slice: it stays live (and out) through the whole test.
    const a = await fleet.instance({ sliceMs: 10_000 });
    const plain = createRedisLimiter({ redis: client, prefix, leaseMs: 30_000 });
    const key = uid('k');
    const limits = { rpm: 64 };
    const bucket = keysOf(key)[0]!;
    await untilSliced(a.lim, key, limits);
    const out = Number(await client.hget(bucket, 'l'));
    assert.ok(out >= 2, `the slice is recorded with its bucket (${out})`);
    // Redis keeps the time, so a window passing is stood in for by moving the bucket's stored
    // timestamp back one window: all bucket.lua's refill reads. It refills to N - out, not N.
    const shifted = performance.now();
    await client.hset(bucket, 'ts', String(Number(await client.hget(bucket, 'ts')) - 60_000));
    const rs = await Promise.all(Array.from({ length: 64 }, () => plain.admit(input(key, { limits }))));
    assert.equal(ok(rs), 64 - out, `${out} of 64 are out in a slice`);
    for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
    // What the slice holds is instance a's to admit: with it, N (and any token refilled since,
    // one every 940 ms, on a slow machine).
    let fromSlice = 0;
    for (; fromSlice <= out + 2; fromSlice++) {
      const r = await a.lim.admit(input(key, { limits }));
      if (!r.ok) break;
      r.lease.finish({ tokens: null });
    }
    const refilled = Math.floor(((performance.now() - shifted) * 64) / 60_000);
    assert.ok(fromSlice >= out && fromSlice <= out + refilled, `${ok(rs)} from the bucket and ${fromSlice} from the slice, ${refilled} refilled`);
    await plain.close();
  });

  test('a bucket with a slice out is kept until the slice expires, past one window when sliceMs is long', async () => {
    const a = await fleet.instance({ sliceMs: 45_000 }); // Redis keeps the slice 2 x sliceMs: 90 s, past the 60 s window
    const key = uid('k');
    await untilSliced(a.lim, key, { rpm: 64 });
    const bucket = keysOf(key)[0]!;
    const last = Number(await client.hget(bucket, 'X'));
    const now = await redisNow();
    const ttl = await client.pttl(bucket);
    assert.ok(last - now > 60_000, `the slice outlives a window (${last - now} ms)`);
    assert.ok(ttl >= last - now - 50, `the bucket (TTL ${ttl} ms) is kept until its slice expires (${last - now} ms)`);
  });

  test('what is left of a slice that expired in Redis is not given back with the next request', async () => {
    // 600 a minute, 0.01 a millisecond: the test's own time refills a token or two at most.
    const key = await expiredSlice('slice-1');
    // The instance hands the slice back unused: too late, Redis dropped it (and its ceiling).
    const next = await lease(key, 600, { old: ['slice-1', 30] });
    assert.equal(next[0], 1);
    // 600 - 1 - 30 taken, the next request takes 1: 568 plus the refill since, never the 30 again.
    assert.ok(next[5]! < 568 + 10, `remaining ${next[5]}: an expired slice's rest was given back`);
    assert.equal(await client.hget(keysOf(key)[0]!, 'l'), null, 'no slice is recorded');
  });

  test('a slice settled back after it expired in Redis gives nothing back', async () => {
    const key = await expiredSlice('slice-2');
    const rpmKey = keysOf(key)[0]!;
    // Another request reads the bucket: the expired slice is dropped (ceiling back, tokens not).
    assert.equal((await lease(key, 600))[0], 1);
    assert.equal(await client.hget(rpmKey, 'l'), null, 'the expired slice is gone');
    // The instance's give-back of its rest arrives now, as the settlement batch sends it.
    assert.deepEqual(await run('keywardSettle', [rpmKey], ['', 0, 1, 'b', 'slice-2', 'slice-2', 1, 0, 600, 30, '']), [1]);
    // 600 - 1 - 30 - 1 = 568 plus the refill since; the 30 are not given back.
    const level = Number(await client.hget(rpmKey, 't'));
    assert.ok(level < 568 + 10, `level ${level}: an expired slice's rest was given back`);
  });

  test('a slice is granted only when the bucket keeps `keep` after the request and the slice', async () => {
    const key = uid('k');
    // 64 a minute: a token takes ~940 ms to come back, far longer than the calls below.
    for (let i = 0; i < 28; i++) assert.equal((await lease(key, 64))[0], 1);
    // ~36 left: after this request 35, after a slice of 4 31, under the 32 to keep.
    const near = await lease(key, 64, { want: 4, keep: 32 });
    assert.equal(near[0], 1, 'the request is admitted');
    assert.equal(near[4], 0, 'no slice: the bucket would keep less than 32');
    assert.equal(await client.hget(keysOf(key)[0]!, 'l'), null);
    // A key with its own bucket at 64, far from that: granted.
    assert.equal((await lease(uid('k'), 64, { want: 4, keep: 32 }))[4], 1);
  });
});

/**
 * Blocks of concurrency slots (src/limits/slot-blocks.ts, lua/lease.lua, lua/slots.lua):
 * exactness near the limit across instances, the sum in flight under load from three
 * instances, a dead instance's block coming back by expiry, unused slots given back, and the
 * round trips a concurrency-limited request far from its limit costs. The conformance suite
 * runs with blocks on wherever `lease` is on (limits-lease, limits-cluster).
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import type { AdmitResult, Lease } from '../../src/limits/limiter.js';
import type { RedisLimiter } from '../../src/limits/redis/limiter.js';
import { type RunScript, scriptRunner } from '../../src/limits/redis/scripts.js';
import { blocksIn, leasingInstances } from '../helpers/redis-harness.js';
import { watchEvals } from '../helpers/redis-monitor.js';
import { waitFor } from '../helpers/redis-server.js';
import { input, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const URL = TEST_REDIS_URL;

describe('blocks of concurrency slots', { timeout: 60_000 }, () => {
  const prefix = uid('kwtest');
  const fleet = leasingInstances(URL, prefix);
  const instance = (o: { sliceMs?: number; leaseMs?: number } = {}) => fleet.instance(o);
  after(() => fleet.close());
  const ok = (rs: AdmitResult[]): Lease[] => rs.flatMap((r) => (r.ok ? [r.lease] : []));
  /** Slots Redis counts in use for the key now: its live members (a block of k is k), read in one MULTI. */
  const inUse = async (client: Redis, key: string): Promise<number> => {
    const set = `{${prefix}:k:${key}}:conc`;
    const res = (await client.multi().time().zrange(set, '0', '-1', 'WITHSCORES').exists(`${set}w`).exec())!;
    assert.equal(res[2]![1], 0, 'no version 2 block weights are written');
    const [sec, usec] = res[0]![1] as [string, string];
    const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
    const members = res[1]![1] as string[];
    let n = 0;
    for (let i = 1; i < members.length; i += 2) if (Number(members[i]) > now) n++;
    return n;
  };
  /** Sequential admit + finish: builds demand history, so the instance asks for a block. */
  const warm = async (lim: RedisLimiter, key: string, concurrency: number, n = 10): Promise<void> => {
    for (let i = 0; i < n; i++) {
      const r = await lim.admit(input(key, { limits: { concurrency } }));
      assert.ok(r.ok);
      r.lease.finish({ tokens: null });
    }
  };

  test('near the limit, C+1 at once across two instances admit exactly C', async () => {
    const a = await instance();
    const b = await instance();
    const key = uid('k');
    const C = 64;
    const limits = { concurrency: C };
    await warm(a.lim, key, C);
    assert.ok(a.lim.slotBlocksHeld() > 0, 'far from its limit the instance holds a block');
    // 40 in flight, one after another from both instances: some from a's block.
    const held: Lease[] = [];
    for (let i = 0; i < 40; i++) held.push(ok([await (i % 2 ? a : b).lim.admit(input(key, { limits }))])[0]!);
    assert.equal(held.length, 40);
    const n = C - 40;
    const rs = await Promise.all(Array.from({ length: n + 1 }, (_, i) => (i % 2 ? a : b).lim.admit(input(key, { limits }))));
    const burst = ok(rs);
    assert.equal(burst.length, n, `${n} free, ${n + 1} sent`);
    assert.equal(await inUse(a.client, key), C, 'Redis counts exactly C in use');
    assert.ok(rs.filter((r) => !r.ok).every((r) => !r.ok && r.code === 'concurrency_exceeded'));
    for (const l of [...held, ...burst]) l.finish({ tokens: null });
    // Freed slots are usable again, from either instance.
    await waitFor(async () => (await inUse(a.client, key)) <= 8, 5_000, 'the slots are freed');
    const again = ok(await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).lim.admit(input(key, { limits })))));
    assert.equal(again.length, 20);
    for (const l of again) l.finish({ tokens: null });
  });

  test('under load from three instances the sum in flight never exceeds C', async (t) => {
    // Blocks are not given back during the run (sliceMs past it): they stay in use near the limit.
    const all = await Promise.all([instance({ sliceMs: 10_000 }), instance({ sliceMs: 10_000 }), instance({ sliceMs: 10_000 })]);
    const key = uid('k');
    const C = 48;
    const limits = { concurrency: C };
    // Each instance first sees a few requests at once while the key is far from its limit,
    // so it holds a full-size block when the load starts.
    for (const { lim } of all) {
      for (let round = 0; round < 4; round++) {
        const rs = await Promise.all(Array.from({ length: 4 }, () => lim.admit(input(key, { limits }))));
        for (const l of ok(rs)) l.finish({ tokens: null });
      }
    }
    const blocks = blocksIn(await all[0]!.client.zrange(`{${prefix}:k:${key}}:conc`, '0', '-1'));
    assert.deepEqual([...blocks.values()], [[1, 2, 3], [1, 2, 3], [1, 2, 3]], 'three blocks of C/16 slots, members #1..#3');
    let inFlight = 0;
    let maxInFlight = 0;
    let admitted = 0;
    let denials = 0;
    let blocksSeen = 0;
    let maxRedis = 0;
    let stop = false;
    const sampler = (async () => {
      while (!stop) {
        maxRedis = Math.max(maxRedis, await inUse(all[0]!.client, key));
        await new Promise((r) => setImmediate(r));
      }
    })();
    const started = performance.now();
    await Promise.all(
      all.flatMap(({ lim }) =>
        Array.from({ length: 24 }, async () => {
          while (performance.now() - started < 1_500) {
            const r = await lim.admit(input(key, { limits }));
            blocksSeen = Math.max(blocksSeen, all.reduce((n, i) => n + i.lim.slotBlocksHeld(), 0));
            if (!r.ok) {
              denials++;
              await new Promise((res) => setImmediate(res));
              continue;
            }
            admitted++;
            maxInFlight = Math.max(maxInFlight, ++inFlight);
            // The response takes a moment (a few ticks of I/O).
            await new Promise((res) => setTimeout(res, 2 + Math.floor(Math.random() * 8)));
            inFlight--;
            r.lease.finish({ tokens: null });
          }
        }),
      ),
    );
    stop = true;
    await sampler;
    t.diagnostic(`admitted ${admitted}, ${denials} denials, max in flight ${maxInFlight} (Redis ${maxRedis}), blocks seen ${blocksSeen}`);
    assert.ok(blocksSeen > 0, 'instances admitted from blocks');
    assert.ok(denials > 0, 'the limit was reached');
    assert.ok(maxInFlight <= C, `max in flight ${maxInFlight} > ${C}`);
    assert.ok(maxInFlight >= C / 2, `the load reached the limit (${maxInFlight})`);
    assert.ok(maxRedis <= C, `Redis counted ${maxRedis} > ${C}`);
  });

  test("a dead instance's block comes back by expiry; a live one gives back unused slots", async () => {
    const leaseMs = 600;
    const dead = await instance({ leaseMs });
    const live = await instance({ leaseMs, sliceMs: 200 });
    const key = uid('k');
    const C = 64;
    await warm(dead.lim, key, C);
    assert.equal(dead.lim.slotBlocksHeld(), 1);
    const weight = await inUse(live.client, key);
    assert.ok(weight >= 2, `the block counts its whole weight (${weight})`);
    // One request in flight on the block, then the instance dies: no give-back, no close.
    assert.ok((await dead.lim.admit(input(key, { limits: { concurrency: C } }))).ok);
    dead.client.disconnect();
    const diedAt = performance.now();
    // The block is still held after its instance died. Its weight may differ from the warm-up's:
    // the admission resizes it to its demand, whose window can roll in between on a slow machine.
    const held = await inUse(live.client, key);
    assert.ok(held >= 1, `nothing gives the block back early (${held} in use)`);
    await waitFor(async () => (await inUse(live.client, key)) === 0, 10_000, 'the dead block expires');
    const waited = performance.now() - diedAt;
    assert.ok(waited <= leaseMs + 1_000, `expired after ${Math.round(waited)} ms`);
    // All C slots are there again.
    const rs = ok(await Promise.all(Array.from({ length: C + 1 }, () => live.lim.admit(input(key, { limits: { concurrency: C } })))));
    assert.equal(rs.length, C);
    for (const l of rs) l.finish({ tokens: null });

    // A live instance gives its unused slots back by itself once they stayed free a sliceMs.
    const key2 = uid('k');
    await warm(live.lim, key2, C);
    assert.ok(live.lim.slotBlocksHeld() > 0);
    assert.ok((await inUse(live.client, key2)) >= 2);
    await waitFor(async () => live.lim.slotBlocksHeld() === 0 && (await inUse(live.client, key2)) === 0, 5_000, 'the live block is given back');
  });

  test('a refresh names the leases Redis no longer records and extends only the others', async () => {
    const { client } = await instance();
    const run = scriptRunner(client);
    const set = `{${prefix}:k:${uid('k')}}:conc`;
    const [sec] = await client.time();
    const soon = Number(sec) * 1000 + 500;
    const block = ['block-1#1', 'block-1#2', 'block-1#3', 'block-1#4'];
    await client.zadd(set, ...block.flatMap((m) => [soon, m]), soon, 'slot-1');
    await client.pexpire(set, 500);
    // slot-2 expired and was purged (or was never there): it must not come back
    const missing = await run('keywardRefresh', [set], [60_000, 'block-1', 'slot-2', 'slot-1']);
    assert.deepEqual(missing, ['slot-2']);
    const scores = await client.zrange(set, '0', '-1', 'WITHSCORES');
    assert.deepEqual(scores.filter((_, i) => i % 2 === 0).sort(), [...block, 'slot-1'], 'slot-2 not re-added');
    for (let i = 1; i < scores.length; i += 2) assert.ok(Number(scores[i]) > soon + 50_000, 'every present lease, each slot of the block, pushed a lease ahead');
    assert.ok((await client.pttl(set)) > 50_000, 'the set lives as long as its leases');
    assert.deepEqual(await run('keywardRefresh', [set], [60_000, 'block-1']), [], 'all found: nothing missing');
    assert.deepEqual(await run('keywardRefresh', [set], [60_000, 'block-2']), ['block-2'], 'a block with no member is missing');
    await client.del(set);
  });

  /**
   * lease.lua as lease-path.ts calls it, for a key limited by concurrency C alone: one request,
   * asking its block `blockId` to be `want` slots while at most `keep` are in use.
   */
  const leaseScript = (run: RunScript, key: string, c: number, o: { blockId?: string; want?: number; keep?: number } = {}): Promise<number[]> => {
    const t = `{${prefix}:k:${key}}`;
    return run('keywardLease', [`${t}:rpm`, `${t}:tpm`, `${t}:conc`, `${t}:concw`], [
      0, 0, 0, 0, '', 0, 0, uid('s'), 0, 0, 10_000, 0, 0,
      c, uid('slot'), 30_000, o.blockId ?? '', o.want ?? 0, o.keep ?? 0,
    ]) as Promise<number[]>;
  };

  test('a block is granted only while the slots in use, the block included, stay within the share kept back', async () => {
    const { client } = await instance();
    const run = scriptRunner(client);
    const key = uid('k');
    for (let i = 0; i < 12; i++) assert.equal((await leaseScript(run, key, 32))[0], 1);
    // 13 in use with this request, + 4 = 17 > 16: the request is admitted, the block refused.
    // One slot past the share would let blocks eat into what other instances need near C.
    const over = await leaseScript(run, key, 32, { blockId: 'b1', want: 4, keep: 16 });
    assert.equal(over[0], 1);
    assert.equal(over[9], 0, 'no block past the share kept');
    assert.equal(await inUse(client, key), 13);
    // On another key, 12 in use with the request + 4 = 16: granted.
    const key2 = uid('k');
    for (let i = 0; i < 11; i++) await leaseScript(run, key2, 32);
    assert.equal((await leaseScript(run, key2, 32, { blockId: 'b2', want: 4, keep: 16 }))[9], 1, 'a block up to the share kept');
    assert.equal(await inUse(client, key2), 16);
  });

  test('shrinking a block frees exactly the slots above its new weight; 0 ends it', async () => {
    // A slot left behind in the set would count against C until the block's lease ran out.
    const { client } = await instance();
    const run = scriptRunner(client);
    const key = uid('k');
    const resize = (weight: number) => run('keywardSettle', [`{${prefix}:k:${key}}:conc`], ['', 0, 1, 'w', 'blk', weight, '']);
    assert.equal((await leaseScript(run, key, 64, { blockId: 'blk', want: 4, keep: 32 }))[9], 1);
    assert.equal(await inUse(client, key), 5, 'the request and a block of 4');
    assert.deepEqual(await resize(1), [1]);
    assert.equal(await inUse(client, key), 2, 'the request and a block of 1');
    assert.deepEqual(await resize(0), [1]);
    assert.equal(await inUse(client, key), 1, 'the request alone');
  });

  test('far from its limit a concurrency-limited request costs well under one Redis call', async (t) => {
    const { lim } = await instance();
    const evals = await watchEvals([URL], prefix);
    // Concurrency alone, and concurrency with RPM and TPM.
    const keys = [
      { key: uid('k'), limits: { concurrency: 1_000 } },
      { key: uid('k'), limits: { rpm: 1_000_000, tpm: 100_000_000, concurrency: 1_000 } },
    ];
    for (const k of keys) for (let i = 0; i < 3; i++) ok([await lim.admit(input(k.key, { limits: k.limits, tokens: 10 }))])[0]!.finish({ tokens: null });
    await evals.settle();
    evals.calls = 0;
    const requests = 2_000;
    let sent = 0;
    let blocks = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (sent < requests) {
          const k = keys[++sent % 2]!;
          const r = await lim.admit(input(k.key, { limits: k.limits, tokens: 100 }));
          assert.ok(r.ok);
          blocks = Math.max(blocks, lim.slotBlocksHeld());
          await new Promise((res) => setImmediate(res)); // in flight for a moment
          r.lease.finish({ tokens: 60 });
        }
      }),
    );
    await lim.close(); // flushes the batch, gives slices and unused slots back
    await evals.settle();
    evals.stop();
    const { calls } = evals;
    const perRequest = calls / requests;
    t.diagnostic(`${calls} Redis calls for ${requests} requests, ${blocks} blocks held`);
    assert.equal(blocks, 2);
    assert.ok(perRequest < 0.25, `${calls} Redis calls for ${requests} requests (${perRequest.toFixed(3)} per request)`);
  });
});

/**
 * The stored encoding of concurrency slots across versions (src/limits/redis/lua/slots.lua)
 * on one real Redis: a block of k slots is k members of the lease set, so an instance still
 * running the admit.lua of a build before blocks (test/fixtures/lua/admit-v1.lua, called
 * with EVAL and its own KEYS/ARGV, freeing a slot with ZREM as that build's settle.lua did)
 * counts it as k through its grant, shrink, refresh and expiry; a fleet of such an instance
 * and one with leasing on never has more than C requests of a key in flight; and today's
 * scripts still count a block 0.1.0 wrote (one member, its weight in `<set>w`).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import type { AdmitResult, Lease } from '../../src/limits/limiter.js';
import { scriptRunner } from '../../src/limits/redis/scripts.js';
import { blocksIn, leasingInstances } from '../helpers/redis-harness.js';
import { input, uid } from '../helpers/redis-limits-conformance.js';
import { waitFor } from '../helpers/redis-server.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const fixture = (file: string): string => readFileSync(new URL(`../fixtures/lua/${file}`, import.meta.url), 'utf8');
const ADMIT_V1 = fixture('admit-v1.lua').replace(/^-- #include bucket-v1\.lua$/m, () => fixture('bucket-v1.lua'));

/** An instance of the build before blocks: admit.lua's KEYS and ARGV of that build, for a key limited by concurrency alone. */
class OldInstance {
  private seq = 0;
  constructor(
    private readonly client: Redis,
    private readonly tag: string,
  ) {}

  /** The lease id on admission, else null (denied: concurrency_exceeded, code 4). */
  async admit(concurrency: number, leaseMs = 30_000): Promise<string | null> {
    const id = `v1-${++this.seq}`;
    const t = this.tag;
    const reply = (await this.client.eval(ADMIT_V1, 3, `${t}:rpm`, `${t}:tpm`, `${t}:conc`, id, leaseMs, '0', 0, 0, '1', 0, 0, concurrency, 0, 0, 0, 0)) as number[];
    if (reply[0] === 1) return id;
    assert.deepEqual(reply.slice(0, 2), [0, 4], `only the concurrency check can refuse (${JSON.stringify(reply)})`);
    return null;
  }

  /** That build's settle.lua freed a slot with ZREM of its lease id. */
  async release(id: string): Promise<void> {
    await this.client.zrem(`${this.tag}:conc`, id);
  }
}

describe('slot encoding across versions', { timeout: 60_000 }, () => {
  const prefix = uid('kwtest');
  const fleet = leasingInstances(TEST_REDIS_URL, prefix);
  after(() => fleet.close());
  const tagOf = (key: string): string => `{${prefix}:k:${key}}`;
  const ok = (rs: AdmitResult[]): Lease[] => rs.flatMap((r) => (r.ok ? [r.lease] : []));

  test('an old admit.lua counts a block of k slots as k: granted, shrunk, refreshed, ended, expired', async () => {
    const client = await fleet.connect();
    const run = scriptRunner(client);
    const t = tagOf(uid('k'));
    const set = `${t}:conc`;
    const old = new OldInstance(client, t);
    /** lease.lua for a key limited by concurrency alone (C = 64): one request's slot, and the block asked for. */
    const lease = (slotId: string, blockId: string, weight: number, leaseMs: number) =>
      run('keywardLease', [`${t}:rpm`, `${t}:tpm`, set, `${set}w`], [0, 0, 0, 0, '', 0, 0, uid('s'), 0, 0, 1000, 0, 0, 64, slotId, leaseMs, blockId, weight, 32]) as Promise<number[]>;
    /** The old script refuses at `limit` and admits at `limit + 1`: it counts exactly `limit` slots in use. */
    const oldCounts = async (limit: number): Promise<void> => {
      assert.equal(await old.admit(limit), null, `the old script counts at least ${limit}`);
      const id = await old.admit(limit + 1);
      assert.ok(id, `the old script counts at most ${limit}`);
      await old.release(id);
    };

    const granted = await lease('slot-a', 'block-1', 5, 30_000);
    assert.deepEqual(granted.slice(9), [1, 5], 'a block of 5 granted');
    await oldCounts(6); // the request's slot and the block's 5
    await run('keywardSettle', [set], ['', 0, 1, 'w', 'block-1', 2]);
    await oldCounts(3);
    const [sec] = await client.time();
    assert.deepEqual(await run('keywardRefresh', [set], [60_000, 'block-1', 'slot-a']), []);
    const scores = await client.zrange(set, '0', '-1', 'WITHSCORES');
    assert.deepEqual(scores.filter((_, i) => i % 2 === 0).sort(), ['block-1#1', 'block-1#2', 'slot-a']);
    for (let i = 1; i < scores.length; i += 2) assert.ok(Number(scores[i]) > Number(sec) * 1000 + 50_000, 'every member of the block refreshed');
    await oldCounts(3);
    await run('keywardSettle', [set], ['', 0, 1, 'w', 'block-1', 0]);
    await oldCounts(1);

    // A crashed instance's block: its members share one expiry and go together.
    const short = await lease('slot-b', 'block-2', 4, 300);
    assert.deepEqual(short.slice(9), [1, 4]);
    await oldCounts(6);
    const admitsAt = async (limit: number): Promise<boolean> => {
      const id = await old.admit(limit);
      if (id) await old.release(id);
      return id !== null;
    };
    await waitFor(() => admitsAt(2), 5_000, 'the block and its slot expire');
    await oldCounts(1);
    assert.deepEqual(await client.zrange(set, '0', '-1'), ['slot-a']);
  });

  test("today's scripts count a block 0.1.0 wrote: one member, its weight in <set>w", async () => {
    const { lim, client } = await fleet.instance();
    const [sec] = await client.time();
    const expiry = Number(sec) * 1000 + 30_000;
    // Per request (admit.lua, C under 16) and on the lease path (lease.lua).
    for (const { C, weight } of [{ C: 8, weight: 5 }, { C: 64, weight: 61 }]) {
      const key = uid('k');
      const set = `${tagOf(key)}:conc`;
      await client.zadd(set, expiry, 'legacy-block');
      await client.hset(`${set}w`, 'legacy-block', weight);
      const rs = ok(await Promise.all(Array.from({ length: C - weight + 1 }, () => lim.admit(input(key, { limits: { concurrency: C } })))));
      assert.equal(rs.length, C - weight, `C = ${C}: ${C - weight} free beside a legacy block of ${weight}`);
      for (const l of rs) l.finish({ tokens: null });
      // Once the block is gone, its weight is dropped by the next reader and every slot is free.
      await client.zrem(set, 'legacy-block');
      const all = ok(await Promise.all(Array.from({ length: C }, () => lim.admit(input(key, { limits: { concurrency: C } })))));
      assert.equal(all.length, C);
      assert.equal(await client.hexists(`${set}w`, 'legacy-block'), 0);
      for (const l of all) l.finish({ tokens: null });
    }
  });

  test('an old and a new instance hammering one key never have more than C in flight', async (t) => {
    const C = 64;
    const limits = { concurrency: C };
    const key = uid('k');
    const set = `${tagOf(key)}:conc`;
    // Blocks are not given back during the run (sliceMs past it): they stay in use near the limit.
    const { lim } = await fleet.instance({ sliceMs: 30_000 });
    const watcher = await fleet.connect();
    const old = new OldInstance(await fleet.connect(), tagOf(key));
    let inFlight = 0;
    let maxInFlight = 0;
    const admitted = { old: 0, new: 0 };
    let denials = 0;
    let maxBlock = 0;
    const hold = async (side: 'old' | 'new', end: () => Promise<void> | void): Promise<void> => {
      admitted[side]++;
      maxInFlight = Math.max(maxInFlight, ++inFlight);
      // The response takes a moment (a few ticks of I/O).
      await new Promise((res) => setTimeout(res, 1 + Math.floor(Math.random() * 6)));
      inFlight--;
      await end();
    };
    const newSide = async (until: number): Promise<void> => {
      while (performance.now() < until) {
        const r = await lim.admit(input(key, { limits }));
        if (r.ok) await hold('new', () => r.lease.finish({ tokens: null }));
        else denials++;
        if (!r.ok) await new Promise((res) => setImmediate(res));
      }
    };
    const oldSide = async (until: number): Promise<void> => {
      while (performance.now() < until) {
        const id = await old.admit(C);
        if (id) await hold('old', () => old.release(id));
        else denials++;
        if (!id) await new Promise((res) => setImmediate(res));
      }
    };
    /** The largest block in the set now. */
    const largestBlock = async (): Promise<number> => Math.max(0, ...[...blocksIn(await watcher.zrange(set, '0', '-1')).values()].map((js) => js.length));

    for (let round = 0; round < 4; round++) {
      // Far from the limit the new instance sees a few requests at once: it asks for a block.
      for (let i = 0; i < 4; i++) {
        const rs = ok(await Promise.all(Array.from({ length: 6 }, () => lim.admit(input(key, { limits })))));
        for (const l of rs) l.finish({ tokens: null });
      }
      maxBlock = Math.max(maxBlock, await largestBlock());
      const until = performance.now() + 400;
      let stop = false;
      const sampler = (async () => {
        while (!stop) {
          maxBlock = Math.max(maxBlock, await largestBlock());
          await new Promise((r) => setImmediate(r));
        }
      })();
      await Promise.all([...Array.from({ length: 48 }, () => newSide(until)), ...Array.from({ length: 48 }, () => oldSide(until))]);
      stop = true;
      await sampler;
    }
    t.diagnostic(`admitted old ${admitted.old}, new ${admitted.new}; ${denials} denials; max in flight ${maxInFlight}; largest block ${maxBlock}`);
    assert.ok(maxInFlight <= C, `max in flight ${maxInFlight} > ${C}`);
    assert.ok(maxBlock >= 2, `the new instance held a block of several slots (${maxBlock})`);
    assert.ok(admitted.old > 0 && admitted.new > 0, 'both instances admitted');
    assert.ok(denials > 0, 'the limit was reached');
    assert.ok(maxInFlight >= C - 8, `the load reached the limit (${maxInFlight})`);
  });
});

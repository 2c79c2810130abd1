/**
 * Spend slices on Redis (src/limits/redis/spend-slices.ts, lua/hold.lua, lua/settle.lua), read
 * from Redis itself: far from exhaustion most holds take no round trip (EVAL/EVALSHA calls
 * counted with MONITOR, on one node and on each master of a local Cluster); a slice is at
 * most 1/16 of what is left and none is granted near exhaustion; a holder near exhaustion
 * gives no slice to the others of the hold; settlements from a slice land in batches and
 * what is left goes back when its time is up and on close. Exactness on two instances is in
 * the conformance suite (limits-conformance-spend.ts), which runs with leasing on here too.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import type { Redis } from 'ioredis';
import type { HoldInput, HoldResult } from '../../src/limits/limiter.js';
import type { RedisLimiter } from '../../src/limits/redis/limiter.js';
import { type RunScript, scriptRunner } from '../../src/limits/redis/scripts.js';
import { SPEND_SLICE_SHARE } from '../../src/limits/redis/spend-slices.js';
import type { Holder } from '../../src/policy/holders.js';
import { keyBudget, projectBudget, wallet } from '../helpers/limits-conformance-ledger.js';
import { type LocalCluster, startRedisCluster } from '../helpers/redis-cluster.js';
import { leasingInstances } from '../helpers/redis-harness.js';
import { uid } from '../helpers/redis-limits-conformance.js';
import { watchEvals } from '../helpers/redis-monitor.js';
import { waitFor } from '../helpers/redis-server.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const NANO = 1e9;
const req = (tag: string, holders: Holder[], amount: number): HoldInput => ({ tag, holders, amount });
function held(r: HoldResult): { settle(actual: number): void } {
  assert.ok(r.ok, `expected a hold, got ${JSON.stringify(r)}`);
  return r.hold;
}

/** A holder's ledger hash as Redis has it: epoch, base0, settled, held, and each hold's or slice's amount (nano-units). */
async function ledgerHash(client: Redis, prefix: string, tag: string, holder: Holder): Promise<{ s: number; h: number; amounts: number[] }> {
  const v = await client.hgetall(`{${prefix}:t:${encodeURIComponent(tag)}}:l:${encodeURIComponent(holder.id)}`);
  const amounts = Object.entries(v).filter(([f]) => f.startsWith('a:')).map(([, a]) => Number(a));
  return { s: Number(v.s ?? 0), h: Number(v.h ?? 0), amounts };
}

/** 16 workers taking `n` holds on `sets` in turn, each settled a moment later at a fraction of its estimate. */
async function traffic(lim: RedisLimiter, sets: { tag: string; holders: Holder[] }[], n: number, amount: number): Promise<void> {
  let sent = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (sent < n) {
        const set = sets[++sent % sets.length]!;
        const h = held(await lim.hold(req(set.tag, set.holders, amount)));
        await new Promise((r) => setImmediate(r)); // in flight for a moment
        h.settle(amount * 0.6);
      }
    }),
  );
}

function roundTrips(name: string, target: () => { url: string; ports: number[] }): void {
  describe(`spend slices, round trips: ${name}`, { timeout: 60_000 }, () => {
    test('far from exhaustion most holds take no round trip; settlements and give-backs are the rest', async (t) => {
      const prefix = uid('kwtest');
      const fleet = leasingInstances(target().url, prefix);
      const evals = await watchEvals(target().ports.map((port) => `redis://127.0.0.1:${port}`), prefix);
      try {
        const { lim } = await fleet.instance();
        const sets = [
          { tag: uid('p'), holders: [keyBudget(uid('k'), { base: 0, limit: 1_000 }), projectBudget(uid('p'), { base: 0, limit: 10_000 })] },
          { tag: uid('u'), holders: [wallet(uid('u'), { base: 1_000 })] },
        ];
        await traffic(lim, sets, 40, 0.001); // scripts loaded, demand seen
        await evals.settle();
        evals.calls = 0;
        const holds = 2_000;
        let slices = 0;
        const watch = setInterval(() => (slices = Math.max(slices, lim.spendSlicesHeld())), 1);
        await traffic(lim, sets, holds, 0.001);
        clearInterval(watch);
        await lim.close(); // flushes the batch, gives the slices back
        await evals.settle();
        const perHold = evals.calls / holds;
        t.diagnostic(`${evals.calls} Redis calls for ${holds} holds, up to ${slices} spend slices held`);
        assert.ok(slices >= 3, `a slice on each holder (${slices})`);
        assert.ok(perHold < 0.1, `${evals.calls} Redis calls for ${holds} holds (${perHold.toFixed(3)} per hold)`);
        // Everything settled and given back: Redis holds nothing, and has every cost.
        const c = await fleet.connect();
        for (const set of sets) {
          for (const holder of set.holders) {
            const l = await ledgerHash(c, prefix, set.tag, holder);
            assert.equal(l.h, 0, `${holder.id}: nothing held after close`);
            assert.equal(l.s, Math.round(((holds + 40) / 2) * 0.0006 * NANO), `${holder.id}: every cost settled`);
          }
        }
      } finally {
        // A monitor left connected would hold the test process open.
        evals.stop();
        await fleet.close();
      }
    });
  });
}

describe('spend slices on one Redis', { timeout: 60_000 }, () => {
  const prefix = uid('kwtest');
  const fleet = leasingInstances(TEST_REDIS_URL, prefix);
  after(() => fleet.close());

  test('a slice is at most 1/16 of what is left, and none is granted within 32 holds of exhaustion', async () => {
    // A window of a second: the demand it records must outlast a stalled machine's pause.
    const { lim, client } = await fleet.instance({ sliceMs: 1_000 });
    const tag = uid('t');
    const key = keyBudget(uid('k'), { base: 90, limit: 100 }); // 10 left
    // Demand of 2 in a window (200 holds of 0.01, released at 0: the slice's record stays what
    // was granted); once that window's slice is over, the next exact hold asks for 2.
    for (let i = 0; i < 200; i++) held(await lim.hold(req(tag, [key], 0.01))).settle(0);
    await waitFor(() => lim.spendSlicesHeld() === 0, 5_000, "the window's slice is given back");
    const inFlight = held(await lim.hold(req(tag, [key], 0.01)));
    const l = await ledgerHash(client, prefix, tag, key);
    const slice = l.amounts.filter((a) => a !== 0.01 * NANO);
    assert.deepEqual(slice, [Math.floor((10 - 0.01) * NANO / SPEND_SLICE_SHARE)], '1/16 of what is left after the hold, not the 2 asked for');
    inFlight.settle(0);
    // Near exhaustion: 0.2 left, holds of 0.01; a slice would have to be 1/16 of it and cover two.
    const near = keyBudget(uid('k'), { base: 99.8, limit: 100 });
    for (let i = 0; i < 10; i++) held(await lim.hold(req(tag, [near], 0.01))).settle(0.01);
    await lim.ledger({ tag, holders: [near] }); // the settlements have left (a call sends the batch first)
    assert.deepEqual((await ledgerHash(client, prefix, tag, near)).amounts, [], 'no slice near exhaustion');
  });

  test('a holder near exhaustion gives no slice to the other holders of the hold either', async () => {
    const { lim, client } = await fleet.instance();
    const tag = uid('t');
    const key = keyBudget(uid('k'), { base: 0, limit: 1_000 });
    const project = projectBudget(uid('p'), { base: 49.98, limit: 50 }); // 20 holds' worth left
    for (let i = 0; i < 10; i++) held(await lim.hold(req(tag, [key, project], 0.001))).settle(0.001);
    await lim.ledger({ tag, holders: [key, project] });
    assert.equal(lim.spendSlicesHeld(), 0);
    assert.deepEqual((await ledgerHash(client, prefix, tag, key)).amounts, [], 'the key has room, but its project does not');
  });

  test('a cost past its hold leaves for Redis at once, not at the next settlement tick', async () => {
    // a tick longer than the test: only the overrun's own flush can bring its cost to Redis
    const { lim, client } = await fleet.instance({ settleEveryMs: 600_000 });
    const tag = uid('t');
    const sliced = wallet(uid('u'), { base: 100 });
    held(await lim.hold(req(tag, [sliced], 0.01))).settle(0.01); // asks for a slice: the exact call sends the batch first
    for (let i = 0; i < 20; i++) held(await lim.hold(req(tag, [sliced], 0.01))).settle(0.01);
    assert.equal(lim.spendSlicesHeld(), 1);
    held(await lim.hold(req(tag, [sliced], 0.01))).settle(60); // from the slice, far past it
    await waitFor(async () => (await ledgerHash(client, prefix, tag, sliced)).s >= 60 * NANO, 2_000, 'the slice\'s overrun settled in Redis');
    const exact = wallet(uid('u'), { base: 100 });
    held(await lim.hold(req(tag, [exact], 0.01))).settle(30); // a hold.lua hold, past its amount
    await waitFor(async () => (await ledgerHash(client, prefix, tag, exact)).s === 30 * NANO, 2_000, 'the exact hold\'s overrun settled in Redis');
  });

  test('what is left of a slice goes back when its time is up; every cost it took is settled', async () => {
    const { lim, client } = await fleet.instance({ sliceMs: 200 });
    const tag = uid('t');
    const w = wallet(uid('u'), { base: 100 });
    for (let i = 0; i < 50; i++) held(await lim.hold(req(tag, [w], 0.01))).settle(0.004);
    assert.equal(lim.spendSlicesHeld(), 1);
    await waitFor(() => lim.spendSlicesHeld() === 0, 5_000, 'the slice is given back');
    await waitFor(async () => (await ledgerHash(client, prefix, tag, w)).h === 0, 5_000, 'Redis holds nothing');
    const l = await ledgerHash(client, prefix, tag, w);
    assert.equal(l.s, 50 * 0.004 * NANO, 'every cost settled');
    assert.deepEqual(l.amounts, []);
  });

  test('another instance reads live figures without this one\'s unused slice: spent is settled costs and holds in flight (GET /v1/key, alerts)', async () => {
    const a = await fleet.instance({ sliceMs: 5_000 });
    const b = await fleet.instance({ sliceMs: 5_000 });
    const tag = uid('t');
    const key = keyBudget(uid('k'), { base: 0, limit: 1_000 });
    const w = wallet(uid('u'), { base: 100 });
    for (let i = 0; i < 50; i++) held(await a.lim.hold(req(tag, [key, w], 0.01))).settle(0.004);
    assert.equal(a.lim.spendSlicesHeld(), 2, 'a slice of each holder, most of it unused');
    const inFlight = held(await a.lim.hold(req(tag, [key, w], 0.01)));
    await a.lim.ledger({ tag, holders: [key, w] }); // a's settlements leave first, with what is in flight
    const spent = 50 * 0.004 + 0.01;
    for (const [who, lim] of [['this instance', a.lim], ['another instance', b.lim]] as const) {
      const [k, u] = await lim.ledger({ tag, holders: [key, w] });
      assert.ok(Math.abs(k!.live - spent) < 1e-9, `${who}: key spent ${k!.live}, not ${spent} plus the slice`);
      assert.ok(Math.abs(u!.live - (100 - spent)) < 1e-9, `${who}: balance ${u!.live}`);
    }
    inFlight.settle(0.004);
    await a.lim.ledger({ tag, holders: [key, w] });
    const [k] = await b.lim.ledger({ tag, holders: [key, w] });
    assert.ok(Math.abs(k!.live - 51 * 0.004) < 1e-9, `settled: ${k!.live}`);
  });

  /**
   * hold.lua as the limiter calls it: a ledger with one hold of 10 (h1) and a live slice of 100
   * (~s1) on a budget of 1,000, in nano-units.
   */
  const sliced = async (): Promise<{ client: Redis; run: RunScript; L: string; Z: string }> => {
    const client = await fleet.connect();
    const run = scriptRunner(client);
    const tag = `{${prefix}:t:${uid('t')}}`;
    const [L, Z] = [`${tag}:l:key`, `${tag}:lh:key`];
    const reply = (await run('keywardHold', [L, Z], [86_400_000, 30_000, 4, 1, 'h1', 10, 0, 1, '~s1', 1, 'budget', 0, 1_000, 1, 100, ''])) as number[];
    assert.deepEqual(reply.slice(1), [1, 0, 100], 'held, with a slice of 100');
    return { client, run, L, Z };
  };
  /** settle.lua's 'm' op, as the limiter sends it for a slice: cost, what the slice absorbed (take), end. */
  const settleSlice = (run: RunScript, L: string, Z: string, o: { cost: number; take: number; end: boolean; channel?: string }) =>
    run('keywardSettle', [L, Z], ['', 0, 1, 'm', '~s1', o.cost, o.take, o.end ? '1' : '0', 86_400_000, 'budget', 0, o.channel ?? '']);
  /** The first message on `channel` after the script ran: ours is published after it, so a script that published nothing yields ours. */
  const firstNews = async (client: Redis, channel: string, settle: () => Promise<unknown>): Promise<{ reply: unknown; news: string }> => {
    const sub = await fleet.connect();
    try {
      await sub.subscribe(channel);
      const next = once(sub, 'message').then(([, message]) => String(message));
      const reply = await settle();
      await client.publish(channel, 'nothing before this');
      return { reply, news: await next };
    } finally {
      sub.disconnect();
    }
  };

  test('a slice ended with nothing taken gives all of its rest back: what stays in flight is the requests\' holds', async () => {
    // Were only `take` taken out of `h`, the slice's rest would stay held for good, with no
    // record left to expire or settle it: the budget would refuse that much until a new epoch.
    const { client, run, L, Z } = await sliced();
    assert.equal(await client.hget(L, 'h'), '110');
    assert.deepEqual(await settleSlice(run, L, Z, { cost: 0, take: 0, end: true }), [1]);
    assert.equal(await client.hget(L, 'a:~s1'), null, 'the slice is gone');
    assert.equal(await client.zscore(Z, '~s1'), null);
    assert.equal(await client.hget(L, 'h'), '10', 'only the request\'s hold is still in flight');
  });

  // DESIGN section 6: a budget spent by settled usage refuses the next request at once, on
  // every instance: the over-commitment voids the live slices and is news on the channel.
  test('a hold settled past its amount that over-commits the budget is news, and voids the live slice', async () => {
    const { client, run, L, Z } = await sliced();
    const channel = `${prefix}:news:${uid('c')}`;
    // 950 settled + 100 of slice in flight > 1,000.
    const { reply, news } = await firstNews(client, channel, () => run('keywardSettle', [L, Z], ['', 0, 1, 'h', 'h1', '950', 86_400_000, 1, 'budget', channel]));
    assert.deepEqual(reply, [1]);
    assert.equal(news, L, 'the ledger is news');
    // The slice's next settlement (nothing to report) is answered void: op 1.
    assert.deepEqual(await settleSlice(run, L, Z, { cost: 0, take: 0, end: false }), [1, 1]);
  });

  test('a cost through a slice past what it absorbed that over-commits the budget is news', async () => {
    const { client, run, L, Z } = await sliced();
    const channel = `${prefix}:news:${uid('c')}`;
    // 950 charged through the slice, none of it absorbed (take 0): 950 + 110 > 1,000.
    const { reply, news } = await firstNews(client, channel, () => settleSlice(run, L, Z, { cost: 950, take: 0, end: false, channel }));
    assert.deepEqual(reply, [1, 1]);
    assert.equal(news, L, 'the ledger is news');
  });
});

roundTrips('one node', () => ({ url: TEST_REDIS_URL, ports: [Number(new URL(TEST_REDIS_URL).port || 6379)] }));

describe('spend slices on a local Redis Cluster', () => {
  let cluster: LocalCluster;
  before(async () => {
    cluster = await startRedisCluster(3);
  });
  after(async () => cluster?.stop());
  roundTrips('Redis Cluster (3 masters)', () => ({ url: cluster.url, ports: cluster.ports }));
});

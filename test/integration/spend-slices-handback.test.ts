/**
 * Other instances' spend slices never make a hold that fits refuse (DESIGN section 6: live
 * spend counts the holds of requests in flight). Two instances busy on a wallet hold slices
 * of it; the traffic moves to a third, and the wallet comes near exhaustion: with R left,
 * 20 holds of R/2.5 at once on the third admit exactly 2, the idle instances having been
 * told to give their slices back. A hold refused for real is refused at once: what a slice
 * given back still holds is holds of requests in flight. On one Redis, through real limiters.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createRedisClient } from '../../src/limits/redis/client.js';
import { Redis } from 'ioredis';
import { held, req, wallet } from '../helpers/limits-conformance-ledger.js';
import { leasingInstances } from '../helpers/redis-harness.js';
import { uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { LEDGER_NEWS_CHANNEL } from '../../src/limits/redis/ledger-news.js';

const NANO = 1e9;
const prefix = uid('kwtest');
const fleet = leasingInstances(TEST_REDIS_URL, prefix);
const client = createRedisClient({ url: TEST_REDIS_URL, timeoutMs: 2_000 }) as Redis;
after(async () => {
  await fleet.close();
  client.disconnect();
});

test('20 holds of R/2.5 on an instance while two others hold slices of the wallet: exactly 2 held', async () => {
  const tag = uid('u');
  const w = wallet(uid('u'), { base: 100 });
  const [a, b, c] = [await fleet.instance(), await fleet.instance(), await fleet.instance()];
  // A and B busy on the wallet: each comes to hold a slice of it
  for (let round = 0; round < 6; round++) {
    const hs = await Promise.all([a, b].flatMap(({ lim }) => Array.from({ length: 8 }, () => lim.hold(req(tag, [w], 1)))));
    for (const h of hs) held(h).settle(0.5);
  }
  assert.ok(a.lim.spendSlicesHeld() > 0 && b.lim.spendSlicesHeld() > 0, 'both idle instances hold a slice');
  await new Promise((r) => setTimeout(r, 20)); // the settlements land
  const ledgerKey = `{${prefix}:t:${encodeURIComponent(tag)}}:l:${encodeURIComponent(w.id)}`;
  const figures = async () => {
    const v = await client.hmget(ledgerKey, 's', 'h');
    return { s: Number(v[0]) / NANO, h: Number(v[1]) / NANO };
  };
  const warm = await figures();
  assert.ok(warm.h > 0, 'the slices count in Redis');
  // C spends the wallet down to R = twice what the slices hold, so that they would leave room for one hold only
  const R = 2 * warm.h;
  const burn = 100 - warm.s - R;
  held(await c.lim.hold(req(tag, [w], burn))).settle(burn);
  await new Promise((r) => setTimeout(r, 20));
  const before = await figures();
  assert.ok(Math.abs(100 - before.s - R) < 1e-6, `R left (${100 - before.s} against ${R})`);
  const results = await Promise.all(Array.from({ length: 20 }, () => c.lim.hold(req(tag, [w], R / 2.5))));
  const codes = results.map((r) => (r.ok ? 'held' : r.code));
  assert.equal(codes.filter((x) => x === 'held').length, 2, codes.join(','));
  assert.deepEqual([...new Set(codes.filter((x) => x !== 'held'))], ['insufficient_balance']);
  assert.equal(a.lim.spendSlicesHeld() + b.lim.spendSlicesHeld(), 0, 'the idle instances gave their slices back');
});

test('a hold refused for real beside holds in flight from a slice given back: refused at once, no news', async () => {
  const tag = uid('u');
  const w = wallet(uid('u'), { base: 100 });
  const { lim } = await fleet.instance();
  for (let round = 0; round < 6; round++) {
    const hs = await Promise.all(Array.from({ length: 8 }, () => lim.hold(req(tag, [w], 1))));
    for (const h of hs) held(h).settle(0.5);
  }
  assert.ok(lim.spendSlicesHeld() > 0);
  // four requests holding from the slice, still in flight
  const inFlight = [];
  for (let i = 0; i < 4; i++) inFlight.push(held(await lim.hold(req(tag, [w], 1))));
  const v = await client.hmget(`{${prefix}:t:${encodeURIComponent(tag)}}:l:${encodeURIComponent(w.id)}`, 's');
  const settled = Number(v[0]) / NANO;
  const sub = new Redis(TEST_REDIS_URL);
  const heard: string[] = [];
  sub.on('message', (_channel: string, message: string) => heard.push(message));
  await sub.subscribe(LEDGER_NEWS_CHANNEL);
  try {
    // more than what is left beside the four, less than what is left without them
    const r = await lim.hold(req(tag, [w], 100 - settled - 4 + 0.5));
    assert.equal(r.ok ? 'held' : r.code, 'insufficient_balance');
    // news is delivered in the order it is published: a mark published after the hold comes after any news of it
    const mark = uid('mark');
    const marked = new Promise<void>((resolve) => sub.on('message', (_c: string, m: string) => m === mark && resolve()));
    await client.publish(LEDGER_NEWS_CHANNEL, mark);
    await marked;
    assert.deepEqual(heard, [mark], 'no news: nothing was in the way but holds of requests');
  } finally {
    sub.disconnect();
    for (const h of inFlight) h.settle(1);
  }
});

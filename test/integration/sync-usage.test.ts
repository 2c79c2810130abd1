import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createUsagePusher } from '../../src/sync/client.js';
import type { UsageEvent } from '../../src/protocol/usage.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { until } from '../helpers/console-replica.js';
import { waitFor } from '../helpers/redis-server.js';

let fx: ConsoleFixture;
let keyId: string;
before(async () => {
  fx = await startConsoleFixture();
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_u', budget: 100 } });
  keyId = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_u' } })).body.key.id;
});
after(async () => {
  await fx.close();
});

let seq = 0;
const ev = (over: Partial<UsageEvent> = {}): UsageEvent => ({
  request_id: `req-${++seq}`, key_id: keyId, model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, status: 200, at: new Date().toISOString(), ...over,
});
const PER_EVENT = 0.0035; // 1000 in at 2.5/M + 100 out at 10/M
const spent = async () => (await fx.api('GET', `/admin/v1/keys/${keyId}`)).body.key.spent as number;

function pusher(over: Partial<Parameters<typeof createUsagePusher>[0]> = {}) {
  return createUsagePusher({ url: fx.url, token: fx.tokens.sync, maxBuffer: 100, batchSize: 10, flushMs: 20, backoff: { baseMs: 10, maxMs: 40 }, ...over });
}

test('events are sent in batches and charged', async () => {
  const before = await spent();
  const p = pusher();
  for (let i = 0; i < 25; i++) p.push(ev());
  await p.flush();
  assert.deepEqual(p.stats(), { buffered: 0, sent: 25, dropped: 0, rejected: 0, failures: 0 });
  assert.equal(+((await spent()) - before).toFixed(9), +(25 * PER_EVENT).toFixed(9));
  await p.stop();
});

test('a push says when it was sent (Date), so the console can read the two clocks\' skew', async () => {
  const dates: (string | null)[] = [];
  const watching: typeof fetch = async (input, init) => {
    dates.push(new Headers(init?.headers).get('date'));
    return fetch(input, init);
  };
  const p = pusher({ fetch: watching });
  p.push(ev());
  await p.flush();
  assert.equal(dates.length, 1);
  assert.ok(Math.abs(Date.parse(dates[0]!) - Date.now()) < 5_000, String(dates[0]));
  await p.stop();
});

test('a flush with nothing buffered leaves the pusher sending what comes after', async () => {
  const before = await spent();
  const p = pusher({ flushMs: 60_000 });
  await p.flush();
  for (let i = 0; i < 3; i++) p.push(ev());
  await p.flush();
  assert.equal(p.stats().sent, 3);
  assert.equal(+((await spent()) - before).toFixed(9), +(3 * PER_EVENT).toFixed(9));
  await p.stop();
});

test('console away: events wait and are retried; a lost answer does not charge twice', async () => {
  const before = await spent();
  let loseNextAnswer = true;
  const lossy: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    if (loseNextAnswer) {
      loseNextAnswer = false;
      throw new Error('connection reset after the console took the batch');
    }
    return res;
  };
  const p = pusher({ fetch: lossy });
  for (let i = 0; i < 5; i++) p.push(ev());
  await p.flush();
  assert.equal(p.stats().failures, 1);
  assert.equal(p.stats().buffered, 5);

  await fx.console.close();
  for (let i = 0; i < 5; i++) p.push(ev());
  assert.ok(await until(() => p.stats().failures >= 3), 'retried while the console was away');
  assert.equal(p.stats().buffered, 10);
  await fx.restart();
  assert.ok(await until(() => p.stats().buffered === 0), 'delivered once the console returned');
  assert.equal(p.stats().sent, 10);
  assert.equal(+((await spent()) - before).toFixed(9), +(10 * PER_EVENT).toFixed(9), 'the batch whose answer was lost was charged once');
  await p.stop();
});

test('a full buffer drops and counts; stop counts what could not be delivered', async () => {
  const p = createUsagePusher({ url: 'http://127.0.0.1:1', token: 'x', maxBuffer: 5, batchSize: 2, flushMs: 1000, backoff: { baseMs: 10, maxMs: 20 } });
  for (let i = 0; i < 8; i++) p.push(ev());
  assert.equal(p.stats().buffered, 5);
  assert.equal(p.stats().dropped, 3);
  await p.stop();
  assert.deepEqual({ ...p.stats(), failures: 0 }, { buffered: 0, sent: 0, dropped: 8, rejected: 0, failures: 0 });
  p.push(ev());
  assert.equal(p.stats().dropped, 9, 'after stop, pushes are counted as dropped');
});

test('a batch the console refuses outright is counted as rejected, not retried forever', async () => {
  const refuse: typeof fetch = async () => new Response('{"error":{"code":"invalid_request","message":"no"}}', { status: 400 });
  const p = pusher({ fetch: refuse });
  for (let i = 0; i < 3; i++) p.push(ev());
  await p.flush();
  assert.deepEqual(p.stats(), { buffered: 0, sent: 0, dropped: 0, rejected: 3, failures: 0 });
  await p.stop();
});

test('a 404 (an ingress while the console redeploys) is retried: every event is billed once it answers again', async () => {
  let calls = 0;
  const flaky: typeof fetch = async (url, init) => (++calls <= 2 ? new Response('not found', { status: 404 }) : fetch(url, init));
  const before = await spent();
  const p = pusher({ fetch: flaky });
  for (let i = 0; i < 3; i++) p.push(ev());
  await waitFor(async () => p.stats().sent === 3, 5_000, 'the events sent after the 404s');
  assert.equal(p.stats().rejected, 0);
  assert.ok(p.stats().failures >= 2);
  await p.stop();
  await waitFor(async () => Math.abs((await spent()) - before - 3 * PER_EVENT) < 1e-9, 5_000, 'three events billed');
});

test('a 413 sends the same events again in smaller batches; only one event alone too large is refused', async () => {
  const sizes: number[] = [];
  const small: typeof fetch = async (url, init) => {
    const lines = String(init?.body ?? '').trim().split('\n').length;
    sizes.push(lines);
    return lines > 4 ? new Response('too large', { status: 413 }) : fetch(url, init);
  };
  const before = await spent();
  const p = pusher({ fetch: small });
  for (let i = 0; i < 10; i++) p.push(ev());
  await p.flush();
  assert.deepEqual(p.stats(), { buffered: 0, sent: 10, dropped: 0, rejected: 0, failures: 0 });
  assert.deepEqual(sizes.slice(0, 3), [10, 5, 3], 'halved until the console takes it');
  await waitFor(async () => Math.abs((await spent()) - before - 10 * PER_EVENT) < 1e-9, 5_000, 'ten events billed');
  await p.stop();

  const never: typeof fetch = async () => new Response('too large', { status: 413 });
  const q = pusher({ fetch: never });
  q.push(ev());
  await q.flush();
  assert.deepEqual(q.stats(), { buffered: 0, sent: 0, dropped: 0, rejected: 1, failures: 0 });
  await q.stop();
});

test('after a failed push the timer waits out the backoff: no retry before the retry time on the injected clock', async () => {
  let attempts = 0;
  const down: typeof fetch = async () => {
    attempts++;
    throw new Error('connect ECONNREFUSED');
  };
  let now = 1_000_000;
  // first retry 5 to 10 s away on this clock, which does not move until the test moves it
  const p = pusher({ fetch: down, now: () => now, backoff: { baseMs: 10_000, maxMs: 10_000 } });
  p.push(ev());
  await p.flush();
  assert.equal(attempts, 1);
  // a retry that must not happen has no event to await: give the 20 ms timer 15 turns
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(attempts, 1, 'no retry while the clock is before the retry time');
  now += 10_001;
  await waitFor(async () => attempts === 2, 2_000, 'retried once the clock passed the retry time');
  await p.stop();
});

test('a 401 (a sync token being rolled out) is retried, not refused for good: every event is billed once the token is taken', async () => {
  let wrong = 2;
  const rolling: typeof fetch = async (url, init) => {
    if (wrong-- <= 0) return fetch(url, init);
    // the real console, refusing a token it does not know yet
    return fetch(url, { ...init, headers: { ...(init?.headers as Record<string, string>), authorization: 'Bearer not-yet-rolled-out' } });
  };
  const before = await spent();
  const p = pusher({ fetch: rolling });
  for (let i = 0; i < 3; i++) p.push(ev());
  await waitFor(async () => p.stats().sent === 3, 5_000, 'the events sent once the token is taken');
  assert.equal(p.stats().rejected, 0);
  assert.ok(p.stats().failures >= 2);
  await p.stop();
  await waitFor(async () => Math.abs((await spent()) - before - 3 * PER_EVENT) < 1e-9, 5_000, 'three events billed');
});

test('two flushes waiting on one failed push send what is buffered once, and lose nothing', async () => {
  const posted: string[] = [];
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let failNext = true;
  const once: typeof fetch = async (url, init) => {
    const ids = String(init?.body ?? '').trim().split('\n').map((l) => (JSON.parse(l) as UsageEvent).request_id);
    if (failNext) {
      failNext = false;
      await held; // in flight until the other flushes have been asked for
      throw new Error('connection reset');
    }
    posted.push(...ids);
    return fetch(url, init);
  };
  const before = await spent();
  const p = pusher({ fetch: once, batchSize: 2, flushMs: 60_000 });
  const sent = [ev(), ev(), ev()];
  // below batchSize: nothing goes until a flush
  p.push(sent[0]!);
  const first = p.flush(); // its push fails; the event stays buffered
  p.push(sent[1]!);
  p.push(sent[2]!);
  const second = p.flush();
  const third = p.flush();
  release();
  await Promise.all([first, second, third]);
  assert.deepEqual([...posted].sort(), sent.map((e) => e.request_id).sort(), 'each event posted once');
  assert.deepEqual({ ...p.stats(), failures: 0 }, { buffered: 0, sent: 3, dropped: 0, rejected: 0, failures: 0 });
  await p.stop();
  await waitFor(async () => Math.abs((await spent()) - before - 3 * PER_EVENT) < 1e-9, 5_000, 'three events billed');
});

test('after a 413 the batch size comes back once the console takes a batch: later events are not sent in small batches forever', async () => {
  const sizes: number[] = [];
  let tooLarge = 1;
  const once413: typeof fetch = async (url, init) => {
    sizes.push(String(init?.body ?? '').trim().split('\n').length);
    return tooLarge-- > 0 ? new Response('too large', { status: 413 }) : fetch(url, init);
  };
  const p = pusher({ fetch: once413, flushMs: 60_000 });
  for (let i = 0; i < 10; i++) p.push(ev());
  await p.flush();
  assert.deepEqual(sizes, [10, 5, 5]);
  for (let i = 0; i < 10; i++) p.push(ev());
  await p.flush();
  assert.deepEqual(sizes.slice(3), [10], 'a whole batch again');
  assert.equal(p.stats().sent, 20);
  await p.stop();
});

test('a nudge (the console seen again) restarts the backoff: a failure right after it waits the first step, not the grown one', async () => {
  const warned: number[] = [];
  const log = { debug() {}, info() {}, error() {}, warn: (f: object) => void warned.push((f as { retryInMs: number }).retryInMs) };
  const down: typeof fetch = async () => {
    throw new Error('connect ECONNREFUSED');
  };
  const p = pusher({ fetch: down, flushMs: 60_000, nudgeJitterMs: 0, log, backoff: { baseMs: 1000, maxMs: 60_000, random: () => 0 } });
  p.push(ev());
  for (let i = 0; i < 3; i++) await p.flush(); // three failures in a row: the backoff has grown to 2 s
  assert.deepEqual(warned, [500], 'the first failure is logged with its retry time');
  p.nudge();
  await waitFor(async () => p.stats().failures === 4, 2_000, 'the nudged push');
  // a grown backoff kept after the nudge would leave a returning console unused for seconds
  assert.deepEqual(warned, [500, 500], 'the failure after the nudge is a first failure again');
  await p.stop();
});

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

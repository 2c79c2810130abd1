/**
 * Calls that waited out `redis.timeoutMs` change nothing when Redis gets to them later,
 * from the first request on: the sidecar asks Redis its time as soon as the connection is
 * ready, so deadlines are in Redis time before any limits call has had a reply. Through a
 * TCP proxy that holds every byte while "frozen" (a Redis that hung right after connecting).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';
import { startFreezeProxy, type FreezeProxy } from '../helpers/freeze-proxy.js';

const prefix = `kwcold${process.pid}`;
/** resolves once Redis has answered a TIME the sidecar sent */
let timeAnswered!: () => void;
const timeSeen = new Promise<void>((r) => (timeAnswered = r));
let proxy: FreezeProxy;
let up: FakeUpstream;
let h: Harness;

before(async () => {
  const askedTime = new WeakSet<object>();
  proxy = await startFreezeProxy({
    target: new URL(TEST_REDIS_URL),
    seen: (d, toClient, conn) => {
      if (!toClient && /\$4\r\ntime\r\n/i.test(d.toString('latin1'))) askedTime.add(conn);
      else if (toClient && askedTime.has(conn)) timeAnswered();
    },
  });
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, config: { redis: { url: proxy.url, prefix, timeoutMs: 200, onError: 'closed', lease: { enabled: false } } }, keys: { k: { rpm: 5 } } });
});
after(async () => {
  await h.close();
  await up.close();
  proxy.close();
  const r = new Redis(TEST_REDIS_URL);
  await deleteByPrefix(r, prefix);
  r.disconnect();
});

const chat = () => send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.k!), 'content-type': 'application/json' }, body: '{"model":"gpt-4o","max_tokens":1}' });

test('admissions answered 503 while Redis hung take nothing from the bucket once it answers', async () => {
  await timeSeen; // the connection is ready and its TIME answered; no limits call has been made
  proxy.frozen = true;
  // two: fewer than trip the breaker (failover.ts), which would answer the next calls without Redis
  const during = await Promise.all(Array.from({ length: 2 }, chat));
  assert.deepEqual(during.map((r) => r.headers['x-keyward-error']), Array(2).fill('limits_unavailable'));
  assert.equal(up.received.length, 0);
  proxy.thaw();
  // rpm 5: all five are still there, since the two late admissions reached Redis past their deadline
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push((await chat()).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
});

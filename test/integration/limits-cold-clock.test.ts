/**
 * Calls that waited out `redis.timeoutMs` change nothing when Redis gets to them later,
 * from the first request on: the sidecar asks Redis its time as soon as the connection is
 * ready, so deadlines are in Redis time before any limits call has had a reply. Through a
 * TCP proxy that holds every byte while "frozen" (a Redis that hung right after connecting).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { Redis } from 'ioredis';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';

const target = new URL(TEST_REDIS_URL);
const prefix = `kwcold${process.pid}`;
let frozen = false;
const held: (() => void)[] = [];
/** resolves once Redis has answered a TIME the sidecar sent */
let timeAnswered!: () => void;
const timeSeen = new Promise<void>((r) => (timeAnswered = r));
let proxy: net.Server;
let up: FakeUpstream;
let h: Harness;

before(async () => {
  proxy = net.createServer((client) => {
    const server = net.connect(Number(target.port || 6379), target.hostname);
    let askedTime = false;
    const pipe = (from: net.Socket, to: net.Socket, toClient: boolean) =>
      from.on('data', (d: Buffer) => {
        if (!toClient && /\$4\r\ntime\r\n/i.test(d.toString('latin1'))) askedTime = true;
        else if (toClient && askedTime) timeAnswered();
        if (frozen) held.push(() => to.write(d));
        else to.write(d);
      });
    pipe(client, server, false);
    pipe(server, client, true);
    for (const s of [client, server]) s.on('error', () => (client.destroy(), server.destroy()));
  });
  proxy.listen(0, '127.0.0.1');
  await once(proxy, 'listening');
  up = await startFakeUpstream();
  const url = `redis://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
  h = await startHarness({ upstream: up.url, config: { redis: { url, prefix, timeoutMs: 200, onError: 'closed', lease: { enabled: false } } }, keys: { k: { rpm: 5 } } });
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
  frozen = true;
  // two: fewer than trip the breaker (failover.ts), which would answer the next calls without Redis
  const during = await Promise.all(Array.from({ length: 2 }, chat));
  assert.deepEqual(during.map((r) => r.headers['x-keyward-error']), Array(2).fill('limits_unavailable'));
  assert.equal(up.received.length, 0);
  frozen = false;
  for (const write of held.splice(0)) write();
  // rpm 5: all five are still there, since the two late admissions reached Redis past their deadline
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push((await chat()).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
});

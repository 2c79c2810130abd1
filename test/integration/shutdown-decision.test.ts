/**
 * DESIGN section 9: SIGTERM lets requests finish within the grace and releases their
 * slots. A request whose decision still waits on Redis when the grace ends is cut like the
 * rest; its decision lands after, and what it took (a spend hold, concurrency slots) is
 * given back before the limiter closes, not left in Redis until its lease expires.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness } from '../helpers/sidecar.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwsd${randomBytes(4).toString('hex')}`;
let up: FakeUpstream;
let redis: Redis;

/** A TCP relay to the test Redis that can hold what the sidecar sends until released. */
async function startGate() {
  const target = new URL(TEST_REDIS_URL);
  let held: (() => void)[] | null = null;
  let onHeld: (() => void) | null = null;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const redisSide = net.connect(Number(target.port || 6379), target.hostname);
    for (const s of [client, redisSide]) {
      sockets.add(s);
      s.on('error', () => undefined);
      s.on('close', () => (client.destroy(), redisSide.destroy()));
    }
    client.on('data', (d: Buffer) => {
      // Only the scripts a decision runs are held: connection set-up and the rest go through.
      if (!held || !/evalsha|eval/i.test(d.toString('latin1'))) return void redisSide.write(d);
      held.push(() => redisSide.write(d));
      onHeld?.();
    });
    redisSide.pipe(client);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    /** Holds what the sidecar sends from now on; resolves once something is held. */
    hold: () => {
      held = [];
      return new Promise<void>((resolve) => (onHeld = resolve));
    },
    release: () => {
      const queued = held ?? [];
      held = null;
      queued.forEach((send) => send());
    },
    close: () => {
      sockets.forEach((s) => s.destroy());
      server.close();
    },
  };
}

before(async () => {
  up = await startFakeUpstream();
  redis = new Redis(TEST_REDIS_URL);
});
after(async () => {
  await up.close();
  const keys = await redis.keys(`{${prefix}*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
});

test('a decision still waiting on Redis when the grace ends gives back its hold and slots before the limiter closes', async () => {
  const gate = await startGate();
  const h = await startHarness({
    upstream: up.url,
    keys: { k_fresh: { concurrency: 5 } },
    records: [{ type: 'price', model: 'gpt-4o*', input: 1, output: 1, per: 1000 }],
    config: { redis: { url: gate.url, prefix, timeoutMs: 3000 }, upstreams: { default: { url: up.url, capacity: { concurrency: 50 } } } },
  });
  try {
    const waiting = gate.hold();
    const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
    const client = net.connect(h.sidecar.port, '127.0.0.1');
    client.on('error', () => undefined);
    client.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_fresh}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    await waiting; // the decision waits on Redis
    // The grace ends with the decision still waiting: the cut is announced, then Redis answers.
    const cut = new Promise<void>((resolve) => h.logEvents.on('line', (l: string) => l.includes('shutdown grace over') && resolve()));
    const closing = h.sidecar.close({ graceMs: 100 });
    await cut;
    gate.release();
    await closing;
    const keys = await redis.keys(`{${prefix}*`);
    const left: string[] = [];
    // the record of applied settlement calls (settle-batch.ts) holds no slot
    for (const key of keys.filter((k) => !k.includes(':settled}'))) {
      const type = await redis.type(key);
      if (type === 'zset' && (await redis.zcard(key)) > 0) left.push(`${key}: ${await redis.zcard(key)} entries`);
      if (type === 'hash' && Object.keys(await redis.hgetall(key)).some((f) => f.startsWith('a:'))) left.push(`${key}: a hold`);
    }
    assert.deepEqual(left, [], 'no hold or slot left in Redis');
    assert.equal(up.received.length, 0, 'nothing was forwarded');
  } finally {
    gate.close();
    await h.replica.close();
  }
});

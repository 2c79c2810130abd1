/**
 * Another instance's bucket slice never makes a request that fits refuse for long (DESIGN
 * section 6: N+1 requests at once admit exactly N, and instances sharing one Redis enforce
 * one limit). Instance A, busy on a key far from its RPM limit, is leased a slice of the
 * bucket; the traffic then moves to instance B, which spends the bucket down: when B is
 * refused only for what A's slice holds, Redis tells A to give it back and B asks again.
 * On one Redis, through real limiters.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type { AdmitResult } from '../../src/limits/limiter.js';
import { LEDGER_NEWS_CHANNEL } from '../../src/limits/redis/ledger-news.js';
import { leasingInstances } from '../helpers/redis-harness.js';
import { input, uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = uid('kwtest');
const fleet = leasingInstances(TEST_REDIS_URL, prefix);
after(() => fleet.close());

const RPM = 64;
const limits = { rpm: RPM };
const admitted = (rs: AdmitResult[]): number => rs.filter((r) => r.ok).length;
const finish = (rs: AdmitResult[]): void => {
  for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
};

/**
 * Listens on the news channel. `heard()` resolves with every message published up to the
 * call: it publishes a marker and waits for it, which Redis delivers after them.
 */
async function listen(client: Awaited<ReturnType<typeof fleet.instance>>['client']): Promise<{ heard(): Promise<string[]> }> {
  const messages: string[] = [];
  const waiting = new Map<string, () => void>();
  const listener = client.duplicate({ enableOfflineQueue: true });
  fleet.track(listener);
  listener.on('message', (_channel: string, message: string) => {
    const done = waiting.get(message);
    if (done) done();
    else messages.push(message);
  });
  await listener.subscribe(LEDGER_NEWS_CHANNEL);
  return {
    async heard() {
      const marker = uid('marker');
      const arrived = new Promise<void>((resolve) => waiting.set(marker, resolve));
      await client.publish(LEDGER_NEWS_CHANNEL, marker);
      await arrived;
      return [...messages];
    },
  };
}

/** Admits on `lim` one request at a time until it holds a slice of the key; returns how many it admitted. */
async function untilSliced(lim: Awaited<ReturnType<typeof fleet.instance>>['lim'], key: string): Promise<number> {
  for (let n = 1; n <= RPM / 2; n++) {
    const r = await lim.admit(input(key, { limits }));
    assert.ok(r.ok, `request ${n} admitted far from the limit`);
    r.lease.finish({ tokens: null });
    if (lim.slicesHeld() > 0) return n;
  }
  return assert.fail('no slice was leased far from the limit');
}

test("a burst on B takes the whole bucket although A holds an unused slice of it: A gives it back", async () => {
  const a = await fleet.instance({ sliceMs: 10_000 });
  const b = await fleet.instance({ sliceMs: 10_000 });
  const key = uid('k');
  const started = performance.now();
  // A's newest slice is unused: it was leased by the call that admitted A's last request.
  const onA = await untilSliced(a.lim, key);
  const news = await listen(a.client);

  const burst = await Promise.all(Array.from({ length: RPM + 1 }, () => b.lim.admit(input(key, { limits }))));
  const elapsed = performance.now() - started;
  // The bucket refills one token every 60000 / RPM ms: what the test's own time adds.
  const refilled = Math.ceil((elapsed * RPM) / 60_000);
  const total = onA + admitted(burst);
  assert.ok(total >= RPM && total <= RPM + refilled, `${onA} on A and ${admitted(burst)} of ${RPM + 1} on B: ${total} in all (limit ${RPM}, ${refilled} refilled)`);
  assert.equal(a.lim.slicesHeld(), 0, 'A gave its slice back before it was over');
  const heard = await news.heard();
  assert.ok(heard.some((m) => m.includes(key) && m.endsWith(':rpm')), `the bucket was named on the news channel: ${JSON.stringify(heard)}`);
  const refused = burst.filter((r) => !r.ok);
  assert.ok(refused.length >= 1 && refused.every((r) => !r.ok && r.code === 'rpm_exceeded'));
  finish(burst);
});

test('a refusal with no slice out names nothing on the news channel', async () => {
  const b = await fleet.instance({ sliceMs: 10_000 });
  const key = uid('k');
  const news = await listen(b.client);
  // A limit under 16 is never sliced: every request is one exact call.
  const small = { rpm: 4 };
  const burst = await Promise.all(Array.from({ length: 5 }, () => b.lim.admit(input(key, { limits: small }))));
  assert.equal(admitted(burst), 4);
  const again = await b.lim.admit(input(key, { limits: small }));
  assert.ok(!again.ok && again.code === 'rpm_exceeded');
  assert.deepEqual((await news.heard()).filter((m) => m.includes(key)), []);
  finish(burst);
});

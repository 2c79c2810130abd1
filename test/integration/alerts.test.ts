/**
 * Budget alerts (DESIGN section 13) end to end on the real Redis: two sidecars sharing one
 * limits store, a local webhook receiver, requests whose settled cost is known. Each
 * threshold is sent once per holder and epoch whichever instance sees it; a request that
 * crosses two sends both in order; a receiver that fails twice still gets the event once;
 * a new epoch arms the thresholds again; every body is signed with the secret.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { parseChangeBatch, type SyncRecord } from '../../src/protocol/records.js';
import { PRICE, alertsIdle, eventsOf, spend, usageByMaxTokens } from '../helpers/alerts.js';
import { keyRecord, startHarness, type Harness, type KeySpec } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwal${randomBytes(4).toString('hex')}`;
const SECRET = 'alert-signing-secret';
/** A short retry schedule: the operated one waits minutes. */
const TUNING = { checkDelayMs: 5, firstRetryMs: 20, maxRetryMs: 100, retryWindowMs: 10_000 };

const RECORDS: SyncRecord[] = [
  PRICE,
  { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 },
  { type: 'project', id: 'p_two', status: 'enabled', budget: 100, spent: 79.7, period: 'week' },
  { type: 'wallet', user: 'u_both', balance: 10 },
];
const KEYS: Record<string, KeySpec> = {
  k_two: { project: 'p_two', budget: 10, spent: 7.7 },
  k_retry: { project: 'p_free', budget: 10, spent: 7.9 },
  k_epoch: { project: 'p_free', budget: 10, spent: 7.9, period: 'month' },
  k_both: { project: 'p_free', budget: 10, spent: 7.5, period: 'month' },
  k_wallet: { user: 'u_both' },
};

let up: FakeUpstream;
let hook: WebhookReceiver;
let a: Harness;
let b: Harness;
let redis: Redis;

const start = () =>
  startHarness({
    upstream: up.url,
    config: { redis: { url: TEST_REDIS_URL, prefix, timeoutMs: 1000 }, alerts: { webhookUrl: hook.url, secret: SECRET } },
    keys: Object.fromEntries(Object.entries(KEYS).map(([id, spec]) => [id, { ...spec, secret: secrets[id] }])),
    records: RECORDS,
    alertTuning: TUNING,
  });
/** Both instances know each key by the same secret. */
const secrets: Record<string, string> = Object.fromEntries(Object.keys(KEYS).map((id) => [id, `sk-alerts-${id}-${randomBytes(8).toString('hex')}`]));

before(async () => {
  redis = new Redis(TEST_REDIS_URL);
  up = await startFakeUpstream(usageByMaxTokens);
  hook = await startWebhookReceiver();
  [a, b] = await Promise.all([start(), start()]);
});

after(async () => {
  await Promise.all([a?.close(), b?.close()]);
  await hook?.close();
  await up?.close();
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
});

const sent = (): number => a.sidecar.alerts.stats().sent + b.sidecar.alerts.stats().sent;

describe('budget alerts across two instances on one Redis', { timeout: 60_000 }, () => {
  test('two instances crossing a threshold together send one event per holder', async () => {
    const before = sent();
    // 7.7 + 2 x 0.3 on the key and 79.7 + 2 x 0.3 on the project: each instance sees both over 80 %.
    assert.deepEqual(await Promise.all([spend(a, 'k_two', 200), spend(b, 'k_two', 200)]), [200, 200]);
    await alertsIdle(a, b);
    // Both instances claim again after one more request each; nothing more is sent.
    assert.deepEqual(await Promise.all([spend(a, 'k_two', 10), spend(b, 'k_two', 10)]), [200, 200]);
    await alertsIdle(a, b);
    const all = hook.accepted();
    const key = eventsOf(all, 'key:k_two');
    const project = eventsOf(all, 'project:p_two');
    assert.deepEqual(key.map((e) => e.threshold), [0.8]);
    assert.deepEqual(project.map((e) => e.threshold), [0.8]);
    assert.deepEqual({ ...key[0], at: undefined, spent: undefined }, { type: 'budget.threshold', holder: { kind: 'key', id: 'k_two' }, threshold: 0.8, budget: 10, spent: undefined, period: null, epoch: 0, at: undefined });
    assert.ok((key[0]!.spent as number) >= 8 && (key[0]!.spent as number) <= 8.3, `spent ${key[0]!.spent}`);
    assert.equal(project[0]!.budget, 100);
    assert.equal(project[0]!.period, 'week');
    assert.ok(Math.abs(Date.parse(key[0]!.at as string) - Date.now()) < 60_000, 'at is the time it was found');
    assert.equal(sent() - before, 2);
  });

  test('a receiver that fails twice gets the event once, on the third attempt, the same bytes each time', async () => {
    hook.failNext(2);
    assert.equal(await spend(a, 'k_retry', 200), 200);
    await alertsIdle(a, b);
    const tries = hook.received.filter((d) => JSON.parse(d.body).holder.id === 'k_retry');
    assert.deepEqual(tries.map((d) => d.status), [500, 500, 204]);
    assert.equal(new Set(tries.map((d) => d.body)).size, 1);
    assert.equal(new Set(tries.map((d) => d.headers['x-keyward-signature'])).size, 1);
    assert.deepEqual(eventsOf(hook.accepted(), 'key:k_retry').map((e) => e.threshold), [0.8]);
    assert.equal(a.sidecar.alerts.stats().failed + b.sidecar.alerts.stats().failed, 0);
  });

  test('a new epoch arms the thresholds again', async () => {
    assert.equal(await spend(a, 'k_epoch', 200), 200);
    await alertsIdle(a, b);
    assert.deepEqual(eventsOf(hook.accepted(), 'key:k_epoch').map((e) => [e.threshold, e.epoch, e.budget]), [[0.8, 0, 10]]);
    // The console raises the budget: epoch 1, 15.9 of 20 spent. Both replicas take the change.
    const hash = makeKeyHasher({ hash: 'sha256' });
    const batch = parseChangeBatch({ version: 2, changes: [{ op: 'upsert', ...keyRecord('k_epoch', { ...KEYS.k_epoch, budget: 20, spent: 15.9, epoch: 1 }, hash(secrets.k_epoch!)) }] });
    assert.ok(batch.ok);
    for (const h of [a, b]) assert.ok(h.replica.applyChanges(batch.value, 'test'));
    assert.equal(await spend(b, 'k_epoch', 200), 200);
    assert.equal(await spend(a, 'k_epoch', 10), 200);
    await alertsIdle(a, b);
    assert.deepEqual(eventsOf(hook.accepted(), 'key:k_epoch').map((e) => [e.threshold, e.epoch, e.budget, e.period]), [
      [0.8, 0, 10, 'month'],
      [0.8, 1, 20, 'month'],
    ]);
  });

  test('a request crossing 0.8 and 0.95 at once sends both, in order (key budget and wallet)', async () => {
    // The hold alone takes the key from 7.5 to over 9.5 of 10, and the wallet's 10 to under 0.5.
    assert.deepEqual(await Promise.all([spend(b, 'k_both', 2100), spend(a, 'k_wallet', 9600)]), [200, 200]);
    await alertsIdle(a, b);
    const key = eventsOf(hook.accepted(), 'key:k_both');
    assert.deepEqual(key.map((e) => e.threshold), [0.8, 0.95]);
    assert.ok(key.every((e) => (e.spent as number) >= 9.5 && e.budget === 10 && e.period === 'month'));
    const wallet = eventsOf(hook.accepted(), 'wallet:u_both');
    assert.deepEqual(wallet.map((e) => [e.threshold, e.budget, e.period]), [[0.8, 10, null], [0.95, 10, null]]);
    assert.ok(wallet.every((e) => (e.spent as number) >= 9.5 && (e.spent as number) <= 9.7), JSON.stringify(wallet));
  });

  test('every delivery is signed: sha256=<hex HMAC of the body bytes> with alerts.secret', () => {
    assert.ok(hook.received.length >= 8);
    for (const d of hook.received) {
      assert.equal(d.headers['content-type'], 'application/json');
      assert.equal(d.headers['x-keyward-signature'], `sha256=${createHmac('sha256', SECRET).update(d.body).digest('hex')}`);
      assert.notEqual(d.headers['x-keyward-signature'], `sha256=${createHmac('sha256', 'another-secret').update(d.body).digest('hex')}`);
    }
  });
});

/**
 * Budget alerts (DESIGN section 13) without Redis, and with a dead webhook. Two sidecars in
 * one process share one in-process limiter: the once-only rule holds within the instance
 * through its claims, not only through what one sidecar remembers. A webhook that never
 * answers costs requests nothing (latency beside a sidecar without alerts), and its events
 * are counted as failed once the retry window has passed, each logged without the URL.
 * A shadowed budget (DESIGN section 12) alerts like an enforced one, also when its hold is
 * the one refused; a claim the limits store cannot answer while an event is delivered does
 * not lose the event.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { Limiter } from '../../src/limits/limiter.js';
import type { SyncRecord } from '../../src/protocol/records.js';
import { PRICE, alertsIdle, eventsOf, spend, usageByMaxTokens } from '../helpers/alerts.js';
import { keyRecord, startHarness, waitForLine, type Harness, type HarnessOptions, type KeySpec } from '../helpers/sidecar.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { parseChangeBatch } from '../../src/protocol/records.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

const RECORDS: SyncRecord[] = [PRICE, { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 }];
const budgetKey = (spent: number, budget = 10): KeySpec => ({ project: 'p_free', budget, spent });

let up: FakeUpstream;
let hook: WebhookReceiver;

before(async () => {
  up = await startFakeUpstream(usageByMaxTokens);
  hook = await startWebhookReceiver();
});
after(async () => {
  await hook?.close();
  await up?.close();
});

const start = (o: Partial<HarnessOptions> & Pick<HarnessOptions, 'keys'>): Promise<Harness> =>
  startHarness({ upstream: up.url, records: RECORDS, ...o, config: { ...o.config } });

describe('in process, no Redis', { timeout: 30_000 }, () => {
  test('two sidecars on one in-process limiter: one event per threshold; no signature header without a secret', async () => {
    const limiter = createMemoryLimiter({ leaseMs: 30_000 });
    const keys = { k_local: { ...budgetKey(7.7), secret: 'sk-alerts-local-0123456789' } };
    const config = { alerts: { webhookUrl: hook.url } };
    const [a, b] = await Promise.all([0, 1].map(() => start({ keys, config, limiter, alertTuning: { checkDelayMs: 5 } })));
    try {
      // Six requests at once, three on each, 0.2 apiece: 7.7 to 8.9 of 10, past 80 % and short of 95 %.
      const statuses = await Promise.all(Array.from({ length: 6 }, (_, i) => spend(i % 2 ? a! : b!, 'k_local', 100)));
      assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200]);
      await alertsIdle(a!, b!);
      assert.equal(await spend(a!, 'k_local', 10), 200);
      assert.equal(await spend(b!, 'k_local', 10), 200);
      await alertsIdle(a!, b!);
      const events = eventsOf(hook.accepted(), 'key:k_local');
      assert.deepEqual(events.map((e) => e.threshold), [0.8]);
      assert.equal(a!.sidecar.alerts.stats().sent + b!.sidecar.alerts.stats().sent, 1);
      const delivery = hook.received.find((d) => JSON.parse(d.body).holder.id === 'k_local')!;
      assert.equal(delivery.headers['x-keyward-signature'], undefined);
      assert.equal(delivery.headers['content-type'], 'application/json');
    } finally {
      await Promise.all([a?.close(), b?.close()]);
    }
  });
});

describe('spend the console bills later', { timeout: 30_000 }, () => {
  test('a replica change that brings a recent holder past a threshold sends it, with no request of the holder\'s', async () => {
    const secret = 'sk-alerts-billed-0123456789';
    const h = await start({ keys: { k_billed: { ...budgetKey(7.7), secret } }, config: { alerts: { webhookUrl: hook.url } }, alertTuning: { checkDelayMs: 5, recheckMs: 5 } });
    try {
      const mine = () => eventsOf(hook.accepted(), 'key:k_billed');
      assert.equal(await spend(h, 'k_billed', 200), 200);
      await alertsIdle(h);
      assert.deepEqual(mine().map((e) => e.threshold), [0.8]);
      // The console bills usage this sidecar never held (served elsewhere, or while Redis was down): spent 10 of 10.
      const hash = makeKeyHasher({ hash: 'sha256' })(secret);
      const batch = parseChangeBatch({ version: 2, changes: [{ op: 'upsert', ...keyRecord('k_billed', { ...budgetKey(10) }, hash) }] });
      assert.ok(batch.ok);
      assert.ok(h.replica.applyChanges(batch.value, 'test'));
      await hook.until(() => mine().length === 3, 'the 95 % and 100 % alerts');
      assert.deepEqual(mine().slice(1).map((e) => [e.threshold, e.spent]), [[0.95, 10], [1, 10]]);
    } finally {
      await h.close();
    }
  });
});

describe('an alerts block put in force at run time', { timeout: 30_000 }, () => {
  test('configure: on, new thresholds and a secret, off; each applies to the next check', async () => {
    const h = await start({ keys: { k_live: budgetKey(7.9) }, alertTuning: { checkDelayMs: 5 } });
    try {
      const mine = () => eventsOf(hook.accepted(), 'key:k_live');
      // Off: crossing 80 % sends nothing.
      assert.equal(await spend(h, 'k_live', 100), 200);
      await alertsIdle(h);
      assert.deepEqual(mine(), []);
      // On: the next check finds 8.1 of 10 past the threshold.
      h.sidecar.alerts.configure({ webhookUrl: hook.url, thresholds: [0.8] });
      assert.equal(await spend(h, 'k_live', 10), 200);
      await alertsIdle(h);
      assert.deepEqual(mine().map((e) => e.threshold), [0.8]);
      // A threshold added, and a secret: 0.9 is sent once reached, signed.
      h.sidecar.alerts.configure({ webhookUrl: hook.url, thresholds: [0.8, 0.9], secret: 'rotated-secret' });
      assert.equal(await spend(h, 'k_live', 800), 200);
      await alertsIdle(h);
      assert.deepEqual(mine().map((e) => e.threshold), [0.8, 0.9]);
      assert.match(String(hook.received.at(-1)!.headers['x-keyward-signature']), /^sha256=[0-9a-f]{64}$/);
      // Off again: 9.11 to 9.61 of 10 crosses 95 % unsent, though the last block named it.
      h.sidecar.alerts.configure({ webhookUrl: hook.url, thresholds: [0.8, 0.9, 0.95] });
      h.sidecar.alerts.configure(undefined);
      assert.equal(await spend(h, 'k_live', 400), 200);
      await alertsIdle(h);
      assert.deepEqual(mine().map((e) => e.threshold), [0.8, 0.9]);
    } finally {
      await h.close();
    }
  });
});

/** The admin port's /metrics as series -> value. */
async function scrapeMetrics(port: number): Promise<Map<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const lines = text.split('\n').filter((l) => l && !l.startsWith('#'));
  return new Map(lines.map((l) => [l.slice(0, l.lastIndexOf(' ')), Number(l.slice(l.lastIndexOf(' ') + 1))]));
}

const median = (xs: number[]): number => [...xs].sort((p, q) => p - q)[Math.floor(xs.length / 2)]!;

async function timed(h: Harness, key: string, maxTokens: number): Promise<number> {
  const t0 = performance.now();
  assert.equal(await spend(h, key, maxTokens), 200);
  return performance.now() - t0;
}

describe('a dead webhook', { timeout: 60_000 }, () => {
  // A webhook that takes every POST and never answers. An attempt gives up after a second:
  // a request that waited for one would take that long, while a request that does not, on
  // a busy 2-core machine, takes well under it.
  const ATTEMPT_MS = 1_000;
  const WINDOW_MS = 5_000;
  const CROSSING = ['k_d0', 'k_d1', 'k_d2', 'k_d3'];
  const keys: Record<string, KeySpec> = { k_busy: budgetKey(0, 1_000_000), ...Object.fromEntries(CROSSING.map((k) => [k, budgetKey(7.5)])) };
  let dead: Harness;
  let plain: Harness;

  before(async () => {
    hook.hang(true);
    [dead, plain] = await Promise.all([
      start({ keys, config: { alerts: { webhookUrl: hook.url } }, alertTuning: { checkDelayMs: 5, attemptTimeoutMs: ATTEMPT_MS, firstRetryMs: 100, maxRetryMs: 400, retryWindowMs: WINDOW_MS } }),
      start({ keys }),
    ]);
  });
  after(async () => {
    hook.hang(false);
    await Promise.all([dead?.close(), plain?.close()]);
  });

  test('never slows a request, and its events count as failed once the retry window has passed', async (t) => {
    // What a sidecar does on its first request only is not what is measured.
    await Promise.all([timed(dead, 'k_busy', 10), timed(plain, 'k_busy', 10)]);
    const found = performance.now();
    const before = hook.received.length;
    // Each takes its key from 7.5 past 9.5 (its hold) and to 10 (settled): 0.8, 0.95 and 1, twelve events.
    const crossing = await Promise.all(CROSSING.map((k) => timed(dead, k, 2_400)));
    assert.ok(Math.max(...crossing) < ATTEMPT_MS, `crossing requests took ${crossing.map((ms) => ms.toFixed(1)).join(', ')} ms`);
    // While those deliveries hang: the same requests, interleaved, beside a sidecar without alerts.
    const withAlerts: number[] = [];
    const without: number[] = [];
    for (let i = 0; i < 30; i++) {
      withAlerts.push(await timed(dead, 'k_busy', 10));
      without.push(await timed(plain, 'k_busy', 10));
    }
    const [m1, m0] = [median(withAlerts), median(without)];
    t.diagnostic(`median ms: ${m1.toFixed(2)} with a dead webhook, ${m0.toFixed(2)} without alerts; crossing requests ${crossing.map((ms) => ms.toFixed(1)).join(', ')}`);
    assert.ok(m1 <= m0 * 1.5 + 3, `median with a dead webhook ${m1.toFixed(2)} ms, without alerts ${m0.toFixed(2)} ms`);
    assert.ok(Math.max(...withAlerts) < ATTEMPT_MS, `slowest request ${Math.max(...withAlerts).toFixed(1)} ms`);

    // Retried, and not given up inside the window.
    await hook.until(() => hook.received.length - before > 12, 'a retry');
    if (performance.now() - found < WINDOW_MS) assert.equal(dead.sidecar.alerts.stats().failed, 0);
    await alertsIdle(dead);
    assert.ok(performance.now() - found >= WINDOW_MS, 'given up only after the window');
    assert.deepEqual(dead.sidecar.alerts.stats(), { sent: 0, failed: 12 });
    const metrics = await scrapeMetrics(dead.sidecar.adminPort);
    assert.equal(metrics.get('keyward_alerts_total{result="failed"}'), 12);
    assert.equal(metrics.get('keyward_alerts_total{result="sent"}'), 0);

    const failures = dead.logs.filter((l) => l.includes('budget alert not delivered')).map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.equal(failures.length, 12);
    for (const f of failures) {
      assert.equal(f.level, 'warn');
      assert.equal(f.reason, 'no answer in time');
      assert.ok(CROSSING.includes((f.holder as { id: string }).id));
    }
    // A holder's events go in order, each with a retry window of its own from its first
    // attempt; the first was tried at least three times within its window.
    for (const k of CROSSING) {
      const mine = failures.filter((f) => (f.holder as { id: string }).id === k);
      assert.deepEqual(mine.map((f) => f.threshold), [0.8, 0.95, 1]);
      assert.ok((mine[0]!.attempts as number) >= 3, `attempts ${mine[0]!.attempts}`);
    }
    // Never the webhook's URL (it may carry a token), never a key.
    const text = dead.logs.join('\n');
    assert.doesNotMatch(text, /hooks\/keyward|127\.0\.0\.1:\d+\/hooks/);
    for (const secret of Object.values(dead.keys)) assert.ok(!text.includes(secret));
  });
});

describe('a shadowed budget alerts like an enforced one', { timeout: 30_000 }, () => {
  test('a request its shadowed key budget would refuse is forwarded, and the key\'s 80 % is sent', async () => {
    // 8.5 of 10 spent (billed by the console), never touched on this instance: the request's
    // hold (about 2.2) does not fit, so the shadowed key budget is left out of the hold.
    const h = await startHarness({
      upstream: up.url,
      records: RECORDS,
      keys: { k_shadowed: { project: 'p_free', budget: 10, spent: 8.5, shadow: ['budget'] } },
      config: { alerts: { webhookUrl: hook.url } },
      alertTuning: { checkDelayMs: 5 },
    });
    try {
      assert.equal(await spend(h, 'k_shadowed', 2100), 200);
      const line = await waitForLine(h, (l) => Array.isArray(l.shadow));
      assert.deepEqual(line.shadow, ['key_budget_exhausted']);
      await alertsIdle(h);
      const events = eventsOf(hook.accepted(), 'key:k_shadowed');
      assert.deepEqual(events.map((e) => [e.threshold, e.budget, e.spent]), [[0.8, 10, 8.5]]);
    } finally {
      await h.close();
    }
  });
});

describe('a limits store that cannot answer while an event is delivered', { timeout: 30_000 }, () => {
  test('the claim\'s renewal fails: the event is still sent, once', async () => {
    const inner = createMemoryLimiter({ leaseMs: 30_000 });
    // The claim itself is granted; from then on the store does not answer who holds it.
    const limiter = new Proxy(inner, {
      get(target, name) {
        if (name === 'claimedBy') return () => Promise.reject(new Error('limits store unavailable'));
        const value: unknown = Reflect.get(target, name, target);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    }) as Limiter;
    const h = await startHarness({
      upstream: up.url,
      records: RECORDS,
      keys: { k_renew: { project: 'p_free', budget: 10, spent: 7.9 } },
      config: { alerts: { webhookUrl: hook.url } },
      limiter,
      alertTuning: { checkDelayMs: 5 },
    });
    try {
      assert.equal(await spend(h, 'k_renew', 200), 200);
      await alertsIdle(h);
      assert.deepEqual(eventsOf(hook.accepted(), 'key:k_renew').map((e) => e.threshold), [0.8]);
      assert.deepEqual(h.sidecar.alerts.stats(), { sent: 1, failed: 0 });
    } finally {
      await h.close();
    }
  });
});

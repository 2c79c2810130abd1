/**
 * Budget alerts (DESIGN section 13): a shadowed budget
 * (DESIGN section 12) alerts like an enforced one, also when its hold is the one refused
 * (the request is forwarded without it); and a claim the limits store cannot answer while
 * an event is being delivered does not lose the event.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { PRICE, alertsIdle, eventsOf, spend, usageByMaxTokens } from '../helpers/alerts.js';
import { startHarness, waitForLine } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { Limiter } from '../../src/limits/limiter.js';
import type { SyncRecord } from '../../src/protocol/records.js';

const RECORDS: SyncRecord[] = [PRICE, { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 }];

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

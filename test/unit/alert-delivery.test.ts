/**
 * Budget alert delivery (DESIGN section 13) where operators rely on it beyond the happy path:
 * only a 2xx counts as delivered (a redirect is neither followed nor taken for a delivery),
 * retries back off, doubling from the first wait up to the longest one, a few at once; and
 * a crossing claimed just as alerts are turned off is counted as not delivered, not sent.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import { test } from 'node:test';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { ClaimInput } from '../../src/limits/limiter.js';
import { quiet } from '../../src/log.js';
import { Alerts } from '../../src/obs/alerts/alerts.js';
import { Delivery } from '../../src/obs/alerts/delivery.js';
import type { Holder } from '../../src/policy/holders.js';
import { startWebhookReceiver } from '../helpers/webhook-receiver.js';

const event = (url: string) => ({ url, lane: 'key:k_1', body: '{"n":1}', headers: { 'content-type': 'application/json' }, about: { n: 1 } });

test('delivery: a webhook answering a redirect has not taken the event: it is not followed, retried, then counted as failed', async () => {
  const elsewhere = await startWebhookReceiver();
  const redirecting = await startWebhookReceiver({ status: 307, location: elsewhere.url });
  try {
    const d = new Delivery(quiet, { firstRetryMs: 10, maxRetryMs: 20, retryWindowMs: 100 });
    d.add(event(redirecting.url));
    await d.idle();
    assert.deepEqual(d.stats(), { sent: 0, failed: 1, queued: 0 });
    assert.ok(redirecting.received.length >= 2, `retried: ${redirecting.received.length} attempts`);
    // The body (and its signature) goes to the configured URL alone.
    assert.equal(elsewhere.received.length, 0);
  } finally {
    await Promise.all([redirecting.close(), elsewhere.close()]);
  }
});

test('delivery: the wait between attempts doubles from firstRetryMs', async () => {
  const failing = await startWebhookReceiver({ status: 500 });
  try {
    const d = new Delivery(quiet, { firstRetryMs: 20, maxRetryMs: 1_000, retryWindowMs: 250 });
    d.add(event(failing.url));
    await d.idle();
    const a = failing.received.map((r) => r.at);
    // Waits of 20, 40, 80, 160 ms: attempts at about 0, 20, 60, 140, 300 (past the window: given up).
    assert.ok(a.length >= 4 && a.length <= 6, `attempts at ${a.map((t) => (t - a[0]!).toFixed(0)).join(', ')} ms`);
    // A timer never fires early (1 ms for rounding): each gap is at least its wait.
    for (let i = 1; i < a.length; i++) assert.ok(a[i]! - a[i - 1]! >= 20 * 2 ** (i - 1) - 1, `gap ${i}: ${(a[i]! - a[i - 1]!).toFixed(1)} ms`);
    assert.deepEqual(d.stats(), { sent: 0, failed: 1, queued: 0 });
  } finally {
    await failing.close();
  }
});

test('delivery: the wait stops growing at maxRetryMs, so a long window keeps attempting', async () => {
  const failing = await startWebhookReceiver({ status: 500 });
  try {
    const d = new Delivery(quiet, { firstRetryMs: 10, maxRetryMs: 40, retryWindowMs: 1_200 });
    d.add(event(failing.url));
    await d.idle();
    // Capped at 40 ms: about 30 attempts in 1.2 s. Doubling without the cap: 9 (0, 10, 30, 70, 150, 310, 630, 1270).
    assert.ok(failing.received.length >= 15, `${failing.received.length} attempts`);
  } finally {
    await failing.close();
  }
});

test('delivery: at most `concurrency` attempts are in flight at once, whatever the holders', async () => {
  let inFlight = 0;
  let most = 0;
  // Each POST is answered 30 ms after it arrives: long enough for every attempt started together to arrive meanwhile.
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      most = Math.max(most, ++inFlight);
      setTimeout(() => {
        inFlight--;
        res.writeHead(204).end();
      }, 30);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  try {
    const d = new Delivery(quiet, { concurrency: 2 });
    for (const lane of ['key:a', 'key:b', 'key:c', 'key:d', 'key:e']) d.add({ ...event(`http://127.0.0.1:${port}/hook`), lane });
    await d.idle();
    assert.deepEqual(d.stats(), { sent: 5, failed: 0, queued: 0 });
    assert.equal(most, 2);
  } finally {
    server.closeAllConnections();
    server.close();
    await once(server, 'close');
  }
});

test('alerts turned off between a crossing\'s claim and its sending: not sent, logged and counted as failed', { timeout: 10_000 }, async () => {
  const hook = await startWebhookReceiver();
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const warn: { obj: Record<string, unknown>; msg?: string }[] = [];
  const log = { ...quiet, warn: (obj: object, msg?: string) => void warn.push({ obj: obj as Record<string, unknown>, ...(msg !== undefined ? { msg } : {}) }) };
  const store = {
    ledger: (input: { tag: string; holders: Holder[] }) => limiter.ledger(input),
    // A reload that removes the alerts block lands while the claim is being granted.
    claimOnce: async (input: ClaimInput) => {
      const answer = await limiter.claimOnce(input);
      alerts.configure(undefined);
      return answer;
    },
    claimedBy: (input: ClaimInput) => limiter.claimedBy(input),
  };
  const alerts = new Alerts({ store, log, tuning: { checkDelayMs: 1 } });
  try {
    alerts.configure({ webhookUrl: hook.url, thresholds: [0.8, 0.95, 1] });
    const holder: Holder = { id: 'key:k_off', kind: 'budget', base: 9, limit: 10, epoch: 0, code: 'key_budget_exhausted', period: null };
    alerts.touched({ tag: 't_off', holders: [holder] });
    await alerts.idle();
    assert.deepEqual(alerts.stats(), { sent: 0, failed: 1 });
    assert.equal(hook.received.length, 0);
    assert.deepEqual(warn, [{ obj: { holder: { kind: 'key', id: 'k_off' }, threshold: 0.8, epoch: 0, reason: 'alerts turned off' }, msg: 'budget alert not delivered' }]);
  } finally {
    // The receiver first: nothing left open keeps the run alive should the watch have failed.
    await hook.close();
    await limiter.close();
    await alerts.close();
  }
});

/**
 * Budget alerts' parts on their own: the arithmetic of thresholds reached, the event body
 * and its signature (event.ts); delivery's order, bound and last attempt against a real
 * HTTP receiver (delivery.ts); and the watch's claims when the store cannot answer, on a
 * real in-process limiter (watch.ts).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { ClaimInput } from '../../src/limits/limiter.js';
import { quiet } from '../../src/log.js';
import { Delivery, DELIVERY_DEFAULTS, type DeliveryTuning, type Outgoing } from '../../src/obs/alerts/delivery.js';
import { eventBody, holderRef, signature, standing } from '../../src/obs/alerts/event.js';
import { AlertWatch } from '../../src/obs/alerts/watch.js';
import type { Crossing } from '../../src/obs/alerts/event.js';
import type { Holder } from '../../src/policy/holders.js';
import { startWebhookReceiver } from '../helpers/webhook-receiver.js';

const T = [0.8, 0.95, 1];
const budget = { kind: 'budget', limit: 10 } as const;
const wallet = { kind: 'wallet', limit: null } as const;

test('standing: a budget reaches a threshold at exactly that share of it, holds included', () => {
  assert.deepEqual(standing(budget, { live: 7.999999999, start: 0 }, T), { budget: 10, spent: 7.999999999, reached: [] });
  assert.deepEqual(standing(budget, { live: 8, start: 0 }, T), { budget: 10, spent: 8, reached: [0.8] });
  assert.deepEqual(standing(budget, { live: 9.5, start: 0 }, T)?.reached, [0.8, 0.95]);
  assert.deepEqual(standing(budget, { live: 12, start: 0 }, T)?.reached, [0.8, 0.95, 1]);
  // 0.1 + 0.7 in floating point is 0.7999999999999999: money is compared in nano-units.
  assert.deepEqual(standing({ kind: 'budget', limit: 1 }, { live: 0.1 + 0.7, start: 0 }, T)?.reached, [0.8]);
});

test('standing: a wallet counts down from its balance at its epoch', () => {
  assert.deepEqual(standing(wallet, { live: 1.5, start: 10 }, T), { budget: 10, spent: 8.5, reached: [0.8] });
  assert.deepEqual(standing(wallet, { live: 0, start: 10 }, T)?.reached, [0.8, 0.95, 1]);
  assert.deepEqual(standing(wallet, { live: -0.5, start: 10 }, T), { budget: 10, spent: 10.5, reached: [0.8, 0.95, 1] });
});

test('standing: nothing to be a fraction of, nothing reached', () => {
  assert.equal(standing({ kind: 'budget', limit: 0 }, { live: 5, start: 0 }, T), null);
  assert.equal(standing({ kind: 'budget', limit: null }, { live: 5, start: 0 }, T), null);
  assert.equal(standing(wallet, { live: 0, start: 0 }, T), null);
  assert.equal(standing(wallet, { live: -1, start: -1 }, T), null);
});

test('the event body: the fields of DESIGN section 13 in order; the holder split from its ledger id', () => {
  const c: Crossing = { holder: 'project:p:1', threshold: 0.95, budget: 100, spent: 95.5, period: 'month', epoch: 3, at: Date.UTC(2026, 4, 6, 7, 8, 9, 10) };
  assert.equal(
    eventBody(c),
    '{"type":"budget.threshold","holder":{"kind":"project","id":"p:1"},"threshold":0.95,"budget":100,"spent":95.5,"period":"month","epoch":3,"at":"2026-05-06T07:08:09.010Z"}',
  );
  assert.deepEqual(holderRef('wallet:u_1'), { kind: 'wallet', id: 'u_1' });
});

test('the signature is sha256=<hex HMAC-SHA256> of the body (RFC 4231-style vector)', () => {
  assert.equal(signature('The quick brown fox jumps over the lazy dog', 'key'), 'sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8');
});

const out = (url: string, lane: string, n: number): Outgoing => ({ url, lane, body: JSON.stringify({ n }), headers: { 'content-type': 'application/json' }, about: { n } });

function recordingLog(): { warn: { obj: object; msg?: string }[]; log: typeof quiet } {
  const warn: { obj: object; msg?: string }[] = [];
  return { warn, log: { ...quiet, warn: (obj, msg) => void warn.push({ obj, ...(msg !== undefined ? { msg } : {}) }) } };
}

type Hook = Awaited<ReturnType<typeof startWebhookReceiver>>;

/** Two events of one holder through a webhook that fails its first `failures` answers, until both are sent or given up. */
async function deliverTwo(tuning: DeliveryTuning, failures: number, check: (hook: Hook, d: Delivery) => void): Promise<void> {
  const hook = await startWebhookReceiver();
  try {
    const d = new Delivery(quiet, tuning);
    hook.failNext(failures);
    d.add(out(hook.url, 'key:k_1', 1));
    d.add(out(hook.url, 'key:k_1', 2));
    await d.idle();
    check(hook, d);
  } finally {
    await hook.close();
  }
}

test('delivery: a holder\'s events go in order, the next waiting while the one before is retried', () =>
  deliverTwo({ firstRetryMs: 10, maxRetryMs: 20, retryWindowMs: 5_000 }, 2, (hook, d) => {
    assert.deepEqual(hook.received.map((r) => [JSON.parse(r.body).n, r.status]), [[1, 500], [1, 500], [1, 204], [2, 204]]);
    assert.deepEqual(d.stats(), { sent: 2, failed: 0, queued: 0 });
  }));

test('delivery: an event waiting behind its holder\'s earlier one gets a retry window of its own', () =>
  deliverTwo({ firstRetryMs: 10, maxRetryMs: 20, retryWindowMs: 150 }, 1_000, (hook, d) => {
    const attempts = (n: number) => hook.received.filter((r) => JSON.parse(r.body).n === n).length;
    assert.ok(attempts(1) >= 4, `the first event: ${attempts(1)} attempts`);
    assert.ok(attempts(2) >= 4, `the second event: ${attempts(2)} attempts, not one last try after the first gave up`);
    assert.deepEqual(d.stats(), { sent: 0, failed: 2, queued: 0 });
  }));

test('delivery: the queue is bounded, an event past it is dropped, logged and counted as failed; close gives the rest a last attempt', async () => {
  const hook = await startWebhookReceiver();
  try {
    const { warn, log } = recordingLog();
    const d = new Delivery(log, { firstRetryMs: 60_000, maxRetryMs: 60_000, retryWindowMs: 600_000, maxQueued: 2 });
    hook.failNext(2);
    d.add(out(hook.url, 'key:a', 1));
    d.add(out(hook.url, 'key:b', 2));
    d.add(out(hook.url, 'key:c', 3));
    assert.deepEqual(d.stats(), { sent: 0, failed: 1, queued: 2 });
    assert.deepEqual(warn[0], { obj: { n: 3, reason: 'alert queue full' }, msg: 'budget alert not delivered' });
    await hook.until(() => hook.received.length === 2, 'the first attempts');
    // Both wait a minute for their retry; closing tries them once more at once.
    hook.failNext(1);
    await d.close(5_000);
    assert.equal(hook.received.length, 4);
    assert.deepEqual(d.stats(), { sent: 1, failed: 2, queued: 0 });
    assert.equal(warn.length, 2);
    assert.deepEqual(warn[1]!.obj, { n: (warn[1]!.obj as { n: number }).n, attempts: 2, reason: 'HTTP 500' });
  } finally {
    await hook.close();
  }
});

test('delivery: close waits at most its timeout for a webhook that never answers, then gives the event up', async () => {
  const hook = await startWebhookReceiver();
  try {
    hook.hang(true);
    const { warn, log } = recordingLog();
    const d = new Delivery(log, { attemptTimeoutMs: 60_000 });
    d.add(out(hook.url, 'wallet:u_1', 1));
    await hook.until(() => hook.received.length === 1, 'the attempt');
    const t0 = performance.now();
    await d.close(100);
    assert.ok(performance.now() - t0 < 2_000, `close took ${(performance.now() - t0).toFixed(0)} ms`);
    assert.deepEqual(d.stats(), { sent: 0, failed: 1, queued: 0 });
    assert.deepEqual(warn.map((w) => w.obj), [{ n: 1, attempts: 1, reason: 'shutting down' }]);
  } finally {
    await hook.close();
  }
});

test('watch: a claim the store cannot answer is asked again later with the same token, thresholds in order', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const asked: ClaimInput[] = [];
  let down = true;
  const store = {
    ledger: (input: { tag: string; holders: Holder[] }) => limiter.ledger(input),
    claimOnce: async (input: ClaimInput) => {
      asked.push(input);
      return down ? ('unavailable' as const) : limiter.claimOnce(input);
    },
    claimedBy: (input: ClaimInput) => limiter.claimedBy(input),
  };
  const found: Crossing[] = [];
  let retried!: () => void;
  const retriedOnce = new Promise<void>((r) => (retried = r));
  const watch = new AlertWatch({ store, thresholds: () => T, found: (c) => found.push(c), log: quiet, checkDelayMs: 1, claimRetryMs: 20, now: () => 0, pendingMs: 60_000 });
  const holder: Holder = { id: 'key:k_1', kind: 'budget', base: 9.6, limit: 10, epoch: 2, code: 'key_budget_exhausted', period: 'day' };
  watch.touched('p:p_1', [holder]);
  await watch.idle();
  // The first threshold could not be claimed: the second is not asked before it.
  assert.deepEqual(asked.map((a) => a.name), ['alert:0.8']);
  assert.equal(found.length, 0);
  down = false;
  const origin = store.claimOnce;
  store.claimOnce = (input) => origin(input).finally(() => asked.length === 3 && retried());
  // The retry timer is unref'd (it never holds a process up): keep this test's loop alive meanwhile.
  const alive = setInterval(() => undefined, 1_000);
  await retriedOnce;
  clearInterval(alive);
  await watch.idle();
  assert.deepEqual(asked.map((a) => a.name), ['alert:0.8', 'alert:0.8', 'alert:0.95']);
  assert.equal(asked[1]!.token, asked[0]!.token, 'the retry carries the first token');
  assert.deepEqual(found.map((c) => [c.holder, c.threshold, c.budget, c.spent, c.period, c.epoch]), [
    ['key:k_1', 0.8, 10, 9.6, 'day', 2],
    ['key:k_1', 0.95, 10, 9.6, 'day', 2],
  ]);
  // Settled: touching the holder again asks nothing.
  watch.touched('p:p_1', [holder]);
  await watch.idle();
  assert.equal(asked.length, 3);
  await watch.close();
  await limiter.close();
});

test('by default an alert is retried for at least 10 minutes (DESIGN section 13), with backoff that reaches past one attempt a minute', () => {
  assert.ok(DELIVERY_DEFAULTS.retryWindowMs >= 10 * 60_000);
  assert.ok(DELIVERY_DEFAULTS.firstRetryMs < DELIVERY_DEFAULTS.maxRetryMs && DELIVERY_DEFAULTS.maxRetryMs <= DELIVERY_DEFAULTS.retryWindowMs / 10, 'many attempts in the window');
});

/**
 * Budget alerts (DESIGN section 13: exactly once across instances, retried for at least ten
 * minutes) when the instance that claimed a crossing goes away before delivering it. The
 * claim stays pending while its event is delivered: an instance that shuts down releases
 * it, one that stops answering lets it lapse, and the next instance that checks the holder
 * takes it over and sends the event itself, once. Two sidecars on the real Redis, each with
 * its own webhook receiver, so each delivery says which instance made it.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { SyncRecord } from '../../src/protocol/records.js';
import type { AlertTuning } from '../../src/obs/alerts/alerts.js';
import { PRICE, alertFleet, alertsIdle, eventsOf, spend, type AlertFleet } from '../helpers/alerts.js';
import type { KeySpec } from '../helpers/sidecar.js';
import type { WebhookReceiver } from '../helpers/webhook-receiver.js';

const prefix = `kwho${randomBytes(4).toString('hex')}`;
/** Short retries and a short pending time: the operated ones are minutes. */
const TUNING = { checkDelayMs: 5, claimRetryMs: 50, firstRetryMs: 20, maxRetryMs: 100, retryWindowMs: 10_000, claimPendingMs: 400 };
const RECORDS: SyncRecord[] = [PRICE, { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 }];
const KEYS: Record<string, KeySpec> = {
  k_shutdown: { project: 'p_free', budget: 10, spent: 7.9 },
  k_lapse: { project: 'p_free', budget: 10, spent: 7.9 },
  k_queued: { project: 'p_free', budget: 10, spent: 7.5 },
};
let fleet: AlertFleet;
before(async () => {
  fleet = await alertFleet({ prefix, keys: KEYS, records: RECORDS });
});
after(() => fleet.close());
const instance = (tuning: Partial<AlertTuning> = {}) => fleet.instance({ tuning: { ...TUNING, ...tuning } });

const attemptsFor = (hook: WebhookReceiver, keyId: string): number => hook.received.filter((d) => JSON.parse(d.body).holder.id === keyId).length;

test('an instance that shuts down with a crossing undelivered releases it; the next instance to check the holder sends it, once', async () => {
  const a = await instance();
  const b = await instance();
  a.hook.failNext(1_000_000);
  assert.equal(await spend(a.h, 'k_shutdown', 200), 200); // 7.9 + 0.3: past 0.8
  await a.hook.until(() => attemptsFor(a.hook, 'k_shutdown') >= 2, 'a retry from the claiming instance');
  await a.h.close(); // its last attempt fails too: the event is given up, and its claim released
  assert.equal(a.h.sidecar.alerts.stats().failed, 1);
  assert.equal(await spend(b.h, 'k_shutdown', 10), 200);
  await alertsIdle(b.h);
  assert.deepEqual(eventsOf(b.hook.accepted(), 'key:k_shutdown').map((e) => e.threshold), [0.8], 'sent by the instance that checked next');
  assert.equal(eventsOf(a.hook.accepted(), 'key:k_shutdown').length, 0);
  // Claimed for good now: more spend on either side sends nothing more.
  const c = await instance();
  assert.equal(await spend(c.h, 'k_shutdown', 10), 200);
  assert.equal(await spend(b.h, 'k_shutdown', 10), 200);
  await alertsIdle(b.h, c.h);
  assert.equal(eventsOf([...b.hook.accepted(), ...c.hook.accepted()], 'key:k_shutdown').length, 1);
  assert.equal(attemptsFor(c.hook, 'k_shutdown'), 0);
});

test('an instance that stops renewing its claim (it hangs or died) loses it once its time is up; the other sends the event, once', async () => {
  // a's receiver never answers, and its attempt waits far longer than the claim's time. The
  // claim's 1.2 s leave room for a stalled machine between a's claim and its attempt's arrival.
  const a = await instance({ attemptTimeoutMs: 60_000, claimPendingMs: 1_200 });
  const b = await instance({ claimPendingMs: 1_200 });
  a.hook.hang(true);
  assert.equal(await spend(a.h, 'k_lapse', 200), 200);
  await a.hook.until(() => attemptsFor(a.hook, 'k_lapse') === 1, 'the claiming instance\'s attempt');
  const asked = Date.now();
  // b checks at once: the claim is a's, pending; b asks again until it lapses, then sends.
  assert.equal(await spend(b.h, 'k_lapse', 10), 200);
  await b.hook.until(() => eventsOf(b.hook.accepted(), 'key:k_lapse').length === 1, 'the event from the other instance');
  assert.ok(Date.now() - asked >= 600, 'not before the claim\'s time (1.2 s from its claim) was up');
  assert.deepEqual(eventsOf(b.hook.accepted(), 'key:k_lapse').map((e) => e.threshold), [0.8]);
  a.hook.hang(false);
  await a.h.close(); // its hanging attempt is cut: its release no longer names its claim
  assert.equal(await spend(b.h, 'k_lapse', 10), 200);
  await alertsIdle(b.h);
  assert.equal(eventsOf(b.hook.accepted(), 'key:k_lapse').length, 1, 'b\'s claim stands');
  assert.equal(eventsOf(a.hook.accepted(), 'key:k_lapse').length, 0);
});

test('an event waiting behind its holder\'s earlier one keeps its claim: the other instance does not send it too', async () => {
  // a's receiver hangs: a retries its first event for 4.5 s, far past the claim's 1.2 s, while
  // its second waits; then each attempt of the second waits 900 ms for an answer. (A pending
  // time of 1.2 s, renewed every 400 ms, outlasts the event-loop stalls of a loaded machine.)
  const a = await instance({ retryWindowMs: 4_500, attemptTimeoutMs: 900, claimPendingMs: 1_200 });
  const b = await instance();
  a.hook.hang(true);
  assert.equal(await spend(a.h, 'k_queued', 2_100), 200); // 7.5 + 2.2: past 0.8 and 0.95 at once
  await a.hook.until(() => attemptsFor(a.hook, 'k_queued') >= 1, 'the first event\'s first attempt');
  assert.equal(await spend(b.h, 'k_queued', 1), 200); // b checks the holder while both claims are a's, and asks again every 50 ms
  const tried = (threshold: number): number =>
    a.hook.received.filter((d) => {
      const e = JSON.parse(d.body) as { holder: { id: string }; threshold: number };
      return e.holder.id === 'k_queued' && e.threshold === threshold;
    }).length;
  // the second event's claim was made 4.5 s ago; b asks again through its first two attempts
  await a.hook.until(() => tried(0.95) >= 2, 'two attempts of the second event', 20_000);
  a.hook.hang(false);
  await alertsIdle(a.h, b.h);
  assert.deepEqual(eventsOf(a.hook.accepted(), 'key:k_queued').map((e) => e.threshold), [0.95]);
  assert.equal(attemptsFor(b.hook, 'k_queued'), 0, 'the other instance sent neither event');
});

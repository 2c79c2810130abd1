/**
 * Budget alerts (DESIGN section 13) on the real Redis, one threshold each: a claim whose
 * event is slow to deliver stays its claimer's as long as the claimer renews it, and a
 * replica change that moves only a holder's epoch arms the alert again (a new epoch
 * restarts the ledger, DESIGN section 6). Two sidecars, each with its own webhook receiver,
 * so each delivery says which instance made it.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { SyncRecord } from '../../src/protocol/records.js';
import type { AlertTuning } from '../../src/obs/alerts/alerts.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { parseChangeBatch } from '../../src/protocol/records.js';
import { PRICE, alertFleet, alertsIdle, eventsOf, spend, type AlertFleet } from '../helpers/alerts.js';
import { keyRecord, type KeySpec } from '../helpers/sidecar.js';
import type { WebhookReceiver } from '../helpers/webhook-receiver.js';

const prefix = `kwce${randomBytes(4).toString('hex')}`;
const RECORDS: SyncRecord[] = [PRICE, { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 }];
const KEYS: Record<string, KeySpec> = {
  k_slow: { project: 'p_free', budget: 10, spent: 7.9 },
  k_epoch: { project: 'p_free', budget: 10, spent: 8.5, epoch: 1 },
};
let fleet: AlertFleet;
before(async () => {
  fleet = await alertFleet({ prefix, keys: KEYS, records: RECORDS });
});
after(() => fleet.close());
const instance = (tuning: AlertTuning) => fleet.instance({ tuning: { checkDelayMs: 5, claimRetryMs: 50, retryWindowMs: 60_000, ...tuning }, thresholds: [0.8] });

const attemptsFor = (hook: WebhookReceiver, keyId: string): number => hook.received.filter((d) => JSON.parse(d.body).holder.id === keyId).length;

/**
 * The claim is pending 1.5 s without a renewal, renewed every third of that (0.5 s) while
 * its event waits between attempts; an attempt that hangs is cut after 0.6 s and the next
 * starts 2.1 s later, so the second attempt (about 2.7 s in) renews the claim until about
 * 4.2 s and the third does not come before about 5.4 s. Only the renewals while the event
 * waits bridge that gap: renewed every 1.5 s instead, the renewal due at 3 s falls within
 * the second attempt and is skipped, and the claim lapses from 4.2 s to the one at 4.5 s.
 */
const SLOW: AlertTuning = { claimPendingMs: 1_500, attemptTimeoutMs: 600, firstRetryMs: 2_100, maxRetryMs: 2_100 };

test('a claim whose delivery hangs past the claim\'s time stays its claimer\'s while the claimer renews it: the other instance never sends it', async () => {
  const a = await instance(SLOW);
  const b = await instance({ claimPendingMs: 1_500 });
  a.hook.hang(true);
  assert.equal(await spend(a.h, 'k_slow', 200), 200); // 7.9 + 0.3 of 10: past 0.8
  await a.hook.until(() => attemptsFor(a.hook, 'k_slow') === 1, 'the claiming instance\'s first attempt');
  // b checks the holder while a holds the claim pending, and asks again every 50 ms.
  assert.equal(await spend(b.h, 'k_slow', 1), 200);
  // Far past the claim's time; an instance that lost its claim stops attempting, so this then times out.
  const third = await a.hook.until(() => attemptsFor(a.hook, 'k_slow') >= 3, 'the claiming instance\'s third attempt', 10_000).catch((err: Error) => err);
  assert.equal(attemptsFor(b.hook, 'k_slow'), 0, 'the other instance took the claim over while its claimer was still delivering it');
  if (third instanceof Error) throw third;
  assert.equal(attemptsFor(a.hook, 'k_slow'), 3, 'the claimer kept its claim through 3 attempts, about 5.4 s, past 1.5 s');
  // The webhook answers again: a's next attempt delivers, and its claim is done for good.
  a.hook.hang(false);
  await alertsIdle(a.h);
  assert.deepEqual(eventsOf(a.hook.accepted(), 'key:k_slow').map((e) => e.threshold), [0.8]);
  assert.equal(await spend(b.h, 'k_slow', 1), 200);
  await alertsIdle(b.h);
  assert.equal(attemptsFor(b.hook, 'k_slow'), 0, 'sent once, by its claimer');
});

test('a replica change that moves only a holder\'s epoch arms its thresholds again: the new epoch\'s crossing is sent', async () => {
  const { h, hook } = await instance({ recheckMs: 5 });
  const mine = () => eventsOf(hook.accepted(), 'key:k_epoch');
  assert.equal(await spend(h, 'k_epoch', 10), 200); // 8.5 of 10 and more: past 0.8 in epoch 1
  await alertsIdle(h);
  assert.deepEqual(mine().map((e) => [e.threshold, e.epoch]), [[0.8, 1]]);
  // The console bumps the epoch (a reset to the same figure): spent and budget as before.
  const hash = makeKeyHasher(h.config.keys)(h.keys.k_epoch!);
  const batch = parseChangeBatch({ version: 2, changes: [{ op: 'upsert', ...keyRecord('k_epoch', { ...KEYS.k_epoch, epoch: 2 }, hash) }] });
  assert.ok(batch.ok);
  assert.ok(h.replica.applyChanges(batch.value, 'test'));
  // No request of the holder's: the watch looks the holder up again and finds the new epoch's ledger, restarted at 8.5, past 0.8.
  await hook.until(() => mine().length === 2, 'the alert of the new epoch', 5_000);
  assert.deepEqual(mine().map((e) => [e.threshold, e.epoch]), [[0.8, 1], [0.8, 2]]);
  assert.equal(mine()[1]!.spent, 8.5, 'the new epoch\'s ledger starts from the replica\'s figure');
  await alertsIdle(h);
  assert.equal(mine().length, 2, 'once in the new epoch too');
});

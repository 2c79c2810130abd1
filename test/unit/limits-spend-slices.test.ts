import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LeaseTerm } from '../../src/limits/lease-term.js';
import { createLeaseKeeper } from '../../src/limits/leases.js';
import type { SettleBatch, SettleOp, SpendSliceWrite } from '../../src/limits/redis/settle-batch.js';
import { SPEND_SLICE_CHECK_MS, SPEND_SLICE_COVER, type SpendSlice, SpendSliceTable } from '../../src/limits/redis/spend-slices.js';
import type { Holder } from '../../src/policy/holders.js';

const key: Holder = { id: 'key:k', kind: 'budget', base: 0, limit: 100, epoch: 0, code: 'key_budget_exhausted' };
const project: Holder = { id: 'project:p', kind: 'budget', base: 0, limit: 1000, epoch: 0, code: 'project_budget_exhausted' };
const KEYS = ['L:k', 'Z:k', 'L:p', 'Z:p'];

/** The table with a fake clock; the batch keeps what is added, and `send()` marks it sent as settle-batch.ts does. */
function setup() {
  const clock = { now: 0 };
  const queued: SettleOp[] = [];
  const batch: SettleBatch = { add: (op) => void queued.push(op), flush: () => undefined, close: async () => undefined };
  const keeper = createLeaseKeeper({ term: new LeaseTerm(30_000, 0), refresh: async () => undefined, onError: () => undefined });
  const t = new SpendSliceTable({ windowMs: 1000, batch, keeper, ledgerTtlMs: 86_400_000, owner: () => undefined, now: () => clock.now });
  const writes = (): SpendSliceWrite[] => queued.filter((op): op is SpendSliceWrite & SettleOp => op.kind === 'spendSlice');
  const send = (): SpendSliceWrite[] => {
    const w = writes();
    queued.length = 0;
    for (const op of w) op.sent = true;
    return w;
  };
  return { t, clock, keeper, send };
}

const grant = (t: SpendSliceTable, sizes: number[], holders = [key, project], sentAt = 0): void =>
  t.install({ keys: KEYS.slice(0, 2 * holders.length), tag: '{kw:t:p}', holders, id: 's1', sizes, sentAt });

test('a slice is asked for only with demand on every holder: what each held in the window, at least two holds like this one', () => {
  const { t } = setup();
  t.note(KEYS, 10);
  assert.equal(t.want(KEYS, 10), null, 'one hold is no demand');
  t.note(KEYS, 30);
  assert.deepEqual(t.want(KEYS, 10), { wants: [40, 40], least: SPEND_SLICE_COVER * 10 });
  assert.equal(t.want(KEYS, 25), null, 'what they held (40) does not cover two holds of 25');
  assert.deepEqual(t.want(KEYS, 0), { wants: [40, 40], least: 1 }, 'a zero hold needs a slice of at least one unit');
  t.note(['L:k', 'Z:k'], 5);
  t.note(['L:k', 'Z:k'], 5);
  t.note(['L:n', 'Z:n'], 5);
  assert.equal(t.want(['L:k', 'Z:k', 'L:n', 'Z:n'], 5), null, 'a holder seen once: no slice for either');
  t.refusedAll(KEYS);
  assert.equal(t.want(KEYS, 10), null, 'refused: quiet for a window');
  t.stop();
});

test('holds are taken on every holder or none, only with the figures the slice was granted under and before its time is up', () => {
  const { t, clock } = setup();
  grant(t, [30, 500]);
  assert.ok(t.take(KEYS, [key, project], 20));
  assert.equal(t.take(KEYS, [key, project], 20), null, 'the key has 10 left: no hold on either');
  assert.equal(t.unused('L:p', project), 480, 'the project slice is untouched by the refusal');
  assert.equal(t.take(KEYS, [{ ...key, epoch: 1 }, project], 1), null, 'another epoch');
  assert.equal(t.take(KEYS, [{ ...key, base: 5 }, project], 1), null, "the console's figure moved");
  assert.equal(t.take(KEYS, [{ ...key, limit: 50 }, project], 1), null, 'another limit');
  assert.ok(t.take(KEYS, [key, project], 10));
  assert.equal(t.take(KEYS, [key, project], 0), null, 'nothing left: not even a zero hold');
  grant(t, [30, 500], [key, project], 0);
  assert.ok(t.take(KEYS, [key, project], 0), 'a zero hold needs something left');
  clock.now = 999;
  assert.ok(t.take(KEYS, [key, project], 1));
  clock.now = 1000;
  assert.equal(t.take(KEYS, [key, project], 1), null, 'its time is up');
  t.stop();
});

test('settling keeps what a hold does not cost in a live slice; a cost past the slice ends the holders\' slices', () => {
  const { t, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  const a = t.take(k, [key], 40)!;
  const b = t.take(k, [key], 40)!;
  t.settle(a, 40, 10); // 30 come back to the slice
  assert.equal(t.unused('L:k', key), 50);
  t.settle(b, 40, 60); // 20 past its hold, absorbed by what the slice has left
  assert.equal(t.unused('L:k', key), 30);
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[70, 70, false]], 'one operation for both, sent once');
  const c = t.take(k, [key], 30)!;
  t.settle(c, 30, 50); // 20 past what the slice had: counted in Redis at once
  assert.equal(t.held(), 0, 'the slice ended');
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[50, 30, true]], 'record taken to 0 and removed');
  t.stop();
});

test('a slice given back keeps what is in flight on it and ends with its last hold; its holds settle as exact ones', () => {
  const { t, keeper, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  const a = t.take(k, [key], 30)!;
  const b = t.take(k, [key], 20)!;
  t.endAll(k);
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[0, 50, false]], 'the unused 50 go back');
  assert.equal(keeper.count(), 1, 'still kept alive for the holds in flight');
  t.settle(a, 30, 10);
  t.settle(b, 20, 25);
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[35, 50, true]], 'each hold gives back its whole amount');
  assert.equal(keeper.count(), 0);
  assert.equal(t.holdsInFlight(), 0);
  t.stop();
});

test('a settlement gathers in the pending operation until the batch sends it, then a new one starts', () => {
  const { t, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  const taken: SpendSlice[][] = [1, 2, 3].map(() => t.take(k, [key], 10)!);
  t.settle(taken[0]!, 10, 5);
  t.settle(taken[1]!, 10, 5);
  assert.deepEqual(send().map((w) => [w.cost, w.take]), [[10, 10]]);
  t.settle(taken[2]!, 10, 5);
  assert.deepEqual(send().map((w) => [w.cost, w.take]), [[5, 5]], 'a new operation after the first was sent');
  t.stop();
});

test('a slice goes back when its window is over, with what is left unused', () => {
  const { t, clock, send } = setup();
  grant(t, [100, 100]);
  t.take(KEYS, [key, project], 10);
  clock.now = 1000;
  t.sweep();
  assert.equal(t.held(), 0);
  assert.deepEqual(send().map((w) => [w.keys[0], w.take, w.end]), [['L:k', 90, false], ['L:p', 90, false]]);
  t.stop();
});

test('settlements that carry nothing ask Redis about a live slice at most every SPEND_SLICE_CHECK_MS; one with a cost goes at once', () => {
  const { t, clock, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  const zero = () => t.settle(t.take(k, [key], 0)!, 0, 0);
  zero();
  assert.deepEqual(send(), [], 'the grant itself was the last answer');
  clock.now = SPEND_SLICE_CHECK_MS;
  zero();
  zero();
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[0, 0, false]], 'one check, and the second settlement gathers in it');
  clock.now += SPEND_SLICE_CHECK_MS - 1;
  zero();
  assert.deepEqual(send(), [], 'asked less than SPEND_SLICE_CHECK_MS ago');
  t.settle(t.take(k, [key], 10)!, 10, 4);
  assert.deepEqual(send().map((w) => [w.cost, w.take]), [[4, 4]], 'a cost is settled at the next tick whatever the last check');
  clock.now += SPEND_SLICE_CHECK_MS;
  zero();
  const [check] = send();
  check!.onVoid!();
  assert.equal(t.held(), 0, 'a check answered void ends the slice');
  assert.equal(t.take(k, [key], 0), null, 'and the next hold of 0 is exact');
  t.stop();
});

test('a slice given back sends nothing for settlements that carry nothing, and ends with its last hold', () => {
  const { t, clock, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  const a = t.take(k, [key], 0)!;
  const b = t.take(k, [key], 0)!;
  t.endAll(k);
  assert.deepEqual(send().map((w) => [w.take, w.end]), [[100, false]], 'the unused 100 go back');
  clock.now = 10 * SPEND_SLICE_CHECK_MS;
  t.settle(a, 0, 0);
  assert.deepEqual(send(), [], 'nothing to settle and no live slice to ask about');
  t.settle(b, 0, 0);
  assert.deepEqual(send().map((w) => [w.cost, w.take, w.end]), [[0, 0, true]], 'the last hold ends it in Redis');
  t.stop();
});

test('holds in flight on a live slice are reported with its next settlement: a hold that raises them asks for one; the reading instance counts its own of now', () => {
  const { t, send } = setup();
  grant(t, [100], [key]);
  const k = ['L:k', 'Z:k'];
  assert.equal(t.overCounted('L:k', key), 0, 'granted with nothing in flight, as Redis records it');
  const a = t.take(k, [key], 30)!;
  assert.equal(t.overCounted('L:k', key), -30, 'Redis does not count it yet');
  const [report] = send();
  assert.deepEqual([report!.cost, report!.take, report!.end], [0, 0, false], 'the hold asks for a report');
  assert.equal(report!.inFlightNow(), 30, 'what the call carries as it leaves');
  assert.equal(t.overCounted('L:k', key), 0);
  t.take(k, [key], 0);
  assert.deepEqual(send(), [], 'a hold of 0 changes nothing to report');
  t.settle(a, 30, 10);
  const [settled] = send();
  assert.deepEqual([settled!.cost, settled!.take, settled!.inFlightNow()], [10, 10, 0]);
  t.stop();
});

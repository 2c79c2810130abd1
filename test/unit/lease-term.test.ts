/**
 * The lease term (`limits.leaseMs`, which a reload may change): what a call sent at a given
 * time can count on, and how the keepers' refresh timers follow a change.
 */
import assert from 'node:assert/strict';
import { mock, test, type TestContext } from 'node:test';
import { LeaseTerm } from '../../src/limits/lease-term.js';
import { createLeaseKeeper } from '../../src/limits/leases.js';

test('a call counts on the shortest term in force since it was sent', () => {
  const term = new LeaseTerm(30_000);
  assert.equal(term.lifetimeFrom(0), 30_000);
  term.set(5_000, 100);
  assert.equal(term.lifetimeFrom(50), 5_000, 'sent under 30 s, but a later call may have set 5 s');
  assert.equal(term.lifetimeFrom(150), 5_000);
  term.set(60_000, 200);
  assert.equal(term.lifetimeFrom(50), 5_000);
  assert.equal(term.lifetimeFrom(150), 5_000, 'sent under 5 s: it set 5 s, whatever came after');
  assert.equal(term.lifetimeFrom(250), 60_000);
  assert.equal(term.ms, 60_000);
});

test('a call older than every remembered change counts on the shortest term ever forgotten too', () => {
  const term = new LeaseTerm(1_000);
  for (let i = 1; i <= 20; i++) term.set(10_000 + i, i * 10);
  assert.equal(term.lifetimeFrom(205), 10_020);
  assert.equal(term.lifetimeFrom(0), 1_000, 'the first term, no longer remembered, was the shortest');
});

test('the refresh period is a third of the term unless fixed; setting the same term changes nothing', () => {
  const heard: number[] = [];
  const term = new LeaseTerm(30_000);
  term.onChange((previous) => heard.push(previous.ms));
  assert.equal(term.refreshEveryMs, 10_000);
  term.set(30_000);
  assert.deepEqual(heard, []);
  term.set(3_000);
  assert.equal(term.refreshEveryMs, 1_000);
  assert.deepEqual(heard, [30_000]);
  assert.equal(new LeaseTerm(30_000, 0).refreshEveryMs, 0);
});

/** One step of a keeper's life under mocked timers: move the clock by `tick` ms, then expect `refreshes` refreshes so far. */
type Step = { tick: number; refreshes: number; why?: string };

/**
 * A keeper on a 30 s term holding one lease in set `s`, under mocked timers: 5 s in, the
 * term becomes `newMs`; then the steps. Refreshes are counted once the last one's round
 * has ended (a round still running takes no other). Returns the keeper and the count.
 */
async function afterChange(t: TestContext, newMs: number, steps: Step[]) {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const term = new LeaseTerm(30_000);
  let n = 0;
  const k = createLeaseKeeper({ term, refresh: async () => void n++, onError: (err) => assert.fail(String(err)) });
  k.add('a', ['s']);
  const refreshes = async () => (await new Promise(setImmediate), n);
  t.mock.timers.tick(5_000);
  term.set(newMs);
  for (const step of steps) {
    t.mock.timers.tick(step.tick);
    assert.equal(await refreshes(), step.refreshes, step.why);
  }
  return { k, refreshes };
}

test('a longer term: the refresh already planned still comes, the ones after it at the new period', async (t) => {
  const { k } = await afterChange(t, 300_000, [
    { tick: 4_999, refreshes: 0 },
    { tick: 1, refreshes: 1, why: 'leases refreshed under 30 s must not wait 100 s' },
    { tick: 99_999, refreshes: 1 },
    { tick: 1, refreshes: 2 },
  ]);
  k.stop();
});

test('a shorter term: the next refresh comes one new period later', async (t) => {
  const { k, refreshes } = await afterChange(t, 3_000, [
    { tick: 999, refreshes: 0 },
    { tick: 1, refreshes: 1, why: 'a lease granted now lives 3 s: it is refreshed within a second' },
    { tick: 1_000, refreshes: 2 },
  ]);
  k.stop();
  t.mock.timers.tick(10_000);
  assert.equal(await refreshes(), 2, 'a stopped keeper refreshes no more');
});

test('a keeper with nothing to keep arms no timer when the term changes', () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  try {
    const term = new LeaseTerm(30_000);
    const k = createLeaseKeeper({ term, refresh: async () => assert.fail('nothing to refresh'), onError: () => undefined });
    term.set(3_000);
    assert.equal(k.timerRunning(), false);
    mock.timers.tick(60_000);
  } finally {
    mock.timers.reset();
  }
});

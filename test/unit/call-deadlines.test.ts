import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Deadlines, CallTimeoutError } from '../../src/limits/redis/deadlines.js';

/** A call the test answers (or not) by hand. */
function call<T>(): { p: Promise<T>; answer: (v: T) => void; fail: (err: unknown) => void } {
  let answer!: (v: T) => void;
  let fail!: (err: unknown) => void;
  const p = new Promise<T>((res, rej) => {
    answer = res;
    fail = rej;
  });
  return { p, answer, fail };
}

const settled = <T>(p: Promise<T>): Promise<'pending' | { value: T } | { error: unknown }> =>
  Promise.race([p.then((value) => ({ value }), (error: unknown) => ({ error })), new Promise<'pending'>((res) => setImmediate(() => res('pending')))]);

test('an unanswered call is rejected once its timeout has passed, not before', async () => {
  let now = 1_000;
  const d = new Deadlines({ timeoutMs: 100, now: () => now });
  const c = call<string>();
  const bound = d.bound(c.p);
  now += 99;
  d.expire();
  assert.equal(await settled(bound), 'pending');
  assert.equal(d.size, 1);
  now += 1;
  d.expire();
  const r = await settled(bound);
  assert.ok(typeof r === 'object' && 'error' in r && r.error instanceof CallTimeoutError, 'rejected with CallTimeoutError');
  assert.match((r as { error: Error }).error.message, /within 100 ms/);
  assert.equal(d.size, 0);
});

test("an answer in time is the call's answer, and its failure its error; the sweep stops once nothing is in flight", async () => {
  let now = 0;
  const d = new Deadlines({ timeoutMs: 100, now: () => now });
  const ok = call<number>();
  const bad = call<number>();
  const a = d.bound(ok.p);
  const b = d.bound(bad.p);
  assert.equal(d.sweeping, true);
  ok.answer(7);
  bad.fail(new Error('NOSCRIPT'));
  assert.deepEqual(await settled(a), { value: 7 });
  const r = await settled(b);
  assert.ok(typeof r === 'object' && 'error' in r && (r.error as Error).message === 'NOSCRIPT');
  assert.equal(d.size, 0);
  now += 1_000;
  d.expire(); // nothing in flight: the sweep ends instead of rejecting anything
  assert.equal(d.sweeping, false);
});

test("a late answer is dropped and does not free the cell another call took since", async () => {
  let now = 0;
  const d = new Deadlines({ timeoutMs: 100, now: () => now });
  const first = call<string>();
  const a = d.bound(first.p);
  now += 100;
  d.expire();
  assert.ok(typeof (await settled(a)) === 'object');
  const second = call<string>();
  const b = d.bound(second.p); // takes the cell the first call gave back
  first.answer('late');
  await settled(a);
  assert.equal(d.size, 1, 'the second call is still in flight');
  now += 100;
  d.expire();
  const r = await settled(b);
  assert.ok(typeof r === 'object' && 'error' in r && r.error instanceof CallTimeoutError, 'the second call still has its deadline');
  second.answer('later');
  assert.equal(d.size, 0);
});

test("a late answer goes to the caller's `late`, once, and never an answer in time", async () => {
  let now = 0;
  const d = new Deadlines({ timeoutMs: 100, now: () => now });
  const lateAnswers: string[] = [];
  const inTime = call<string>();
  const a = d.bound(inTime.p, (v) => lateAnswers.push(v));
  inTime.answer('in time');
  assert.deepEqual(await settled(a), { value: 'in time' });
  const slow = call<string>();
  const b = d.bound(slow.p, (v) => lateAnswers.push(v));
  now += 100;
  d.expire();
  assert.ok(typeof (await settled(b)) === 'object', 'rejected at its deadline');
  slow.answer('granted late');
  await settled(b);
  assert.deepEqual(lateAnswers, ['granted late']);
});

test("a `late` that throws goes to onLateError, not to an unhandled rejection", async () => {
  let now = 0;
  const told: unknown[] = [];
  const d = new Deadlines({ timeoutMs: 100, now: () => now, onLateError: (err) => told.push(err) });
  const unhandled: unknown[] = [];
  const onUnhandled = (err: unknown): void => void unhandled.push(err);
  process.on('unhandledRejection', onUnhandled);
  try {
    const slow = call<string>();
    const b = d.bound(slow.p, () => {
      throw new Error('undo failed');
    });
    now += 100;
    d.expire();
    await settled(b);
    slow.answer('granted late');
    await new Promise((res) => setImmediate(res));
    assert.deepEqual(told.map((e) => (e as Error).message), ['undo failed']);
    assert.deepEqual(unhandled, []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('the sweep alone rejects an unanswered call, on the real clock', async () => {
  const d = new Deadlines({ timeoutMs: 30 });
  // The sweep never keeps a process up (unref'd); a real call's connection does, this stands in for it.
  const connection = setInterval(() => undefined, 1_000);
  try {
    const started = performance.now();
    await assert.rejects(d.bound(new Promise(() => undefined)), CallTimeoutError);
    assert.ok(performance.now() - started >= 30, 'not before its timeout');
    assert.equal(d.size, 0);
  } finally {
    clearInterval(connection);
  }
});

test('a deadline runs its action once when it passes, and never once cleared', () => {
  let now = 0;
  const d = new Deadlines({ timeoutMs: 50, now: () => now });
  const ran: string[] = [];
  const a = d.start(() => ran.push('a'));
  const b = d.start(() => ran.push('b'));
  d.clear(b);
  now += 50;
  d.expire();
  d.expire();
  assert.deepEqual(ran, ['a'], 'the passed one ran once; the cleared one never');
  assert.equal(a.done, true);
  d.clear(a); // over already: nothing happens
  assert.equal(d.size, 0);
  const c = d.start(() => ran.push('c')); // may take a freed cell
  d.clear(a);
  assert.equal(d.size, 1, 'clearing an expired deadline again frees no other cell');
  d.clear(c);
  assert.deepEqual(ran, ['a']);
});

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isoClock } from '../../src/protocol/iso-clock.js';

/** A clock that answers the given times in turn, checked against toISOString at each. */
function agrees(times: number[]): void {
  let i = 0;
  const text = isoClock(() => times[i]!);
  for (; i < times.length; i++) assert.equal(text(), new Date(times[i]!).toISOString(), `at ${times[i]}`);
}

test('isoClock: the text toISOString writes, across seconds, days, years and the clock going back', () => {
  const t = Date.UTC(2026, 10, 29, 23, 59, 59, 998);
  agrees([t, t, t + 1, t + 2, t + 3, t + 1002, t + 999, t - 1000, t - 999, t + 1, t + 1]);
  // the milliseconds' padding: 0, 7, 42 and 999 into a second
  agrees([0, 7, 42, 999, 1000, 1007, 1042, 60_999]);
  // before 1970 (a negative time), and years whose text is wider or signed
  agrees([-1, -999, -1000, -1001, -62_198_755_200_001, 253_402_300_799_999, 253_402_300_800_000, 8.64e15]);
});

test('isoClock: a random walk of small and large steps, forwards and back, always as toISOString', () => {
  let seed = 7;
  const next = (): number => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
  const times: number[] = [];
  let t = Date.UTC(2026, 0, 1);
  for (let k = 0; k < 20_000; k++) {
    const r = next();
    t += r < 0.3 ? 0 : r < 0.8 ? Math.floor(next() * 3) : r < 0.95 ? Math.floor(next() * 2500) - 800 : Math.floor(next() * 1e10) - 5e9;
    times.push(t);
  }
  agrees(times);
});

test('isoClock: each call reads the clock once, and one millisecond gives the same text', () => {
  let calls = 0;
  const text = isoClock(() => (calls++, 1_764_460_800_123));
  const first = text();
  assert.equal(text(), first);
  assert.equal(first, '2025-11-30T00:00:00.123Z');
  assert.equal(calls, 2);
});

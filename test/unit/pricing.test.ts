import { test } from 'node:test';
import assert from 'node:assert/strict';
import { costOf, pickPrice, type PriceEntry } from '../../src/policy/pricing.js';
import { nextPeriodStart, periodStart } from '../../src/policy/period.js';

const p = (model: string, input: number, output = input, per = 1e6): PriceEntry => ({ model, input, output, per });

test('pickPrice: an exact name wins, then the longest matching glob, whatever the order', () => {
  const table = [p('*', 1), p('gpt-4o*', 2.5, 10), p('gpt-4o-mini*', 0.15, 0.6), p('gpt-4o-mini', 0.1), p('*-mini*', 7)];
  assert.deepEqual(pickPrice(table, 'gpt-4o-mini'), { input: 0.1, output: 0.1, per: 1e6 });
  assert.deepEqual(pickPrice(table, 'gpt-4o-mini-2024-07-18'), { input: 0.15, output: 0.6, per: 1e6 });
  assert.deepEqual(pickPrice(table, 'gpt-4o-2024'), { input: 2.5, output: 10, per: 1e6 });
  assert.deepEqual(pickPrice(table, 'o1-mini'), { input: 7, output: 7, per: 1e6 });
  assert.deepEqual(pickPrice(table, 'claude'), { input: 1, output: 1, per: 1e6 });
  assert.deepEqual(pickPrice([...table].reverse(), 'gpt-4o-mini-x'), { input: 0.15, output: 0.6, per: 1e6 });
  assert.equal(pickPrice(table.slice(1), 'claude'), null);
  assert.equal(pickPrice([], 'gpt-4o'), null);
  // an exact entry does not match other names; a glob is anchored at both ends
  assert.equal(pickPrice([p('gpt-4o', 1)], 'gpt-4o-mini'), null);
  assert.equal(pickPrice([p('gpt*', 1)], 'my-gpt'), null);
  // regex characters in a model name are literal
  assert.equal(pickPrice([p('a.b*', 1)], 'axb'), null);
});

test('pickPrice: equally long globs pick the one with fewer wildcards, then by name, in any order', () => {
  const a = p('ab*', 1);
  const b = p('a*c', 2);
  const c = p('**c', 3);
  for (const table of [[a, b, c], [c, b, a], [b, c, a]]) {
    assert.equal(pickPrice(table, 'abc')!.input, 2, 'same length and wildcards: by name');
    assert.equal(pickPrice(table.filter((x) => x !== b), 'abc')!.input, 1, 'fewer wildcards');
  }
});

test('costOf: usage at the price per `per` tokens; unpriced costs 0', () => {
  assert.equal(costOf({ input: 2.5, output: 10, per: 1e6 }, { input: 1000, output: 500 }), 0.0075);
  assert.equal(costOf({ input: 3, output: 4, per: 1000 }, { input: 1000, output: 1000 }), 7);
  assert.equal(costOf(null, { input: 1e9, output: 1e9 }), 0);
});

test('budget periods: UTC day, ISO week from Monday, calendar month', () => {
  const t = Date.parse('2026-11-25T13:45:00Z'); // a Wednesday
  assert.equal(new Date(periodStart('day', t)).toISOString(), '2026-11-25T00:00:00.000Z');
  assert.equal(new Date(nextPeriodStart('day', t)).toISOString(), '2026-11-26T00:00:00.000Z');
  assert.equal(new Date(periodStart('week', t)).toISOString(), '2026-11-23T00:00:00.000Z');
  assert.equal(new Date(nextPeriodStart('week', t)).toISOString(), '2026-11-30T00:00:00.000Z');
  assert.equal(new Date(periodStart('month', t)).toISOString(), '2026-11-01T00:00:00.000Z');
  assert.equal(new Date(nextPeriodStart('month', t)).toISOString(), '2026-12-01T00:00:00.000Z');
  // a Sunday belongs to the week that started the Monday before; a Monday starts its own
  assert.equal(new Date(periodStart('week', Date.parse('2026-11-29T23:59:59Z'))).toISOString(), '2026-11-23T00:00:00.000Z');
  assert.equal(new Date(periodStart('week', Date.parse('2026-11-30T00:00:00Z'))).toISOString(), '2026-11-30T00:00:00.000Z');
  // across the year end, and a week that spans two years
  assert.equal(new Date(nextPeriodStart('month', Date.parse('2026-12-31T23:59:59Z'))).toISOString(), '2027-01-01T00:00:00.000Z');
  assert.equal(new Date(periodStart('week', Date.parse('2027-01-01T10:00:00Z'))).toISOString(), '2026-12-28T00:00:00.000Z');
  assert.equal(new Date(nextPeriodStart('month', Date.parse('2028-02-10T00:00:00Z'))).toISOString(), '2028-03-01T00:00:00.000Z');
  assert.equal(periodStart('day', Date.parse('2026-11-25T00:00:00Z')), Date.parse('2026-11-25T00:00:00Z'));
});

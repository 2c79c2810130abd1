import assert from 'node:assert/strict';
import { test } from 'node:test';
import { effectiveBase, holdFits, holdNano, liveNano, toNano } from '../../src/limits/ledger.js';

test('ledger money: holds round up, float noise does not; settlements round to nearest', () => {
  assert.equal(holdNano(0.1), 100_000_000);
  assert.equal(holdNano(0.3), 300_000_000); // 0.3 * 1e9 = 299999999.99999994
  assert.equal(holdNano(1e-10), 1, 'a fraction of a unit still holds one');
  assert.equal(holdNano(0), 0);
  assert.equal(holdNano(-5), 0);
  assert.equal(holdNano(Number.NaN), 0);
  assert.equal(holdNano(Number.POSITIVE_INFINITY), Number.MAX_SAFE_INTEGER);
  assert.equal(toNano(0.1 + 0.2), 300_000_000);
  assert.equal(toNano(1.4e-9), 1);
});

test('ledger rules: live figures, fits, epochs', () => {
  const s = { epoch: 2, base0: 500, settled: 300, held: 100 };
  assert.equal(liveNano('budget', 500, s), 900, 'max(base, base0 + settled) + held');
  assert.equal(liveNano('budget', 850, s), 950, 'the replica caught up: no double count');
  assert.equal(liveNano('wallet', 500, s), 100, 'min(base, base0 - settled) - held');
  assert.equal(liveNano('wallet', 150, s), 50);
  assert.ok(holdFits('budget', 900, 100, 1000));
  assert.ok(!holdFits('budget', 900, 101, 1000));
  assert.ok(!holdFits('budget', 1000, 0, 1000), 'an exhausted budget refuses even a zero hold');
  assert.ok(holdFits('budget', 1e15, 1e15, null), 'no limit');
  assert.ok(holdFits('wallet', 100, 100, null));
  assert.ok(!holdFits('wallet', 100, 101, null));
  assert.ok(!holdFits('wallet', 0, 0, null), 'an empty wallet refuses even a zero hold');
  assert.deepEqual(effectiveBase(undefined, { epoch: 0 }, 7), { restart: true, base: 7 });
  assert.deepEqual(effectiveBase(s, { epoch: 3 }, 7), { restart: true, base: 7 });
  assert.deepEqual(effectiveBase(s, { epoch: 2 }, 7), { restart: false, base: 7 });
  assert.deepEqual(effectiveBase(s, { epoch: 1 }, 7), { restart: false, base: 500 }, 'a stale replica: base0 instead');
});

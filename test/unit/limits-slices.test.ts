import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KEEP_SHARE, SLICE_SHARE, type Slice, SliceTable } from '../../src/limits/redis/slices.js';

const table = (given: Slice[] = []): { t: SliceTable; clock: { now: number } } => {
  const clock = { now: 0 };
  const t = new SliceTable({ sliceMs: 1000, now: () => clock.now, giveBack: (_k, s) => given.push(s) });
  return { t, clock };
};

test('no slice is asked for a key seen once, nor one smaller than two requests', () => {
  const { t } = table();
  t.note('k', 10);
  assert.equal(t.want('k', 1000, 0), null, 'one request is no demand');
  t.note('k', 10);
  assert.equal(t.want('k', 16, 0), null, 'a slice of 1/16 of 16 is one request: not worth it');
  const w = t.want('k', 1000, 0);
  assert.deepEqual(w, { rpm: 2, tpm: 0, keepRpm: Math.ceil(1000 * KEEP_SHARE), keepTpm: 0 });
  t.stop();
});

test('a slice is what the key used in the last window, at most 1/16 of the capacity; TPM covers two typical requests', () => {
  const { t } = table();
  for (let i = 0; i < 500; i++) t.note('k', 100);
  assert.equal(t.want('k', 1000, 0)!.rpm, Math.floor(1000 * SLICE_SHARE));
  assert.equal(t.want('k', 0, 10_000_000)!.tpm, 50_000, 'what the key used: 500 x 100 tokens');
  assert.equal(t.want('k', 0, 320_000)!.tpm, Math.floor(320_000 * SLICE_SHARE));
  assert.equal(t.want('k', 0, 3000), null, '187 tokens cannot cover two requests of 100');
  t.stop();
});

test('admits from a live slice only while it covers the request and its time is not over; gives back what is left', () => {
  const given: Slice[] = [];
  const { t, clock } = table(given);
  for (let i = 0; i < 4; i++) t.note('k', 100);
  t.install('k', { id: 's1', rpmCap: 1000, tpmCap: 100_000, granted: { rpm: 3, tpm: 250 }, seen: { rpm: 900, tpm: 90_000 } }, clock.now);
  assert.ok(t.take('k', 1000, 100_000, 100));
  assert.ok(t.take('k', 1000, 100_000, 100));
  assert.equal(t.take('k', 1000, 100_000, 100), null, '50 tokens left do not cover 100');
  assert.ok(t.take('k', 1000, 100_000, 50));
  assert.equal(t.take('k', 1000, 100_000, 0), null, 'no request left in the slice');
  assert.equal(t.take('k', 2000, 100_000, 0), null, 'other limits: another bucket');
  t.install('k', { id: 's2', rpmCap: 1000, tpmCap: 100_000, granted: { rpm: 5, tpm: 500 }, seen: { rpm: 900, tpm: 90_000 } }, clock.now);
  assert.deepEqual(given.map((s) => [s.id, s.left]), [['s1', { rpm: 0, tpm: 0 }]], 'a replaced slice is given back');
  clock.now = 999;
  assert.ok(t.take('k', 1000, 100_000, 100));
  clock.now = 1000;
  assert.equal(t.take('k', 1000, 100_000, 100), null, 'over after sliceMs');
  t.sweep();
  assert.deepEqual(given.at(-1)!.left, { rpm: 4, tpm: 400 });
  assert.equal(t.held(), 0);
  t.stop();
});

test('after Redis refuses a slice the key asks again only after one sliceMs', () => {
  const { t, clock } = table();
  for (let i = 0; i < 4; i++) t.note('k', 0);
  t.refused('k');
  assert.equal(t.want('k', 1000, 0), null);
  clock.now = 1000;
  t.note('k', 0);
  assert.ok(t.want('k', 1000, 0));
  t.stop();
});

test('a request admitted from a slice settles into it while it is live; otherwise the settlement goes to Redis', () => {
  const given: Slice[] = [];
  const { t, clock } = table(given);
  for (let i = 0; i < 4; i++) t.note('k', 100);
  t.install('k', { id: 's1', rpmCap: 1000, tpmCap: 100_000, granted: { rpm: 4, tpm: 400 }, seen: { rpm: 900, tpm: 90_000 } }, clock.now);
  const s = t.take('k', 1000, 100_000, 100)!;
  const s2 = t.take('k', 1000, 100_000, 100)!;
  assert.deepEqual(s.left, { rpm: 2, tpm: 200 });
  assert.equal(t.settle('k', s, { rpm: 0, tpm: 60 }), true, 'a refund of 60 (100 reserved, 40 used)');
  assert.deepEqual(s.left, { rpm: 2, tpm: 260 });
  assert.equal(t.settle('k', s2, { rpm: 0, tpm: -60 }), true, 'a charge of 60 fits the 260 left');
  assert.equal(t.settle('k', s2, { rpm: 1, tpm: 100 }), true, 'an undo gives the request and its tokens back');
  assert.deepEqual(s.left, { rpm: 3, tpm: 300 });
  clock.now = 1000;
  assert.equal(t.settle('k', s, { rpm: 0, tpm: 10 }), false, 'a slice whose time is over takes nothing more');
  t.sweep();
  assert.deepEqual(given.map((g) => [g.id, g.left]), [['s1', { rpm: 3, tpm: 300 }]], 'what was settled into it goes back with it');
  assert.equal(t.settle('k', s, { rpm: 0, tpm: 10 }), false, 'nor one given back');
  t.stop();
});

test('a charge past what the slice holds goes to Redis and sends the slice back: the next request is judged by the bucket', () => {
  const given: Slice[] = [];
  const { t } = table(given);
  for (let i = 0; i < 4; i++) t.note('k', 100);
  t.install('k', { id: 's1', rpmCap: 1000, tpmCap: 100_000, granted: { rpm: 4, tpm: 400 }, seen: { rpm: 900, tpm: 90_000 } }, 0);
  const s = t.take('k', 1000, 100_000, 100)!;
  assert.equal(t.settle('k', s, { rpm: 0, tpm: -500 }), false, '500 owed past the 300 left: Redis charges it, into debt');
  assert.deepEqual(given.map((g) => [g.id, g.left]), [['s1', { rpm: 3, tpm: 300 }]], 'what the slice held goes back against the debt');
  assert.equal(t.take('k', 1000, 100_000, 0), null, 'no request admitted from it any more');
  assert.equal(t.settle('k', s, { rpm: 0, tpm: 10 }), false);
  assert.equal(t.held(), 0);
  t.stop();
});

test('a slice settles only the buckets it holds: a TPM charge on a key limited by RPM alone costs nothing', () => {
  const { t } = table();
  for (let i = 0; i < 4; i++) t.note('k', 100);
  t.install('k', { id: 's1', rpmCap: 1000, tpmCap: 0, granted: { rpm: 3, tpm: 0 }, seen: { rpm: 900, tpm: 0 } }, 0);
  const s = t.take('k', 1000, 0, 100)!;
  assert.equal(t.settle('k', s, { rpm: 0, tpm: -40 }), true);
  assert.deepEqual(s.left, { rpm: 2, tpm: 0 });
  t.stop();
});

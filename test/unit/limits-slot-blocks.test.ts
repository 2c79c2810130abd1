import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LeaseTerm } from '../../src/limits/lease-term.js';
import { BLOCK_SHARE, type Block, BlockTable } from '../../src/limits/redis/slot-blocks.js';

interface Resize {
  id: string;
  weight: number;
  dropped: boolean;
}

const table = (term = new LeaseTerm(3000)): { t: BlockTable; clock: { now: number }; resized: Resize[] } => {
  const clock = { now: 0 };
  const resized: Resize[] = [];
  const t = new BlockTable({
    sliceMs: 1000,
    term,
    now: () => clock.now,
    resize: (_k, b, weight, dropped) => resized.push({ id: b.id, weight, dropped }),
  });
  return { t, clock, resized };
};

test('a block is the peak in flight plus one, at most 1/16 of C, never for a key seen once', () => {
  const { t } = table();
  t.note('k');
  assert.equal(t.want('k', 1000), 0, 'one request is no demand');
  t.note('k');
  assert.equal(t.want('k', 1000), 1, 'nothing in flight: one slot');
  for (let i = 0; i < 5; i++) t.started('k');
  assert.equal(t.want('k', 1000), 6);
  assert.equal(t.want('k', 48), Math.floor(48 * BLOCK_SHARE));
  assert.equal(t.want('k', 15), 0, 'C under 16: no block');
  t.stop();
});

test('takes free slots of a live block only; slots come back to the block when requests end', () => {
  const { t, clock } = table();
  t.note('k');
  t.note('k');
  const b = t.granted('k', 'b1', 64, 2, clock.now);
  assert.equal(t.free('k', 32), null, 'another limit: not this block');
  t.take('k', t.free('k', 64)!);
  t.take('k', t.free('k', 64)!);
  assert.equal(t.free('k', 64), null, 'both slots in use');
  assert.equal(t.inUse(), 2);
  t.ended('k', b);
  assert.equal(t.free('k', 64), b);
  assert.equal(t.want('k', 64), 3, 'peak 2: a bigger block is worth asking for');
  clock.now = 3000;
  assert.equal(t.free('k', 64), null, 'past leaseMs from the grant: Redis may have let it go');
  t.stop();
});

test('a refresh extends the blocks Redis still records; a block it missed is dropped, the others in its chunk are kept', () => {
  const { t, clock, resized } = table();
  t.granted('k', 'b1', 64, 2, 0);
  t.granted('j', 'b2', 64, 2, 0);
  clock.now = 2000;
  t.refreshed(['x', 'b1', 'b2'], 1500, ['x']);
  clock.now = 4000;
  assert.ok(t.free('k', 64), 'b1: a per-request lease missing from the same chunk does not cost the block; valid until 1500 + leaseMs');
  assert.ok(t.free('j', 64), 'b2 as well');
  t.refreshed(['b1', 'b2'], 4000, ['b1']);
  assert.equal(t.current('k'), null, 'b1 was missing: dropped');
  assert.equal(t.current('j')?.id, 'b2', 'b2 was found: kept');
  assert.deepEqual(resized, [{ id: 'b1', weight: 0, dropped: true }]);
  t.stop();
});

test('a shorter lease term: no block is used past one new term from the change, nor counted on longer from a reply sent before it', () => {
  const term = new LeaseTerm(3000);
  const { t, clock } = table(term);
  t.granted('k', 'b1', 64, 2, 0);
  clock.now = 500;
  term.set(1000, 500);
  assert.equal(t.current('k')?.validUntil, 1500, 'the next refresh may tell Redis 1 s: 3000 is no longer counted on');
  t.refreshed(['b1'], 400, []);
  assert.equal(t.current('k')?.validUntil, 1500, 'a refresh sent before the change, answered after it, counts for the new term only');
  t.refreshed(['b1'], 600, []);
  assert.equal(t.current('k')?.validUntil, 1600);
  clock.now = 1599;
  assert.ok(t.free('k', 64));
  clock.now = 1600;
  assert.equal(t.free('k', 64), null);
  t.stop();
});

test('a longer lease term counts from the calls sent under it', () => {
  const term = new LeaseTerm(1000);
  const { t, clock } = table(term);
  t.granted('k', 'b1', 64, 2, 0);
  clock.now = 500;
  term.set(10_000, 500);
  assert.equal(t.current('k')?.validUntil, 1000, 'nothing sent yet has told Redis more');
  t.refreshed(['b1'], 450, []);
  assert.equal(t.current('k')?.validUntil, 1450, 'sent under 1 s');
  t.refreshed(['b1'], 600, []);
  assert.equal(t.current('k')?.validUntil, 10_600);
  t.stop();
});

test('slots left free a whole sliceMs go back; a block with none in use ends; close keeps only slots in use', () => {
  const { t, clock, resized } = table();
  const b: Block = t.granted('k', 'b1', 160, 4, 0);
  t.take('k', b);
  t.take('k', b);
  clock.now = 500;
  t.sweep();
  assert.equal(resized.length, 0, 'not a whole sliceMs yet');
  clock.now = 1000;
  t.sweep();
  assert.deepEqual(resized.pop(), { id: 'b1', weight: 2, dropped: false }, 'two slots stayed free');
  t.ended('k', b);
  t.ended('k', b);
  clock.now = 2000;
  t.sweep();
  assert.equal(resized.length, 0, 'no slot was free at the start of that window');
  clock.now = 3000;
  t.sweep();
  assert.deepEqual(resized.pop(), { id: 'b1', weight: 0, dropped: true });
  assert.equal(t.held(), 0);

  const c = t.granted('k', 'b2', 160, 4, clock.now);
  t.take('k', c);
  t.sweep(true);
  assert.deepEqual(resized.pop(), { id: 'b2', weight: 1, dropped: true }, 'the slot in use stays counted until its request ends');
  t.ended('k', c);
  assert.deepEqual(resized.pop(), { id: 'b2', weight: 0, dropped: true }, 'then the block ends');
  t.stop();
});

test('no resize while a grow is in flight', async () => {
  const { t, clock, resized } = table();
  t.granted('k', 'b1', 160, 4, 0);
  let release!: () => void;
  t.track('k', new Promise<void>((r) => (release = r)));
  clock.now = 1500;
  t.sweep();
  assert.equal(resized.length, 0);
  release();
  await new Promise((r) => setImmediate(r));
  t.sweep();
  assert.deepEqual(resized.pop(), { id: 'b1', weight: 0, dropped: true });
  t.stop();
});

test('a block dropped with slots in use stays held (its lease refreshed) until the last of them ends', () => {
  const { t, resized } = table();
  t.note('k');
  t.note('k');
  const b = t.granted('k', 'b1', 64, 2, 0);
  t.take('k', t.free('k', 64)!);
  t.lost('k', 'b1');
  assert.deepEqual(resized.at(-1), { id: 'b1', weight: 1, dropped: true }, 'shrunk to the slot in use, not ended');
  assert.equal(t.held(), 1, 'its lease is still kept for the request on it');
  assert.equal(t.free('k', 64), null, 'no new request takes a dropped block');
  t.ended('k', b);
  assert.deepEqual(resized.at(-1), { id: 'b1', weight: 0, dropped: true }, 'ended with its last request');
  assert.equal(t.held(), 0);
  t.stop();
});

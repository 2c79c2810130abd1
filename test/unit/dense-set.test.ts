/**
 * The set of in-flight responses and body watches: size, reuse of emptied indexes, a walk
 * that tolerates deletions, and a cell emptied twice staying counted once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DenseSet } from '../../src/dense-set.js';

const walk = <T>(s: DenseSet<T>): T[] => {
  const out: T[] = [];
  s.forEach((x) => out.push(x));
  return out;
};

test('items added are counted and walked; a deleted one is gone from both', () => {
  const s = new DenseSet<string>();
  const a = s.add('a');
  const b = s.add('b');
  s.add('c');
  assert.equal(s.size, 3);
  s.delete(b);
  assert.equal(s.size, 2);
  assert.deepEqual(walk(s), ['a', 'c']);
  s.delete(a);
  assert.deepEqual(walk(s), ['c']);
});

test('an emptied cell is reused before the array grows', () => {
  const s = new DenseSet<number>();
  const indexes = [s.add(1), s.add(2), s.add(3)];
  s.delete(indexes[1]!);
  assert.equal(s.add(4), indexes[1]);
  assert.equal(s.add(5), 3);
  assert.deepEqual(walk(s), [1, 4, 3, 5]);
});

test('deleting a cell twice, or one never given, changes nothing', () => {
  const s = new DenseSet<string>();
  const a = s.add('a');
  s.add('b');
  s.delete(a);
  s.delete(a);
  s.delete(-1);
  s.delete(99);
  assert.equal(s.size, 1);
  // the freed cell was listed once: two adds take it and then a new one
  assert.equal(s.add('c'), a);
  assert.equal(s.add('d'), 2);
  assert.equal(s.size, 3);
});

test('an item deleted during a walk is not visited after', () => {
  const s = new DenseSet<string>();
  const indexes = new Map<string, number>();
  for (const x of ['a', 'b', 'c', 'd']) indexes.set(x, s.add(x));
  const seen: string[] = [];
  s.forEach((x) => {
    seen.push(x);
    if (x === 'a') s.delete(indexes.get('c')!);
    if (x === 'b') s.delete(indexes.get('b')!);
  });
  assert.deepEqual(seen, ['a', 'b', 'd']);
  assert.equal(s.size, 2);
});

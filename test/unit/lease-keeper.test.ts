/**
 * The lease keeper: leases are refreshed batched per set, a ticket removes exactly its
 * lease (the same id kept twice is two leases), and the timer runs only while leases are held.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LeaseTerm } from '../../src/limits/lease-term.js';
import { createLeaseKeeper } from '../../src/limits/leases.js';

function keeper(everyMs = 0) {
  const calls: [string, string[]][] = [];
  const k = createLeaseKeeper({ term: new LeaseTerm(30_000, everyMs), refresh: async (setKey, ids) => void calls.push([setKey, [...ids].sort()]), onError: (err) => assert.fail(String(err)) });
  const refreshed = async () => {
    calls.length = 0;
    await k.refreshNow();
    return Object.fromEntries(calls);
  };
  return { k, refreshed };
}

test('each set is refreshed once with the ids of its live leases', async () => {
  const { k, refreshed } = keeper();
  k.add('a', ['key', 'route']);
  const b = k.add('b', ['key']);
  k.add('c', ['route']);
  assert.equal(k.count(), 3);
  assert.deepEqual(await refreshed(), { key: ['a', 'b'], route: ['a', 'c'] });
  k.remove(b);
  assert.equal(k.count(), 2);
  assert.deepEqual(await refreshed(), { key: ['a'], route: ['a', 'c'] });
});

test('a ticket removes its own lease only, once', async () => {
  const { k, refreshed } = keeper();
  const first = k.add('x', ['s']);
  k.add('y', ['s']);
  k.remove(first);
  k.remove(first);
  assert.equal(k.count(), 1);
  assert.deepEqual(await refreshed(), { s: ['y'] });
  // the freed slot goes to the next lease (so a ticket is given back once, by its holder)
  const z = k.add('z', ['s']);
  assert.equal(z, first);
  assert.deepEqual(await refreshed(), { s: ['y', 'z'] });
});

test('a lease in no set is not kept; its ticket removes nothing', async () => {
  const { k, refreshed } = keeper();
  const none = k.add('n', []);
  assert.equal(none, -1);
  k.add('m', ['s']);
  k.remove(none);
  assert.equal(k.count(), 1);
  assert.deepEqual(await refreshed(), { s: ['m'] });
});

test('the refresh timer runs only while a lease is held', () => {
  const { k } = keeper(1_000);
  assert.equal(k.timerRunning(), false);
  const t = k.add('a', ['s']);
  assert.equal(k.timerRunning(), true);
  k.remove(t);
  assert.equal(k.timerRunning(), false);
  k.stop();
});

/**
 * The alert watch against a real in-process limiter, where the store or the replica is
 * behind: a check the store cannot answer is made again; figures of an epoch the replica
 * does not have yet wait for it; a wallet is judged against its balance at its epoch as
 * first recorded, after its ledger restarted; a replica change checks recent holders again.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { LedgerFigure, LedgerInput } from '../../src/limits/limiter.js';
import { quiet } from '../../src/log.js';
import { AlertWatch, type AlertStore, type WatchOptions } from '../../src/obs/alerts/watch.js';
import type { Crossing } from '../../src/obs/alerts/event.js';
import type { Holder } from '../../src/policy/holders.js';

const T = [0.8, 0.95, 1];
const keyHolder = (o: { base: number; limit: number; epoch?: number }): Holder => ({ id: 'key:k_1', kind: 'budget', base: o.base, limit: o.limit, epoch: o.epoch ?? 0, code: 'key_budget_exhausted', period: null });

/** A store that reads its figures from `ledger` and claims in `limiter`. */
const storeOn = (limiter: ReturnType<typeof createMemoryLimiter>, ledger: AlertStore['ledger']): AlertStore => ({
  ledger,
  claimOnce: (input) => limiter.claimOnce(input),
  claimedBy: (input) => limiter.claimedBy(input),
});

/** Holds and settles `amount` on `holder`, as a request that spent it. */
async function spent(limiter: ReturnType<typeof createMemoryLimiter>, holder: Holder, amount: number): Promise<void> {
  const held = await limiter.hold({ tag: 'p:p_1', holders: [holder], amount });
  assert.ok(held.ok);
  held.hold.settle(amount);
}

/** A watch on `store`, with what it found, and a wait for its next retry (the retry timer is unref'd: the wait keeps the loop alive). */
function watchOn(store: AlertStore, extra: Partial<WatchOptions> = {}) {
  const found: Crossing[] = [];
  const watch = new AlertWatch({ store, thresholds: () => T, found: (c) => found.push(c), log: quiet, checkDelayMs: 1, claimRetryMs: 20, now: () => 0, pendingMs: 60_000, ...extra });
  const shown = () => found.map((c) => [c.holder, c.threshold, c.budget, c.spent, c.epoch]);
  return { watch, found, shown };
}

/** A promise kept the first time `signal` is called after `arm`; the loop stays alive meanwhile (the watch's retry timer is unref'd). */
function signalled() {
  let fire: (() => void) | null = null;
  let alive: NodeJS.Timeout | null = null;
  return {
    signal: () => fire?.(),
    next: () =>
      new Promise<void>((r) => {
        alive = setInterval(() => undefined, 1_000);
        fire = () => {
          fire = null;
          clearInterval(alive!);
          r();
        };
      }),
  };
}

test('a check the store cannot answer is made again later, and finds what was reached', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  let failures = 1;
  const asked = signalled();
  const store = storeOn(limiter, (input) => {
    if (failures-- > 0) return Promise.reject(new Error('the limits store is unavailable'));
    asked.signal();
    return limiter.ledger(input);
  });
  const { watch, shown } = watchOn(store);
  const again = asked.next();
  watch.touched('p:p_1', [keyHolder({ base: 8.2, limit: 10 })]);
  await watch.idle();
  assert.deepEqual(shown(), []);
  await again;
  await watch.idle();
  assert.deepEqual(shown(), [['key:k_1', 0.8, 10, 8.2, 0]]);
  await watch.close();
  await limiter.close();
});

test('figures of an epoch the replica does not have yet wait for it: judged against the new budget', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  // Another instance's replica has epoch 1 (budget 20) and spent 8.6 in it.
  const fresh = keyHolder({ base: 0, limit: 20, epoch: 1 });
  await spent(limiter, fresh, 8.6);
  let replica = keyHolder({ base: 0, limit: 10, epoch: 0 });
  const looked = signalled();
  const { watch, shown } = watchOn(limiter, {
    current: () => {
      looked.signal();
      return replica;
    },
  });
  watch.touched('p:p_1', [replica]);
  await watch.idle();
  assert.deepEqual(shown(), [], '8.6 of the old budget of 10 is not what epoch 1 reached');
  assert.ok(watch.pendingRetries(), 'asked again later');
  replica = fresh;
  await looked.next();
  await watch.idle();
  assert.equal(watch.pendingRetries(), false);
  assert.deepEqual(shown(), [], '8.6 of 20');
  await spent(limiter, fresh, 8);
  watch.touched('p:p_1', [fresh]);
  await watch.idle();
  assert.deepEqual(shown(), [['key:k_1', 0.8, 20, 16.6, 1]]);
  await watch.close();
  await limiter.close();
});

test('a wallet is judged against its balance at its epoch as first recorded, after its ledger started again', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const wallet: Holder = { id: 'wallet:u_1', kind: 'wallet', base: 100, limit: null, epoch: 1, code: 'insufficient_balance' };
  let figure: LedgerFigure = { id: wallet.id, live: 50, epoch: 1, start: 100 };
  const store = storeOn(limiter, async (_input: LedgerInput) => [figure]);
  const { watch, shown } = watchOn(store);
  watch.touched('u:u_1', [wallet]);
  await watch.idle();
  assert.deepEqual(shown(), []);
  // A day idle: the ledger expired and started again from the replica's balance then, 50.
  figure = { id: wallet.id, live: 20, epoch: 1, start: 50 };
  watch.touched('u:u_1', [{ ...wallet, base: 50 }]);
  await watch.idle();
  assert.deepEqual(shown(), [['wallet:u_1', 0.8, 100, 80, 1]], '80 of the 100 the wallet had at its epoch');
  await watch.close();
  await limiter.close();
});

test('a replica change checks recent holders again with their new figures: usage billed later reaches a threshold', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  let replica = keyHolder({ base: 9.7, limit: 10 });
  const { watch, shown } = watchOn(limiter, { current: () => replica });
  watch.touched('p:p_1', [replica]);
  await watch.idle();
  assert.deepEqual(shown(), [['key:k_1', 0.8, 10, 9.7, 0], ['key:k_1', 0.95, 10, 9.7, 0]]);
  watch.replicaChanged();
  await watch.idle();
  assert.equal(shown().length, 2, 'unchanged figures: nothing checked again');
  // The console billed usage this instance served while the shared store was down.
  replica = keyHolder({ base: 10, limit: 10 });
  watch.replicaChanged();
  await watch.idle();
  assert.deepEqual(shown().at(-1), ['key:k_1', 1, 10, 10, 0]);
  await watch.close();
  await limiter.close();
});

test('a lower threshold another instance holds pending stops the higher ones: one crossing of two is not split between instances', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const asked: string[] = [];
  const store: AlertStore = {
    ledger: (input) => limiter.ledger(input),
    claimOnce: (input) => {
      asked.push(`${input.name}${input.turn ? `:${input.turn}` : ''}`);
      return limiter.claimOnce(input);
    },
    claimedBy: (input) => limiter.claimedBy(input),
  };
  // Another instance found 0.8 and 0.95 in one crossing and has claimed 0.8 so far.
  const other = { tag: 'p:p_1', holder: 'key:k_1', epoch: 0, name: 'alert:0.8', token: 'other', ttlMs: 60_000, pendingMs: 60_000 };
  assert.equal(await limiter.claimOnce(other), 'claimed');
  const { watch, found } = watchOn(store);
  watch.touched('p:p_1', [keyHolder({ base: 9.6, limit: 10 })]);
  await watch.idle();
  assert.deepEqual(asked, ['alert:0.8'], '0.95 is not asked for while 0.8 is held');
  assert.equal(found.length, 0);
  assert.equal(watch.pendingRetries(), true, 'asked again later');
  await watch.close();
  await limiter.close();
});

/**
 * Conformance, part three: spend holds and the live ledger (DESIGN section 6, "Money").
 * Registered inside runLimiterConformance's suite; every test uses its own tag.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { HoldInput, HoldResult, Limiter } from '../../src/limits/limiter.js';
import type { Holder } from '../../src/policy/holders.js';
import { type Harness, uid } from './redis-limits-conformance.js';

type Fig = { base: number; epoch?: number };
export const keyBudget = (id: string, o: Fig & { limit: number }): Holder => ({
  id: `key:${id}`, kind: 'budget', base: o.base, limit: o.limit, epoch: o.epoch ?? 0, code: 'key_budget_exhausted',
});
export const projectBudget = (id: string, o: Fig & { limit: number }): Holder => ({
  id: `project:${id}`, kind: 'budget', base: o.base, limit: o.limit, epoch: o.epoch ?? 0, code: 'project_budget_exhausted',
});
export const wallet = (id: string, o: Fig): Holder => ({
  id: `wallet:${id}`, kind: 'wallet', base: o.base, limit: null, epoch: o.epoch ?? 0, code: 'insufficient_balance',
});

export const req = (tag: string, holders: Holder[], amount: number): HoldInput => ({ tag, holders, amount });

export function held(r: HoldResult): { settle(actual: number): void } {
  assert.ok(r.ok, `expected a hold, got ${JSON.stringify(r)}`);
  return r.hold;
}
export function refused(r: HoldResult, code: string): void {
  assert.equal(r.ok, false, `expected ${code}, got a hold`);
  if (!r.ok) assert.equal(r.code, code);
}
export async function live(lim: Limiter, tag: string, holder: Holder): Promise<number> {
  const [fig] = await lim.ledger({ tag, holders: [holder] });
  assert.equal(fig?.id, holder.id);
  return fig!.live;
}
export const near = (actual: number, expected: number, what: string): void =>
  assert.ok(Math.abs(actual - expected) < 1e-9, `${what}: ${actual}, expected ${expected}`);

/** 20 holds of R/2.5 at once against R left: exactly two fit; the others name the holder. */
export async function twoOfTwenty(lims: Limiter[], tag: string, holders: Holder[], r: number, code: string): Promise<void> {
  const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => lims[i % lims.length]!.hold(req(tag, holders, r / 2.5))));
  assert.equal(rs.filter((x) => x.ok).length, 2);
  for (const x of rs) if (!x.ok) assert.equal(x.code, code);
  for (const x of rs) if (x.ok) x.hold.settle(0);
}

export function ledgerConformance(get: () => Harness): void {
  test('holds: with R left, 20 concurrent holds of R/2.5 admit exactly 2 (key budget, project budget, wallet)', async () => {
    const lim = get().limiter;
    const t1 = uid('tag');
    await twoOfTwenty([lim], t1, [keyBudget(uid('k'), { base: 0.7, limit: 1 })], 0.3, 'key_budget_exhausted');
    const t2 = uid('tag');
    const project = projectBudget(uid('p'), { base: 40, limit: 50 });
    await twoOfTwenty([lim], t2, [keyBudget(uid('k'), { base: 0, limit: 1000 }), project], 10, 'project_budget_exhausted');
    const t3 = uid('tag');
    await twoOfTwenty([lim], t3, [wallet(uid('u'), { base: 0.05 })], 0.05, 'insufficient_balance');
  });

  test('holds: all or nothing across holders; the first holder that does not fit names the code', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const project = projectBudget(uid('p'), { base: 0, limit: 0.5 });
    refused(await lim.hold(req(tag, [key, project], 0.6)), 'project_budget_exhausted');
    near(await live(lim, tag, key), 0, 'the key holds nothing after a refusal');
    const h = held(await lim.hold(req(tag, [key, project], 0.4)));
    refused(await lim.hold(req(tag, [key, project], 0.2)), 'project_budget_exhausted');
    const [k, p] = await lim.ledger({ tag, holders: [key, project] });
    near(k!.live, 0.4, 'key live spend');
    near(p!.live, 0.4, 'project live spend');
    h.settle(0);
  });

  test('holds: money is counted in exact units: ten holds of 0.1 fit a budget of 1, the eleventh does not', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const hs = [];
    for (let i = 0; i < 10; i++) hs.push(held(await lim.hold(req(tag, [key], 0.1))));
    refused(await lim.hold(req(tag, [key], 0.1)), 'key_budget_exhausted');
    for (const h of hs) h.settle(0.1);
    near(await live(lim, tag, key), 1, 'ten settlements of 0.1');
  });

  test('settle replaces the hold: a refund and a charge; settle is idempotent', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0.5, limit: 1 });
    const a = held(await lim.hold(req(tag, [key], 0.3)));
    near(await live(lim, tag, key), 0.8, 'spend with the hold in flight');
    a.settle(0.05);
    a.settle(0.05);
    near(await live(lim, tag, key), 0.55, 'the hold replaced by a smaller cost');
    const b = held(await lim.hold(req(tag, [key], 0.1)));
    b.settle(0.25);
    b.settle(0.25);
    near(await live(lim, tag, key), 0.8, 'the hold replaced by a larger cost');
    const c = held(await lim.hold(req(tag, [key], 0.2)));
    c.settle(0); // an upstream error before any output releases the hold
    near(await live(lim, tag, key), 0.8, 'a release costs nothing');

    const w = wallet(uid('u'), { base: 2 });
    const d = held(await lim.hold(req(tag, [w], 1.5)));
    near(await live(lim, tag, w), 0.5, 'balance with the hold in flight');
    d.settle(0.25);
    near(await live(lim, tag, w), 1.75, 'balance after settlement');
  });

  test('a budget spent by settled usage refuses the next hold at once, with the replica unchanged', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0.5, limit: 1 });
    held(await lim.hold(req(tag, [key], 0.01))).settle(0.5);
    refused(await lim.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
    // Exhausted: even a request whose cost is unknown (an unpriced model holds 0) is refused.
    refused(await lim.hold(req(tag, [key], 0)), 'key_budget_exhausted');
    const w = wallet(uid('u'), { base: 0.2 });
    held(await lim.hold(req(tag, [w], 0.1))).settle(0.3);
    refused(await lim.hold(req(tag, [w], 0)), 'insufficient_balance');
    near(await live(lim, tag, w), -0.1, 'a wallet may end below zero by the actual cost');
  });

  test('a new epoch restarts the ledger from the replica figure; holds in flight still count until they settle', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const id = uid('k');
    const old = held(await lim.hold(req(tag, [keyBudget(id, { base: 0.5, limit: 1 })], 0.3)));
    held(await lim.hold(req(tag, [keyBudget(id, { base: 0.5, limit: 1 })], 0.1))).settle(0.2);
    refused(await lim.hold(req(tag, [keyBudget(id, { base: 0.5, limit: 1 })], 0.1)), 'key_budget_exhausted');
    // The console reset the budget: spent 0 under epoch 1. The 0.3 still in flight counts.
    const reset = keyBudget(id, { base: 0, limit: 1, epoch: 1 });
    near(await live(lim, tag, reset), 0.3, 'the new figure and the hold in flight, before any hold of the new epoch');
    refused(await lim.hold(req(tag, [reset], 0.9)), 'key_budget_exhausted');
    const h = held(await lim.hold(req(tag, [reset], 0.6)));
    near(await live(lim, tag, reset), 0.9, 'the new epoch counts its own hold and the one in flight');
    // An instance whose replica still has epoch 0 sees the new ledger, not its stale figure.
    near(await live(lim, tag, keyBudget(id, { base: 0.5, limit: 1 })), 0.9, 'a stale epoch reads the current ledger');
    refused(await lim.hold(req(tag, [keyBudget(id, { base: 0.5, limit: 1 })], 0.2)), 'key_budget_exhausted');
    old.settle(0.25); // the old request's usage lands after the reset: it counts in the new period
    near(await live(lim, tag, reset), 0.85, 'its cost replaces its hold');
    h.settle(0);
    near(await live(lim, tag, reset), 0.25, 'the new figure and what settled since');

    const wid = uid('u');
    held(await lim.hold(req(tag, [wallet(wid, { base: 1 })], 0.1))).settle(1);
    refused(await lim.hold(req(tag, [wallet(wid, { base: 1 })], 0.1)), 'insufficient_balance');
    // A top-up: the console's balance is now 5 under epoch 3.
    held(await lim.hold(req(tag, [wallet(wid, { base: 5, epoch: 3 })], 4))).settle(4);
    near(await live(lim, tag, wallet(wid, { base: 5, epoch: 3 })), 1, 'balance after the top-up and a settlement');
  });

  test('a budget raised or a wallet topped up while a hold is in flight: never more held than the new figure allows', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const id = uid('k');
    const a = held(await lim.hold(req(tag, [keyBudget(id, { base: 0, limit: 10 })], 8)));
    refused(await lim.hold(req(tag, [keyBudget(id, { base: 0, limit: 10 })], 8)), 'key_budget_exhausted');
    const raised = keyBudget(id, { base: 0, limit: 12, epoch: 1 });
    refused(await lim.hold(req(tag, [raised], 8)), 'key_budget_exhausted');
    const b = held(await lim.hold(req(tag, [raised], 4)));
    a.settle(8);
    b.settle(4);
    near(await live(lim, tag, raised), 12, 'spent exactly the raised budget, not past it');

    const wid = uid('u');
    const c = held(await lim.hold(req(tag, [wallet(wid, { base: 10 })], 8)));
    const topped = wallet(wid, { base: 12, epoch: 1 });
    refused(await lim.hold(req(tag, [topped], 8)), 'insufficient_balance');
    const d = held(await lim.hold(req(tag, [topped], 4)));
    c.settle(8);
    d.settle(4);
    near(await live(lim, tag, topped), 0, 'the balance ends at 0, not below');
  });

  test('once the replica catches up with what was settled, nothing counts twice: max(base, base0 + settled)', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const id = uid('k');
    held(await lim.hold(req(tag, [keyBudget(id, { base: 0.5, limit: 1 })], 0.1))).settle(0.3);
    near(await live(lim, tag, keyBudget(id, { base: 0.5, limit: 1 })), 0.8, 'settled on top of base0');
    // The console priced that usage: its spent is now 0.8.
    near(await live(lim, tag, keyBudget(id, { base: 0.8, limit: 1 })), 0.8, 'caught up');
    // And more usage it saw from elsewhere.
    near(await live(lim, tag, keyBudget(id, { base: 0.9, limit: 1 })), 0.9, 'ahead');
    held(await lim.hold(req(tag, [keyBudget(id, { base: 0.8, limit: 1 })], 0.2))).settle(0);
    refused(await lim.hold(req(tag, [keyBudget(id, { base: 0.9, limit: 1 })], 0.2)), 'key_budget_exhausted');

    const wid = uid('u');
    held(await lim.hold(req(tag, [wallet(wid, { base: 1 })], 0.1))).settle(0.3);
    near(await live(lim, tag, wallet(wid, { base: 1 })), 0.7, 'wallet: settled off base0');
    near(await live(lim, tag, wallet(wid, { base: 0.7 })), 0.7, 'wallet caught up');
    near(await live(lim, tag, wallet(wid, { base: 0.6 })), 0.6, 'wallet: the console knows more');
  });

  test('no holders: held at once, nothing stored', async () => {
    const lim = get().limiter;
    const held0 = lim.stats().holdsHeld;
    const h = held(await lim.hold(req(uid('tag'), [], 5)));
    assert.equal(lim.stats().holdsHeld, held0);
    h.settle(5);
    assert.deepEqual(await lim.ledger({ tag: uid('tag'), holders: [] }), []);
  });

  test('one holder list under two tags keeps two ledgers (a memo of its keys follows the tag)', async () => {
    const lim = get().limiter;
    const holders = [wallet(uid('u'), { base: 1 })];
    const [a, b] = [uid('tag'), uid('tag')];
    held(await lim.hold(req(a, holders, 0.25))).settle(0.25);
    held(await lim.hold(req(b, holders, 0.5))).settle(0.5);
    near(await live(lim, a, holders[0]!), 0.75, 'the first tag: its own settlement only');
    near(await live(lim, b, holders[0]!), 0.5, 'the second tag: its own settlement only');
    held(await lim.hold(req(a, holders, 0.75))).settle(0.75);
    refused(await lim.hold(req(a, holders, 0)), 'insufficient_balance');
    held(await lim.hold(req(b, holders, 0.5))).settle(0);
  });

  test('a zero hold (unpriced model) is checked, stores nothing to refresh or settle, and a cost it settles to still counts', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const w = wallet(uid('u'), { base: 1 });
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const held0 = lim.stats().holdsHeld;
    const zero = held(await lim.hold(req(tag, [key, w], 0)));
    assert.equal(lim.stats().holdsHeld, held0, 'nothing held to keep alive');
    near(await live(lim, tag, w), 1, 'the balance is untouched while it is in flight');
    zero.settle(0.25);
    near(await live(lim, tag, w), 0.75, 'the cost it came to is counted on the wallet');
    near(await live(lim, tag, key), 0.25, 'and on the budget');
    zero.settle(0.5); // settle is idempotent
    near(await live(lim, tag, w), 0.75, 'settled once');
    held(await lim.hold(req(tag, [key, w], 0))).settle(0);
    near(await live(lim, tag, w), 0.75, 'a zero settlement changes nothing');
    held(await lim.hold(req(tag, [w], 0.75))).settle(0.75);
    refused(await lim.hold(req(tag, [w], 0)), 'insufficient_balance');
  });

  test('live holds are refreshed past their lease time', async () => {
    const h = get();
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const hold = held(await h.shortLease.hold(req(tag, [key], 0.8)));
    for (let i = 0; i < 4; i++) {
      await h.passTime(h.leaseMs / 2);
      await h.shortLease.refreshLeases();
    }
    refused(await h.limiter.hold(req(tag, [key], 0.5)), 'key_budget_exhausted');
    hold.settle(0);
    held(await h.limiter.hold(req(tag, [key], 0.5))).settle(0);
  });

  test("a crashed holder's hold expires after the lease time", async () => {
    const h = get();
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const peer = h.peer ? await h.peer({ shortLease: true }) : { limiter: h.shortLease, crash: async () => undefined };
    held(await peer.limiter.hold(req(tag, [key], 0.9)));
    await peer.crash(); // never settled, no longer refreshed
    refused(await h.limiter.hold(req(tag, [key], 0.5)), 'key_budget_exhausted');
    const start = performance.now();
    let waited = 0;
    for (;;) {
      const r = await h.limiter.hold(req(tag, [key], 0.5));
      if (r.ok) {
        r.hold.settle(0);
        break;
      }
      assert.ok(waited < h.leaseMs * 5, `the hold did not expire within ${h.leaseMs * 5} ms`);
      await h.passTime(50);
      waited += 50;
    }
    const elapsed = Math.max(waited, performance.now() - start);
    assert.ok(elapsed >= h.leaseMs - 100, `the hold expired after ${elapsed} ms, before the lease time`);
    near(await live(h.limiter, tag, key), 0, 'an expired hold costs nothing');
  });

  test('two instances sharing the store keep one ledger', async (t) => {
    const h = get();
    if (!h.peer) return t.skip('one process only');
    const peer = await h.peer({ shortLease: false });
    try {
      const tag = uid('tag');
      const w = wallet(uid('u'), { base: 0.5 });
      await twoOfTwenty([h.limiter, peer.limiter], tag, [w], 0.5, 'insufficient_balance');
      const key = keyBudget(uid('k'), { base: 0, limit: 1 });
      held(await h.limiter.hold(req(tag, [key], 0.1))).settle(0.6);
      await h.limiter.ledger({ tag, holders: [key] }); // after the settlement on this connection
      near(await live(peer.limiter, tag, key), 0.6, 'the peer sees the settlement');
      refused(await peer.limiter.hold(req(tag, [key], 0.5)), 'key_budget_exhausted');
      held(await peer.limiter.hold(req(tag, [key], 0.4))).settle(0);
    } finally {
      await peer.limiter.close();
      await peer.crash();
    }
  });
}

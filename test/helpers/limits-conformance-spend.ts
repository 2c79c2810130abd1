/**
 * Conformance, part four: spend holds under busy traffic on two instances (DESIGN section 6,
 * "Money"), where an implementation may lease spend slices (the Redis limiter with `lease`:
 * src/limits/redis/spend-slices.ts). Every implementation must give the same answers as
 * one exact hold per request: exactly 2 of 20 near exhaustion, never more held than R,
 * a dead instance's share back by expiry, a new epoch and a budget spent by settled usage
 * refusing the next hold. With one process only, both "instances" are the same limiter.
 * Registered inside runLimiterConformance's suite; every test uses its own tag.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { test } from 'node:test';
import { SPEND_SLICE_CHECK_MS, SPEND_SLICE_MAX_MS } from '../../src/limits/redis/spend-slices.js';
import type { Holder } from '../../src/policy/holders.js';
import { held, keyBudget, live, near, projectBudget, refused, req, twoOfTwenty, wallet } from './limits-conformance-ledger.js';
import { busy, busyBudget, seeded, slicesOnBoth, two, within } from './limits-conformance-two.js';
import { type Harness, uid } from './redis-limits-conformance.js';

export function spendSliceConformance(get: () => Harness): void {
  test('spend: after busy traffic on two instances, with R left 20 concurrent holds of R/2.5 admit exactly 2', async () => {
    const h = get();
    const t = await two(h);
    try {
      const tag = uid('tag');
      const holders = [keyBudget(uid('k'), { base: 0, limit: 100 }), projectBudget(uid('p'), { base: 0, limit: 1000 })];
      let spent = await busy([t.a, t.b], tag, holders, 40, 0.01);
      // Most of the key's budget in one exact hold, then busy again: slices of what is left.
      held(await t.a.hold(req(tag, holders, 94.6))).settle(94.6);
      spent += 94.6 + (await busy([t.a, t.b], tag, holders, 20, 0.01));
      slicesOnBoth(h, t);
      // Nothing in flight: R is what settled usage has not spent.
      await twoOfTwenty([t.a, t.b], tag, holders, 100 - spent, 'key_budget_exhausted');
    } finally {
      await t.close();
    }
  });

  test("spend: random concurrent holds and settlements on two instances never hold more than R; the store's held + settled stays within R at every step", async () => {
    const h = get();
    const t = await two(h);
    const rand = seeded(20261126);
    try {
      const tag = uid('tag');
      const R = 2;
      const key = keyBudget(uid('k'), { base: 0, limit: R });
      const holders = [key, projectBudget(uid('p'), { base: 0, limit: 100 })];
      const inFlight: { settle(actual: number): void; amount: number }[] = [];
      // Usage past a hold's estimate adds to what the budget carries: the bound grows by it.
      const totals = { settled: 0, over: 0, admitted: 0, refusals: 0, slices: 0 };
      const check = async (when: string): Promise<void> => {
        const bound = R + totals.over + 1e-6;
        const holding = inFlight.reduce((s, x) => s + x.amount, 0);
        assert.ok(holding + totals.settled <= bound, `${when}: ${holding} held + ${totals.settled} settled > ${bound}`);
        const record = await live(t.observer, tag, key);
        assert.ok(record <= bound, `${when}: the store records ${record} held and settled > ${bound}`);
      };
      const amount = (): number => {
        const x = rand();
        return x < 0.7 ? 0.001 + rand() * 0.009 : x < 0.95 ? 0.01 + rand() * 0.09 : 0.1 + rand() * 0.2;
      };
      for (let step = 0; step < 60; step++) {
        const amounts = Array.from({ length: 1 + Math.floor(rand() * 8) }, amount);
        const rs = await Promise.all(amounts.map((x) => (rand() < 0.5 ? t.a : t.b).hold(req(tag, holders, x))));
        rs.forEach((r, i) => {
          if (r.ok) {
            totals.admitted++;
            inFlight.push({ settle: (c) => r.hold.settle(c), amount: amounts[i]! });
          } else {
            totals.refusals++;
            assert.equal(r.code, 'key_budget_exhausted');
          }
        });
        totals.slices = Math.max(totals.slices, (t.a.spendSlicesHeld?.() ?? 0) + (t.b.spendSlicesHeld?.() ?? 0));
        await check(`step ${step}, after the holds`);
        for (let i = inFlight.length - 1; i >= 0; i--) {
          if (rand() < 0.5) continue;
          const x = inFlight.splice(i, 1)[0]!;
          const cost = rand() < 0.1 ? x.amount * 1.5 : x.amount * rand();
          totals.over += Math.max(0, cost - x.amount);
          totals.settled += cost;
          x.settle(cost);
        }
        await check(`step ${step}, after the settlements`);
      }
      for (const x of inFlight.splice(0)) x.settle(0);
      assert.ok(totals.admitted > 100, `${totals.admitted} holds admitted`);
      assert.ok(totals.refusals > 0, 'the budget ran out during the run');
      if (h.spendSlices) assert.ok(totals.slices > 0, 'holds were taken from slices while far from exhaustion');
    } finally {
      await t.close();
    }
  });

  test("spend: a dead instance's share of a budget comes back by expiry", async () => {
    const h = get();
    const peer = h.peer ? await h.peer({ shortLease: true }) : { limiter: h.shortLease, crash: async () => undefined };
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 10 });
    const start = performance.now();
    const spent = await busy([peer.limiter], tag, [key], 20, 0.01);
    held(await peer.limiter.hold(req(tag, [key], 0.01))); // never settled
    if (h.spendSlices) assert.ok(peer.limiter.spendSlicesHeld!() > 0, 'the instance holds a spend slice');
    // Its settlements have landed (a call sends the batch first); then it dies: no give-back,
    // no more refreshes.
    await peer.limiter.ledger({ tag, holders: [key] });
    await peer.crash();
    assert.ok((await live(h.limiter, tag, key)) >= spent + 0.01 - 1e-9, 'its hold and slice still count');
    let waited = 0;
    while (Math.abs((await live(h.limiter, tag, key)) - spent) > 1e-9) {
      assert.ok(waited < h.leaseMs * 5, `the dead instance's share did not come back within ${h.leaseMs * 5} ms`);
      await h.passTime(50);
      waited += 50;
    }
    const elapsed = Math.max(waited, performance.now() - start);
    assert.ok(elapsed >= h.leaseMs - 50, `it came back after ${elapsed} ms, before the lease time`);
    // The budget is whole again: all of what is left fits one hold.
    held(await h.limiter.hold(req(tag, [key], 10 - spent))).settle(0);
  });

  test('spend: a new epoch refuses the next hold at once on both instances; one whose replica lags stops within a second', async () => {
    const h = get();
    const t = await two(h);
    try {
      const tag = uid('tag');
      const id = uid('k');
      const at = (epoch: number, base: number): Holder => keyBudget(id, { base, limit: 10, epoch });
      await busy([t.a, t.b], tag, [at(0, 0)], 40, 0.01);
      slicesOnBoth(h, t);
      // The console says the budget is spent, under epoch 1.
      refused(await t.a.hold(req(tag, [at(1, 10)], 0.01)), 'key_budget_exhausted');
      refused(await t.b.hold(req(tag, [at(1, 10)], 0.01)), 'key_budget_exhausted');
      // A reset (epoch 2): both hold again, and lease again once the window after their
      // refusal is over (a refused instance asks for no slice meanwhile).
      await h.passTime(SPEND_SLICE_MAX_MS);
      await busy([t.a, t.b], tag, [at(2, 0)], 40, 0.01);
      slicesOnBoth(h, t);
      // Spent again under epoch 3, which only a's replica has seen yet.
      refused(await t.a.hold(req(tag, [at(3, 10)], 0.01)), 'key_budget_exhausted');
      await h.passTime(SPEND_SLICE_MAX_MS + 50);
      refused(await t.b.hold(req(tag, [at(2, 0)], 0.01)), 'key_budget_exhausted');
    } finally {
      await t.close();
    }
  });

  test('spend: usage settled at its holds spends a budget or balance to the last unit across two instances; then both refuse at once', async () => {
    const h = get();
    const t = await two(h);
    try {
      const cases: [Holder[], string][] = [
        [[keyBudget(uid('k'), { base: 0, limit: 1 }), projectBudget(uid('p'), { base: 0, limit: 50 })], 'key_budget_exhausted'],
        [[wallet(uid('u'), { base: 1 })], 'insufficient_balance'],
      ];
      for (const [holders, code] of cases) {
        const tag = uid('tag');
        let admitted = (await busy([t.a, t.b], tag, holders, 20, 0.01)) / 0.01;
        // Until both instances refuse in a row: an instance's slice may still hold some after the other's refusal.
        const lastRefused = [false, false];
        for (let i = 0; !(lastRefused[0] && lastRefused[1]); i++) {
          assert.ok(i < 1000, 'the budget never ran out');
          const r = await (i % 2 ? t.b : t.a).hold(req(tag, holders, 0.01));
          lastRefused[i % 2] = !r.ok;
          if (r.ok) {
            admitted++;
            r.hold.settle(0.01);
          } else assert.equal(r.code, code);
        }
        assert.equal(Math.round(admitted), 100, 'exactly what the budget had: 100 holds of 0.01');
        near(await live(t.observer, tag, holders[0]!), holders[0]!.kind === 'wallet' ? 0 : 1, 'spent to the last unit');
        // Spent: even a hold of nothing (an unpriced model) is refused, on both instances.
        refused(await t.a.hold(req(tag, holders, 0)), code);
        refused(await t.b.hold(req(tag, holders, 0)), code);
      }
    } finally {
      await t.close();
    }
  });

  test('spend: usage past its hold that spends the budget: that instance refuses at once; another stops at its next settlement, and within a second anyway', async () => {
    const h = get();
    const t = await two(h);
    try {
      // The usage past its hold: a small hold (taken from a slice where there is one), or a
      // hold larger than any slice (exact) that settles after its instance leased a new slice.
      for (const [settlesMeanwhile, estimate] of [[true, 0.01], [false, 1]] as const) {
        const tag = uid('tag');
        const key = keyBudget(uid('k'), { base: 0, limit: 10 });
        const over = held(await t.a.hold(req(tag, [key], estimate)));
        await busy([t.a, t.b], tag, [key], 40, 0.01);
        slicesOnBoth(h, t);
        const onB = held(await t.b.hold(req(tag, [key], 0.01)));
        over.settle(10); // the usage came to the whole budget
        refused(await t.a.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
        if (settlesMeanwhile) {
          onB.settle(0.01);
          await t.b.ledger({ tag, holders: [key] }); // b's settlement has left and been answered
        } else await h.passTime(SPEND_SLICE_MAX_MS + 50);
        refused(await t.b.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
        onB.settle(0.01);
      }
    } finally {
      await t.close();
    }
  });

  test('spend: usage past its hold that spends the budget: another instance refuses as soon as the news reaches it, holds of 0 too', async () => {
    const h = get();
    const t = await two(h);
    try {
      const { tag, key, over } = await busyBudget(h, t, 0.01);
      const heard = t.bNews ? within(once(t.bNews, 'news'), 5_000, 'b heard no news of the over-committed ledger') : null;
      over.settle(10); // the usage came to the whole budget
      // a's next call sends its queued settlement first: it refuses at once, as before
      refused(await t.a.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
      await heard;
      // b neither settled anything nor waited out its slice's time
      refused(await t.b.hold(req(tag, [key], 0.01)), 'key_budget_exhausted');
      refused(await t.b.hold(req(tag, [key], 0)), 'key_budget_exhausted');
    } finally {
      await t.close();
    }
  });

  test('spend: usage past its hold that spends the budget stops holds of 0 (an unpriced model) on another instance: by the news, or once it has asked about its slice', async () => {
    const h = get();
    const t = await two(h);
    try {
      const { tag, key, over } = await busyBudget(h, t, 0);
      over.settle(10); // the usage came to the whole budget
      refused(await t.a.hold(req(tag, [key], 0)), 'key_budget_exhausted');
      // b's settlements carry nothing: one of them asks Redis about its slice once the last answer is old enough.
      await h.passTime(SPEND_SLICE_CHECK_MS + 10);
      const onB = await t.b.hold(req(tag, [key], 0));
      // With slices b may still take this one from its own, if the news has not reached it (pub/sub
      // is at most once: its own settlement's answer is the path that remains); without, it is exact.
      if (h.spendSlices && onB.ok) onB.hold.settle(0);
      else refused(onB, 'key_budget_exhausted');
      await t.b.ledger({ tag, holders: [key] }); // that settlement has left and been answered
      refused(await t.b.hold(req(tag, [key], 0)), 'key_budget_exhausted');
    } finally {
      await t.close();
    }
  });
}


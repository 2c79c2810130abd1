/**
 * Conformance, part six: a lease term changed while the limiter runs (`limits.leaseMs` on
 * a reload, DESIGN section 12). A slot or hold taken under a long term, and one taken after
 * the term is shortened, both come back within the short term once their instance stops
 * refreshing: the new term reaches the store with the next grant and the next refresh.
 * Registered inside runLimiterConformance's suite; every test uses its own key or tag.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { held, keyBudget, req } from './limits-conformance-ledger.js';
import { type Harness, type TestLimiter, input, leaseOf, uid } from './redis-limits-conformance.js';

/** The term the tests start from: far longer than any of them waits. */
const LONG = 100;

/**
 * Another instance, started on the long term where there are instances (so that a term
 * that never changed fails the tests), or, in process, the limiter itself, whose time only
 * moves when a test moves it; the tests put the long term in force either way.
 */
async function longPeer(h: Harness): Promise<{ limiter: TestLimiter; crash(): Promise<void> }> {
  const peer = h.peer ? await h.peer({ shortLease: false }) : { limiter: h.shortLease, crash: async () => undefined };
  peer.limiter.setLeaseMs(h.leaseMs * LONG);
  return peer;
}

/** Asks `fits` every 50 ms (of the harness' time) until it is true; the ms waited. */
async function waitFor(h: Harness, what: string, fits: () => Promise<boolean>): Promise<number> {
  const start = performance.now();
  let waited = 0;
  while (!(await fits())) {
    assert.ok(waited < h.leaseMs * 5, `${what} did not come back within ${h.leaseMs * 5} ms`);
    await h.passTime(50);
    waited += 50;
  }
  return Math.max(waited, performance.now() - start);
}

export function leaseTermConformance(get: () => Harness): void {
  test('lease term: slots taken before and after it is shortened come back within the short term', async () => {
    const h = get();
    const key = uid('k');
    const limits = { concurrency: 2 };
    const peer = await longPeer(h);
    leaseOf(await peer.limiter.admit(input(key, { limits })));
    peer.limiter.setLeaseMs(h.leaseMs);
    leaseOf(await peer.limiter.admit(input(key, { limits })));
    await peer.limiter.refreshLeases();
    await peer.crash(); // never finished, no longer refreshed
    const lim = h.limiter;
    const elapsed = await waitFor(h, 'both slots', async () => {
      const rs = await Promise.all([lim.admit(input(key, { limits })), lim.admit(input(key, { limits }))]);
      for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
      return rs.every((r) => r.ok);
    });
    assert.ok(elapsed >= h.leaseMs - 100, `slots came back after ${elapsed} ms, before the short term`);
  });

  test('lease term: a hold taken under a long term comes back within the short term after its next refresh', async () => {
    const h = get();
    const tag = uid('tag');
    const key = keyBudget(uid('k'), { base: 0, limit: 1 });
    const peer = await longPeer(h);
    held(await peer.limiter.hold(req(tag, [key], 0.9)));
    peer.limiter.setLeaseMs(h.leaseMs);
    await peer.limiter.refreshLeases();
    await peer.crash(); // never settled, no longer refreshed
    await waitFor(h, 'the hold', async () => {
      const r = await h.limiter.hold(req(tag, [key], 0.5));
      if (r.ok) r.hold.settle(0);
      return r.ok;
    });
  });
}

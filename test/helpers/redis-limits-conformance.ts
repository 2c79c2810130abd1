/**
 * The Limiter conformance suite: the same tests against the in-process limiter (fake clock),
 * a single Redis and a Redis Cluster. Per-model limits and quota figures are in
 * limits-conformance-quota.ts, spend holds in limits-conformance-ledger.ts, spend holds on
 * two instances with busy traffic (spend slices, where an implementation leases them) in
 * limits-conformance-spend.ts, refusals and shadow limits in limits-conformance-shadow.ts,
 * claims in limits-conformance-claims.ts, a lease term changed while running in
 * limits-conformance-term.ts; all run here. Each test uses its own key ids and
 * route names, so the implementations never see each other's state.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import { after, before, describe, test } from 'node:test';
import type { AdmitInput, AdmitResult, KeyLimits, Lease, Limiter, RouteCapacity } from '../../src/limits/limiter.js';
import { claimConformance } from './limits-conformance-claims.js';
import { ledgerConformance } from './limits-conformance-ledger.js';
import { spendSliceConformance } from './limits-conformance-spend.js';
import { quotaConformance } from './limits-conformance-quota.js';
import { shadowConformance } from './limits-conformance-shadow.js';
import { leaseTermConformance } from './limits-conformance-term.js';

/** `spendSlicesHeld`: where the limiter leases spend slices (the Redis limiter with `lease`). */
export type TestLimiter = Limiter & { refreshLeases(): Promise<void>; spendSlicesHeld?(): number };

export interface Harness {
  /** Leases long enough that no test outlives them, however loaded the machine. */
  limiter: TestLimiter;
  /** Same state as `limiter`, but its leases and holds last only `leaseMs`: for the expiry tests. */
  shortLease: TestLimiter;
  leaseMs: number;
  /** Whether the limiters lease spend slices (then the spend tests also check that they did). */
  spendSlices?: boolean;
  /** Memory: moves the fake clock. Redis: really waits (Redis TIME cannot be faked), so keep it short. */
  passTime(ms: number): Promise<void>;
  /**
   * Another instance sharing the same state, with its own connection (Redis only); `news`
   * emits 'news' once news of an over-committed ledger has ended its slice (spend slices only).
   */
  peer?(opts: { shortLease: boolean }): Promise<{ limiter: TestLimiter; news?: EventEmitter; crash(): Promise<void> }>;
  close(): Promise<void>;
}

const NO_ROUTE: RouteCapacity = { name: 'unlimited', concurrency: 0, rpm: 0 };
const NO_LIMITS: KeyLimits = { rpm: null, tpm: null, concurrency: null };

let seq = 0;
export const uid = (what: string): string => `${what}-${++seq}-${randomBytes(3).toString('hex')}`;

export function input(keyId: string, o: { limits?: Partial<KeyLimits>; tokens?: number; route?: RouteCapacity } = {}): AdmitInput {
  return {
    keyId,
    limits: { ...NO_LIMITS, ...o.limits },
    tokens: o.tokens ?? 0,
    route: o.route ?? NO_ROUTE,
  };
}

export function leaseOf(r: AdmitResult): Lease {
  assert.ok(r.ok, `expected admission, got ${JSON.stringify(r)}`);
  return r.lease;
}

export function denied(r: AdmitResult, code: string): number {
  assert.equal(r.ok, false, `expected ${code}, got an admission`);
  if (r.ok) return 0;
  assert.equal(r.code, code);
  assert.ok(r.retryAfterMs > 0, `retryAfterMs ${r.retryAfterMs} must be positive`);
  return r.retryAfterMs;
}

const okCount = (rs: AdmitResult[]): number => rs.filter((r) => r.ok).length;
const finishAll = (rs: AdmitResult[], tokens: number | null = null): void => {
  for (const r of rs) if (r.ok) r.lease.finish({ tokens });
};

export function runLimiterConformance(name: string, setup: () => Promise<Harness>): void {
  describe(`Limiter conformance: ${name}`, { timeout: 120_000 }, () => {
    let h: Harness;
    let lim: TestLimiter;
    before(async () => {
      h = await setup();
      lim = h.limiter;
    });
    after(async () => h?.close());

    test('RPM: N+1 requests at once admit exactly N; retry-after is when a token is back', async () => {
      const key = uid('k');
      const rs = await Promise.all(Array.from({ length: 6 }, () => lim.admit(input(key, { limits: { rpm: 5 } }))));
      assert.equal(okCount(rs), 5);
      const wait = denied(rs.find((r) => !r.ok)!, 'rpm_exceeded');
      assert.ok(wait > 11_000 && wait <= 12_000, `one token per 12 s, got ${wait}`);
      finishAll(rs);
    });

    test('TPM: N+1 reservations at once admit exactly N', async () => {
      const key = uid('k');
      const rs = await Promise.all(Array.from({ length: 11 }, () => lim.admit(input(key, { limits: { tpm: 1000 }, tokens: 100 }))));
      assert.equal(okCount(rs), 10);
      const wait = denied(rs.find((r) => !r.ok)!, 'tpm_exceeded');
      assert.ok(wait > 5_000 && wait <= 6_000, `100 tokens at 1000/min is 6 s, got ${wait}`);
      finishAll(rs);
    });

    test('TPM: a full bucket admits one oversized request, then waits for the debt', async () => {
      const key = uid('k');
      const limits = { tpm: 1000 };
      leaseOf(await lim.admit(input(key, { limits, tokens: 5000 }))).finish({ tokens: null });
      const wait = denied(await lim.admit(input(key, { limits, tokens: 1 })), 'tpm_exceeded');
      // From -4000 to +1 at 1000 per minute.
      assert.ok(wait > 239_000 && wait <= 240_060, `got ${wait}`);
    });

    test('TPM refills continuously; retryAfterMs is enough', async () => {
      const key = uid('k');
      const limits = { tpm: 60_000 }; // one token per ms
      leaseOf(await lim.admit(input(key, { limits, tokens: 60_000 }))).finish({ tokens: null });
      const wait = denied(await lim.admit(input(key, { limits, tokens: 200 })), 'tpm_exceeded');
      assert.ok(wait <= 200, `got ${wait}`);
      await h.passTime(wait + 20);
      leaseOf(await lim.admit(input(key, { limits, tokens: 200 }))).finish({ tokens: null });
    });

    test('settle: fewer tokens than reserved refunds the difference', async () => {
      const key = uid('k');
      const limits = { tpm: 1000 };
      leaseOf(await lim.admit(input(key, { limits, tokens: 600 }))).finish({ tokens: 100 });
      leaseOf(await lim.admit(input(key, { limits, tokens: 880 }))).finish({ tokens: null });
      denied(await lim.admit(input(key, { limits, tokens: 100 })), 'tpm_exceeded');
    });

    test('settle: more tokens than reserved charges the difference; null keeps the reservation', async () => {
      const charged = uid('k');
      const limits = { tpm: 1000 };
      leaseOf(await lim.admit(input(charged, { limits, tokens: 100 }))).finish({ tokens: 600 });
      denied(await lim.admit(input(charged, { limits, tokens: 450 })), 'tpm_exceeded');
      leaseOf(await lim.admit(input(charged, { limits, tokens: 390 }))).finish({ tokens: null });

      const kept = uid('k');
      leaseOf(await lim.admit(input(kept, { limits, tokens: 600 }))).finish({ tokens: null });
      denied(await lim.admit(input(kept, { limits, tokens: 450 })), 'tpm_exceeded');
      leaseOf(await lim.admit(input(kept, { limits, tokens: 390 }))).finish({ tokens: null });
    });

    test('finish is idempotent: a second finish neither refunds nor frees again', async () => {
      const key = uid('k');
      const limits = { tpm: 1000, concurrency: 1 };
      const first = leaseOf(await lim.admit(input(key, { limits, tokens: 500 })));
      first.finish({ tokens: 0 }); // the whole reservation comes back: bucket full again
      const second = leaseOf(await lim.admit(input(key, { limits, tokens: 300 })));
      const third = leaseOf(await lim.admit(input(key, { limits: { tpm: 1000 }, tokens: 400 })));
      first.finish({ tokens: 0 });
      first.finish({ tokens: 0 });
      // 1000 - 300 - 400 = 300 left; a double refund would have made it 800.
      denied(await lim.admit(input(key, { limits: { tpm: 1000 }, tokens: 500 })), 'tpm_exceeded');
      denied(await lim.admit(input(key, { limits })), 'concurrency_exceeded');
      second.finish({ tokens: null });
      third.finish({ tokens: null });
    });

    test('cancel undoes an admission whole: its RPM token, its TPM reservation and its slot come back, once', async () => {
      const key = uid('k');
      const limits = { rpm: 2, tpm: 1000, concurrency: 1 };
      const first = leaseOf(await lim.admit(input(key, { limits, tokens: 600 })));
      first.cancel();
      first.cancel();
      first.finish({ tokens: 5000 }); // after cancel, nothing more happens
      // Both RPM tokens, the whole TPM bucket and the one slot are there again.
      const second = leaseOf(await lim.admit(input(key, { limits, tokens: 1000 })));
      second.finish({ tokens: 0 });
      const third = leaseOf(await lim.admit(input(key, { limits, tokens: 1000 })));
      third.finish({ tokens: null });
      denied(await lim.admit(input(key, { limits: { rpm: 2 } })), 'rpm_exceeded');
    });

    test('concurrency: 500 concurrent admits with concurrency 20 admit exactly 20; finishing frees them', async () => {
      const key = uid('k');
      const limits = { concurrency: 20 };
      const held = lim.stats().slotsHeld;
      const rs = await Promise.all(Array.from({ length: 500 }, () => lim.admit(input(key, { limits }))));
      assert.equal(okCount(rs), 20);
      assert.equal(lim.stats().slotsHeld, held + 20);
      const wait = denied(rs.find((r) => !r.ok)!, 'concurrency_exceeded');
      assert.ok(wait <= 1_000, `concurrency retry-after is at most 1 s, got ${wait}`);
      finishAll(rs);
      finishAll(rs); // idempotent
      assert.equal(lim.stats().slotsHeld, held);
      const again = await Promise.all(Array.from({ length: 25 }, () => lim.admit(input(key, { limits }))));
      assert.equal(okCount(again), 20);
      finishAll(again);
    });

    test('concurrency: live leases are refreshed past their lease time', async () => {
      const key = uid('k');
      const limits = { concurrency: 1 };
      const lease = leaseOf(await h.shortLease.admit(input(key, { limits })));
      for (let i = 0; i < 4; i++) {
        await h.passTime(h.leaseMs / 2);
        await h.shortLease.refreshLeases();
      }
      denied(await lim.admit(input(key, { limits })), 'concurrency_exceeded');
      lease.finish({ tokens: null });
      leaseOf(await lim.admit(input(key, { limits }))).finish({ tokens: null });
    });

    test("concurrency: an instance that stops refreshing loses its slots after the lease time", async () => {
      const key = uid('k');
      const limits = { concurrency: 2 };
      const peer = h.peer ? await h.peer({ shortLease: true }) : { limiter: h.shortLease, crash: async () => undefined };
      leaseOf(await peer.limiter.admit(input(key, { limits })));
      leaseOf(await peer.limiter.admit(input(key, { limits })));
      await peer.crash(); // never finished, no longer refreshed
      denied(await lim.admit(input(key, { limits })), 'concurrency_exceeded');
      const start = performance.now();
      let waited = 0;
      for (;;) {
        const r = await lim.admit(input(key, { limits }));
        if (r.ok) {
          r.lease.finish({ tokens: null });
          break;
        }
        assert.ok(waited < h.leaseMs * 5, `slots did not come back within ${h.leaseMs * 5} ms`);
        await h.passTime(50);
        waited += 50;
      }
      const elapsed = Math.max(waited, performance.now() - start);
      assert.ok(elapsed >= h.leaseMs - 100, `slots came back after ${elapsed} ms, before the lease time`);
    });

    test('route capacity: concurrency and RPM are shared across keys', async () => {
      const conc: RouteCapacity = { name: uid('route'), concurrency: 3, rpm: 0 };
      const [a, b] = [uid('k'), uid('k')];
      const held = [
        leaseOf(await lim.admit(input(a, { route: conc }))),
        leaseOf(await lim.admit(input(a, { route: conc }))),
        leaseOf(await lim.admit(input(b, { route: conc }))),
      ];
      denied(await lim.admit(input(a, { route: conc })), 'route_capacity_exceeded');
      denied(await lim.admit(input(b, { route: conc })), 'route_capacity_exceeded');
      held[0]!.finish({ tokens: null });
      held[0] = leaseOf(await lim.admit(input(b, { route: conc })));
      for (const l of held) l.finish({ tokens: null });

      const rpm: RouteCapacity = { name: uid('route'), concurrency: 0, rpm: 4 };
      const rs = await Promise.all([a, a, b, b, b].map((k) => lim.admit(input(k, { route: rpm }))));
      assert.equal(okCount(rs), 4);
      const wait = denied(rs.find((r) => !r.ok)!, 'route_capacity_exceeded');
      assert.ok(wait > 14_000 && wait <= 15_000, `got ${wait}`);
      finishAll(rs);
    });

    test('checks run in order: route, RPM, TPM, concurrency; the first failure names the code', async () => {
      const key = uid('k');
      const route: RouteCapacity = { name: uid('route'), concurrency: 1, rpm: 0 };
      const limits = { rpm: 1, tpm: 10, concurrency: 1 };
      const lease = leaseOf(await lim.admit(input(key, { limits, tokens: 10, route })));
      // Everything is exhausted now; the route is named first.
      denied(await lim.admit(input(key, { limits, tokens: 10, route })), 'route_capacity_exceeded');
      denied(await lim.admit(input(key, { limits, tokens: 10 })), 'rpm_exceeded');
      denied(await lim.admit(input(key, { limits: { tpm: 10, concurrency: 1 }, tokens: 10 })), 'tpm_exceeded');
      denied(await lim.admit(input(key, { limits: { concurrency: 1 } })), 'concurrency_exceeded');
      lease.finish({ tokens: null });
    });

    test('nothing is consumed on denial: RPM, TPM and concurrency denials', async () => {
      const a = uid('k'); // an RPM denial keeps the TPM reservation untouched
      leaseOf(await lim.admit(input(a, { limits: { rpm: 2, tpm: 300 }, tokens: 100 }))).finish({ tokens: null });
      leaseOf(await lim.admit(input(a, { limits: { rpm: 2, tpm: 300 }, tokens: 100 }))).finish({ tokens: null });
      denied(await lim.admit(input(a, { limits: { rpm: 2, tpm: 300 }, tokens: 100 })), 'rpm_exceeded');
      leaseOf(await lim.admit(input(a, { limits: { tpm: 300 }, tokens: 100 }))).finish({ tokens: null });
      denied(await lim.admit(input(a, { limits: { tpm: 300 }, tokens: 100 })), 'tpm_exceeded');

      const b = uid('k'); // a TPM denial keeps the RPM token
      leaseOf(await lim.admit(input(b, { limits: { rpm: 2, tpm: 100 }, tokens: 100 }))).finish({ tokens: null });
      denied(await lim.admit(input(b, { limits: { rpm: 2, tpm: 100 }, tokens: 50 })), 'tpm_exceeded');
      denied(await lim.admit(input(b, { limits: { rpm: 2, tpm: 100 }, tokens: 50 })), 'tpm_exceeded');
      leaseOf(await lim.admit(input(b, { limits: { rpm: 2 } }))).finish({ tokens: null });
      denied(await lim.admit(input(b, { limits: { rpm: 2 } })), 'rpm_exceeded');

      const c = uid('k'); // a concurrency denial keeps both
      const limits = { rpm: 3, tpm: 300, concurrency: 1 };
      const held = leaseOf(await lim.admit(input(c, { limits, tokens: 100 })));
      for (let i = 0; i < 3; i++) denied(await lim.admit(input(c, { limits, tokens: 100 })), 'concurrency_exceeded');
      held.finish({ tokens: null });
      leaseOf(await lim.admit(input(c, { limits, tokens: 100 }))).finish({ tokens: null });
      leaseOf(await lim.admit(input(c, { limits, tokens: 100 }))).finish({ tokens: null });
      denied(await lim.admit(input(c, { limits, tokens: 100 })), 'rpm_exceeded');
    });

    test('nothing is consumed on denial: route and key never charge each other', async () => {
      const route: RouteCapacity = { name: uid('route'), concurrency: 1, rpm: 0 };
      const [a, b] = [uid('k'), uid('k')];
      const limits = { rpm: 1, tpm: 100, concurrency: 1 };
      const holder = leaseOf(await lim.admit(input(a, { route })));
      for (let i = 0; i < 3; i++) denied(await lim.admit(input(b, { limits, tokens: 100, route })), 'route_capacity_exceeded');
      holder.finish({ tokens: null });
      // b's RPM token, TPM and slot are all still there.
      leaseOf(await lim.admit(input(b, { limits, tokens: 100, route }))).finish({ tokens: null });

      const route2: RouteCapacity = { name: uid('route'), concurrency: 2, rpm: 2 };
      const [c, d] = [uid('k'), uid('k')];
      const c1 = leaseOf(await lim.admit(input(c, { limits: { rpm: 1 }, route: route2 })));
      for (let i = 0; i < 3; i++) denied(await lim.admit(input(c, { limits: { rpm: 1 }, route: route2 })), 'rpm_exceeded');
      // The route still has one RPM token and one slot left for another key.
      const d1 = leaseOf(await lim.admit(input(d, { route: route2 })));
      denied(await lim.admit(input(d, { route: route2 })), 'route_capacity_exceeded');
      c1.finish({ tokens: null });
      d1.finish({ tokens: null });
    });

    test('no limits at all: admitted, holds nothing', async () => {
      const held = lim.stats().slotsHeld;
      const rs = await Promise.all(Array.from({ length: 50 }, () => lim.admit(input(uid('k')))));
      assert.equal(okCount(rs), 50);
      assert.equal(lim.stats().slotsHeld, held);
      finishAll(rs, 10);
    });

    test('several instances sharing the store enforce one limit', async (t) => {
      if (!h.peer) return t.skip('one process only');
      const peer = await h.peer({ shortLease: false });
      try {
        const key = uid('k');
        const rpm = await Promise.all(
          Array.from({ length: 10 }, (_, i) => (i % 2 ? lim : peer.limiter).admit(input(key, { limits: { rpm: 5 } }))),
        );
        assert.equal(okCount(rpm), 5);
        const ckey = uid('k');
        const conc = await Promise.all(
          Array.from({ length: 60 }, (_, i) => (i % 2 ? lim : peer.limiter).admit(input(ckey, { limits: { concurrency: 7 } }))),
        );
        assert.equal(okCount(conc), 7);
        finishAll(conc);
        finishAll(rpm);
      } finally {
        await peer.limiter.close();
        await peer.crash();
      }
    });

    quotaConformance(() => h);
    ledgerConformance(() => h);
    shadowConformance(() => h);
    claimConformance(() => h);
    spendSliceConformance(() => h);
    leaseTermConformance(() => h);
  });
}

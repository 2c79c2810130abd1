/**
 * Two instances on one store for the spend conformance tests (limits-conformance-spend.ts):
 * how they are made, the busy traffic that leases slices, and small helpers of those tests.
 */
import assert from 'node:assert/strict';
import type { EventEmitter } from 'node:events';
import type { Holder } from '../../src/policy/holders.js';
import { held, keyBudget, req } from './limits-conformance-ledger.js';
import { type Harness, type TestLimiter, uid } from './redis-limits-conformance.js';

export interface Two {
  a: TestLimiter;
  b: TestLimiter;
  /** b's news of over-committed ledgers, where it leases spend slices */
  bNews: EventEmitter | null;
  /** reads the store's record; holds nothing on the tests' tags, so it leases nothing there */
  observer: TestLimiter;
  close(): Promise<void>;
}

/** Two fresh instances on the shared store (their slice counts are this test's alone), or the one limiter twice. */
export async function two(h: Harness): Promise<Two> {
  if (!h.peer) return { a: h.limiter, b: h.limiter, bNews: null, observer: h.limiter, close: async () => undefined };
  const peers = await Promise.all([h.peer({ shortLease: false }), h.peer({ shortLease: false })]);
  return {
    a: peers[0]!.limiter,
    b: peers[1]!.limiter,
    bNews: h.spendSlices ? (peers[1]!.news ?? null) : null,
    observer: h.limiter,
    async close() {
      for (const p of peers) {
        await p.limiter.close();
        await p.crash();
      }
    },
  };
}

/** Holds of `amount` one after another, alternating between `lims`, each settled at its amount: the demand that leases slices. Returns what they cost. */
export async function busy(lims: TestLimiter[], tag: string, holders: Holder[], n: number, amount: number): Promise<number> {
  for (let i = 0; i < n; i++) held(await lims[i % lims.length]!.hold(req(tag, holders, amount))).settle(amount);
  return n * amount;
}

/** Slices held by both instances, where the harness leases them. */
export function slicesOnBoth(h: Harness, t: Two): void {
  if (!h.spendSlices) return;
  assert.ok(t.a.spendSlicesHeld!() > 0 && t.b.spendSlicesHeld!() > 0, 'busy far from exhaustion, both instances hold spend slices');
}

/**
 * A key budget of 10 on a fresh tag, a hold of 0.01 on it from a (its usage is to come to
 * more), then busy holds of `amount` on both instances: slices on both, where leased.
 */
export async function busyBudget(h: Harness, t: Two, amount: number): Promise<{ tag: string; key: Holder; over: { settle(actual: number): void } }> {
  const tag = uid('tag');
  const key = keyBudget(uid('k'), { base: 0, limit: 10 });
  const over = held(await t.a.hold(req(tag, [key], 0.01)));
  await busy([t.a, t.b], tag, [key], 40, amount);
  slicesOnBoth(h, t);
  return { tag, key, over };
}

/** A small seeded generator (mulberry32): the property run is the same on every run. */
export function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let x = Math.imul(s ^ (s >>> 15), 1 | s);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/** `p`, or a failure naming `what` once `ms` have passed: a bound on an awaited event, not a wait. */
export async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(what)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

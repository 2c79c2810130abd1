/**
 * In-process limiter: the same buckets, leases and decision rules as the Redis scripts,
 * for a single instance without Redis and as the fail-open fallback. The clock is
 * injected so tests can move time instead of sleeping.
 */
import {
  type BucketState,
  CODES,
  DEFAULT_LEASE_MS,
  bucketLevel,
  bucketQuota,
  concurrencyWaitMs,
  fullAgainMs,
  refillWaitMs,
  tpmAdmits,
  tpmNeed,
} from './bucket.js';
import { createLeaseKeeper, newLeaseId } from './leases.js';
import { createMemoryLedger } from './ledger-memory.js';
import { type AdmitInput, type AdmitResult, type KeyLimits, type Limiter, type LimitCode, type Quota, isLimited } from './limiter.js';

export interface MemoryLimiterOptions {
  now?: () => number;
  leaseMs?: number;
  /** Lease refresh period; default leaseMs / 3; 0 disables the timer (see refreshLeases). */
  refreshEveryMs?: number;
}

export interface MemoryLimiter extends Limiter {
  /** Pushes the expiry of every live lease and spend hold forward now (what the background timers do). */
  refreshLeases(): Promise<void>;
  /** stored buckets and lease sets (idle ones are swept away) */
  entries(): number;
  /** whether the lease refresh timer runs (only while a lease is held) */
  refreshing(): boolean;
}

/** Like a Redis key with a TTL: an entry past `expires` no longer exists. */
interface Stored extends BucketState {
  expires: number;
}

const SWEEP_EVERY = 1024;

export function createMemoryLimiter(opts: MemoryLimiterOptions = {}): MemoryLimiter {
  const now = opts.now ?? Date.now;
  const leaseMs = opts.leaseMs ?? DEFAULT_LEASE_MS;
  const buckets = new Map<string, Stored>();
  const sets = new Map<string, Map<string, number>>();
  let admissions = 0;

  const keeper = createLeaseKeeper({
    everyMs: opts.refreshEveryMs ?? Math.floor(leaseMs / 3),
    refresh: async (setKey, ids) => {
      const set = sets.get(setKey);
      if (!set) return;
      const until = now() + leaseMs;
      // Only leases still present: one that already expired stays gone (as ZADD XX in Redis).
      for (const id of ids) if (set.has(id)) set.set(id, until);
    },
    onError: () => undefined,
  });
  const money = createMemoryLedger({ now, leaseMs, refreshEveryMs: opts.refreshEveryMs ?? Math.floor(leaseMs / 3) });

  const level = (key: string, cap: number, t: number): number => {
    const b = buckets.get(key);
    return bucketLevel(b && b.expires > t ? b : undefined, cap, t);
  };
  const store = (key: string, cap: number, lvl: number, t: number): void => {
    if (lvl >= cap) buckets.delete(key);
    else buckets.set(key, { tokens: lvl, ts: t, expires: t + fullAgainMs(lvl, cap) });
  };
  const adjust = (key: string, cap: number, delta: number): void => {
    const t = now();
    store(key, cap, Math.min(cap, level(key, cap, t) + delta), t);
  };
  const purge = (setKey: string, t: number): Map<string, number> | undefined => {
    const set = sets.get(setKey);
    if (!set) return undefined;
    for (const [id, exp] of set) if (exp <= t) set.delete(id);
    if (set.size === 0) sets.delete(setKey);
    return set.size > 0 ? set : undefined;
  };
  const soonest = (set: Map<string, number> | undefined): number | undefined => {
    let min: number | undefined;
    for (const exp of set?.values() ?? []) if (min === undefined || exp < min) min = exp;
    return min;
  };

  const sweep = (t: number): void => {
    for (const [k, b] of buckets) if (b.expires <= t) buckets.delete(k);
    for (const k of [...sets.keys()]) purge(k, t);
  };

  const quotaOf = (limits: KeyLimits, kk: string, t: number): Quota => ({
    requests: isLimited(limits.rpm) ? bucketQuota(level(`${kk}:rpm`, limits.rpm, t), limits.rpm) : null,
    tokens: isLimited(limits.tpm) ? bucketQuota(level(`${kk}:tpm`, limits.tpm, t), limits.tpm) : null,
  });

  const admit = (input: AdmitInput): AdmitResult => {
    const t = now();
    if (++admissions % SWEEP_EVERY === 0) sweep(t);
    const { route, limits } = input;
    const tokens = Math.max(0, Math.ceil(input.tokens));
    const rk = `r:${route.name}`;
    const kk = `k:${input.keyId}`;
    // The per-model buckets live beside the key's own, named by the matching pattern.
    const mk = `${kk}:m:${input.modelLimit?.pattern ?? ''}`;
    const mr = isLimited(input.modelLimit?.rpm) ? input.modelLimit.rpm : 0;
    const mt = isLimited(input.modelLimit?.tpm) ? input.modelLimit.tpm : 0;
    const denials: { code: LimitCode; wait: number }[] = [];
    const deny = (i: number, wait: number): void => void denials.push({ code: CODES[i]!, wait });

    // Every check runs before anything is written: the first failure names the code,
    // the longest wait among failures is when the request would fit.
    if (isLimited(route.concurrency)) {
      const set = purge(`${rk}:conc`, t);
      if ((set?.size ?? 0) >= route.concurrency) deny(0, concurrencyWaitMs(soonest(set), t));
    }
    const routeRpm = isLimited(route.rpm) ? level(`${rk}:rpm`, route.rpm, t) : 0;
    if (isLimited(route.rpm) && routeRpm < 1) deny(0, refillWaitMs(routeRpm, 1, route.rpm));
    const keyRpm = isLimited(limits.rpm) ? level(`${kk}:rpm`, limits.rpm, t) : 0;
    if (isLimited(limits.rpm) && keyRpm < 1) deny(1, refillWaitMs(keyRpm, 1, limits.rpm));
    const keyTpm = isLimited(limits.tpm) ? level(`${kk}:tpm`, limits.tpm, t) : 0;
    if (isLimited(limits.tpm) && !tpmAdmits(keyTpm, tokens, limits.tpm)) {
      deny(2, refillWaitMs(keyTpm, tpmNeed(tokens, limits.tpm), limits.tpm));
    }
    if (isLimited(limits.concurrency)) {
      const set = purge(`${kk}:conc`, t);
      if ((set?.size ?? 0) >= limits.concurrency) deny(3, concurrencyWaitMs(soonest(set), t));
    }
    const modelRpm = mr > 0 ? level(`${mk}:rpm`, mr, t) : 0;
    if (mr > 0 && modelRpm < 1) deny(1, refillWaitMs(modelRpm, 1, mr));
    const modelTpm = mt > 0 ? level(`${mk}:tpm`, mt, t) : 0;
    if (mt > 0 && !tpmAdmits(modelTpm, tokens, mt)) deny(2, refillWaitMs(modelTpm, tpmNeed(tokens, mt), mt));
    if (denials.length > 0) {
      return { ok: false, code: denials[0]!.code, retryAfterMs: Math.max(...denials.map((d) => d.wait)) };
    }

    if (isLimited(route.rpm)) store(`${rk}:rpm`, route.rpm, routeRpm - 1, t);
    if (isLimited(limits.rpm)) store(`${kk}:rpm`, limits.rpm, keyRpm - 1, t);
    const tpmCap = isLimited(limits.tpm) ? limits.tpm : 0;
    if (tpmCap > 0 && tokens > 0) store(`${kk}:tpm`, tpmCap, keyTpm - tokens, t);
    if (mr > 0) store(`${mk}:rpm`, mr, modelRpm - 1, t);
    if (mt > 0 && tokens > 0) store(`${mk}:tpm`, mt, modelTpm - tokens, t);
    const leaseId = newLeaseId();
    const setKeys: string[] = [];
    if (isLimited(route.concurrency)) setKeys.push(`${rk}:conc`);
    if (isLimited(limits.concurrency)) setKeys.push(`${kk}:conc`);
    for (const sk of setKeys) {
      let set = sets.get(sk);
      if (!set) sets.set(sk, (set = new Map()));
      set.set(leaseId, t + leaseMs);
    }
    const kept = keeper.add(leaseId, setKeys);

    let done = false;
    return {
      ok: true,
      quota: quotaOf(limits, kk, t),
      lease: {
        finish(usage) {
          if (done) return;
          done = true;
          keeper.remove(kept);
          for (const sk of setKeys) {
            const set = sets.get(sk);
            set?.delete(leaseId);
            if (set && set.size === 0) sets.delete(sk);
          }
          // Settle to the real usage: positive delta refunds, negative charges extra.
          const real = usage?.tokens;
          if (typeof real === 'number' && Number.isFinite(real) && real !== tokens) {
            const delta = tokens - Math.max(0, Math.ceil(real));
            if (tpmCap > 0) adjust(`${kk}:tpm`, tpmCap, delta);
            if (mt > 0) adjust(`${mk}:tpm`, mt, delta);
          }
        },
      },
    };
  };

  return {
    admit: async (input) => admit(input),
    peek: async (input) => quotaOf(input.limits, `k:${input.keyId}`, now()),
    hold: async (input) => money.hold(input),
    ledger: async (input) => money.ledger(input),
    stats: () => ({ redisErrors: 0, failOpenAdmissions: 0, slotsHeld: keeper.count(), failOpenHolds: 0, holdsHeld: money.count() }),
    refreshLeases: async () => {
      await Promise.all([keeper.refreshNow(), money.refresh()]);
    },
    entries: () => buckets.size + sets.size,
    refreshing: () => keeper.timerRunning(),
    close: async () => {
      keeper.stop();
      money.stop();
    },
  };
}

/**
 * The in-process limiter's state, kept the way the Redis scripts keep theirs: token buckets
 * (bucket.ts) kept for keepMs, and lease sets of concurrency slots
 * (lease id -> expiry) whose expired leases no longer count.
 */
import { type BucketState, bucketLevel, bucketQuota, keepMs } from './bucket.js';
import { type KeyLimits, type Quota, isLimited } from './limiter.js';

/** Like a Redis key with a TTL: an entry past `expires` no longer exists. */
interface StoredBucket extends BucketState {
  expires: number;
}

/** lease id -> expiry */
export type LeaseSet = Map<string, number>;

export class MemoryStore {
  private readonly buckets = new Map<string, StoredBucket>();
  private readonly sets = new Map<string, LeaseSet>();

  constructor(readonly now: () => number) {}

  /** The bucket's level at `t`; an absent or expired bucket is full. One in debt is kept until full at `cap`. */
  level(key: string, cap: number, t: number): number {
    const b = this.buckets.get(key);
    const live = b && b.expires > t ? b : undefined;
    const level = bucketLevel(live, cap, t);
    if (live && level < 0) live.expires = Math.max(live.expires, t + keepMs(level, cap));
    return level;
  }

  /** Stores the bucket's level at `t`, kept for keepMs. */
  store(key: string, cap: number, level: number, t: number): void {
    this.buckets.set(key, { tokens: level, ts: t, expires: t + keepMs(level, cap) });
  }

  /** Gives `delta` tokens back to the bucket now (negative takes more), never above its capacity. */
  adjust(key: string, cap: number, delta: number): void {
    const t = this.now();
    this.store(key, cap, Math.min(cap, this.level(key, cap, t) + delta), t);
  }

  /** The key's own RPM/TPM figures at `t`; `keyPrefix` names its buckets. */
  quota(limits: KeyLimits, keyPrefix: string, t: number): Quota {
    return {
      requests: isLimited(limits.rpm) ? bucketQuota(this.level(`${keyPrefix}:rpm`, limits.rpm, t), limits.rpm) : null,
      tokens: isLimited(limits.tpm) ? bucketQuota(this.level(`${keyPrefix}:tpm`, limits.tpm, t), limits.tpm) : null,
    };
  }

  /** The lease set with its expired leases dropped; undefined when none is left. */
  liveSet(setKey: string, t: number): LeaseSet | undefined {
    const set = this.sets.get(setKey);
    if (!set) return undefined;
    for (const [id, exp] of set) if (exp <= t) set.delete(id);
    if (set.size === 0) this.sets.delete(setKey);
    return set.size > 0 ? set : undefined;
  }

  addLease(setKey: string, leaseId: string, expires: number): void {
    let set = this.sets.get(setKey);
    if (!set) this.sets.set(setKey, (set = new Map()));
    set.set(leaseId, expires);
  }

  removeLease(setKey: string, leaseId: string): void {
    const set = this.sets.get(setKey);
    set?.delete(leaseId);
    if (set && set.size === 0) this.sets.delete(setKey);
  }

  /** Pushes the leases' expiry `leaseMs` ahead; one that already expired stays gone (as ZADD XX in Redis). */
  refresh(setKey: string, leaseIds: string[], leaseMs: number): void {
    const set = this.sets.get(setKey);
    if (!set) return;
    const until = this.now() + leaseMs;
    for (const id of leaseIds) if (set.has(id)) set.set(id, until);
  }

  /** Drops every expired bucket and lease. */
  sweep(t: number): void {
    for (const [k, b] of this.buckets) if (b.expires <= t) this.buckets.delete(k);
    for (const k of [...this.sets.keys()]) this.liveSet(k, t);
  }

  /** stored buckets and lease sets */
  size(): number {
    return this.buckets.size + this.sets.size;
  }
}

/** The soonest expiry in a lease set. */
export function soonestExpiry(set: LeaseSet | undefined): number | undefined {
  let min: number | undefined;
  for (const exp of set?.values() ?? []) if (min === undefined || exp < min) min = exp;
  return min;
}

/**
 * The Redis limiter's options and interface (limiter.ts implements them), where a key's and an
 * upstream's counters live, and which of them an error concerns.
 */
import type { Cluster, Redis } from 'ioredis';
import type { AdmitInput, AdmitResult, HoldInput, HoldResult, Lease, Limiter } from '../limiter.js';

export interface RedisLimiterOptions {
  redis: Redis | Cluster;
  /** Namespace of every key, e.g. `kw`. */
  prefix: string;
  /** A concurrency slot's or spend hold's lifetime without a refresh (the config's `limits.leaseMs`). */
  leaseMs: number;
  /** Lease refresh period; default leaseMs / 3; 0 disables the timer (see refreshLeases). */
  refreshEveryMs?: number;
  /**
   * When set, an admission Redis runs more than this long after it was sent changes nothing
   * (admit.lua checks a deadline). The caller has given up by then (e.g. a paused server that
   * resumes with a backlog), and a slot nobody will finish would be lost for leaseMs.
   */
  staleAfterMs?: number;
  /** Told about every Redis failure; each is also counted in stats().redisErrors. */
  onError?: (op: 'admit' | 'settle' | 'refresh' | 'hold' | 'peek' | 'claim', err: unknown) => void;
  /** Bucket slices and blocks of concurrency slots (lease-path.ts), spend slices (spend-slices.ts); off when absent. */
  lease?: { sliceMs: number } | null;
  /** Longest a settlement waits to leave with others; default DEFAULT_SETTLE_EVERY_MS. */
  settleEveryMs?: number;
  /** Each call is rejected when Redis has not answered it within this many ms (deadlines.ts); unbounded when absent. */
  callTimeoutMs?: number;
  /** Told after news of an over-committed ledger has ended this instance's slice of it (ledger-news.ts). */
  onLedgerNews?: (ledgerKey: string) => void;
}

/** A lease of the Redis limiter; `cancel` also undoes an answer that came too late. */
export type RedisLease = Lease;

export interface RedisLimiter extends Limiter {
  /** Rejects when Redis fails or times out; createLimiter turns that into fail-open/closed. */
  admit(input: AdmitInput): Promise<AdmitResult>;
  /** Pushes the expiry of every live lease and spend hold forward now (what the background timers do). */
  refreshLeases(): Promise<void>;
  /**
   * Admits from a slice this instance holds, with no I/O; null when none covers the request
   * (then call admit, which does not count the request twice).
   */
  admitNow(input: AdmitInput): AdmitResult | null;
  /**
   * Takes a spend hold from the spend slices this instance holds, with no I/O; null when they
   * do not cover it (then call hold, which does not count the request twice).
   */
  holdNow(input: HoldInput): HoldResult | null;
  /** Slices of buckets held now (0 without `lease`). */
  slicesHeld(): number;
  /** Blocks of concurrency slots held now (0 without `lease`). */
  slotBlocksHeld(): number;
  /** Spend slices (one per holder) held now (0 without `lease`). */
  spendSlicesHeld(): number;
  /** Resolves once this instance hears other instances' news of over-committed ledgers (at once without `lease`). */
  listening(): Promise<void>;
}

/** The hash tag under which a key's (`k`) or an upstream's (`r`) counters live. */
export const hashTag = (prefix: string, kind: 'k' | 'r', id: string): string => `{${prefix}:${kind}:${encodeURIComponent(id)}}`;

/** Admission reached Redis after its deadline: it changed nothing. */
export class StaleAdmissionError extends Error {}

/** Which hash tags an admission error came from, so a caller can tell a failing shard from the rest. */
export const errorTags = new WeakMap<object, string[]>();
export const failedHashTags = (err: unknown): string[] | null =>
  (typeof err === 'object' && err !== null && errorTags.get(err)) || null;

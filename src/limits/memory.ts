/**
 * In-process limiter: the same buckets, leases and decision rules as the Redis scripts,
 * for a single instance without Redis and as the fail-open fallback. The clock is
 * injected so tests can move time instead of sleeping.
 */
import { MemoryClaims } from './claims-memory.js';
import { LeaseTerm } from './lease-term.js';
import { createLeaseKeeper, type LeaseKeeper } from './leases.js';
import { type MemoryLedger, createMemoryLedger } from './ledger-memory.js';
import type { AdmitInput, AdmitResult, ClaimInput, ClaimResult, HoldInput, HoldResult, KeyLimits, LedgerFigure, LedgerInput, Limiter, LimiterStats, Quota } from './limiter.js';
import { MemoryAdmission } from './memory-admission.js';
import { MemoryStore } from './memory-store.js';

export interface MemoryLimiterOptions {
  now?: () => number;
  /** A concurrency slot's or spend hold's lifetime without a refresh (the config's `limits.leaseMs`). */
  leaseMs: number;
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

/** Every this many admissions, expired buckets and leases are swept away. */
const SWEEP_EVERY = 1024;

export function createMemoryLimiter(opts: MemoryLimiterOptions): MemoryLimiter {
  return new InProcessLimiter(opts);
}

class InProcessLimiter implements MemoryLimiter {
  readonly store: MemoryStore;
  readonly keeper: LeaseKeeper;
  readonly term: LeaseTerm;
  private readonly money: MemoryLedger;
  private readonly claims: MemoryClaims;
  private admissions = 0;

  constructor(opts: MemoryLimiterOptions) {
    const now = opts.now ?? Date.now;
    this.term = new LeaseTerm(opts.leaseMs, opts.refreshEveryMs);
    this.store = new MemoryStore(now);
    this.keeper = createLeaseKeeper({
      term: this.term,
      refresh: async (setKey, ids) => this.store.refresh(setKey, ids, this.term.ms),
      onError: () => undefined,
    });
    this.money = createMemoryLedger({ now, term: this.term });
    this.claims = new MemoryClaims(now);
  }

  async admit(input: AdmitInput): Promise<AdmitResult> {
    const t = this.store.now();
    if (++this.admissions % SWEEP_EVERY === 0) this.store.sweep(t);
    const admission = new MemoryAdmission(this, input, t);
    const denial = admission.denial();
    if (denial) return denial;
    admission.take();
    return { ok: true, quota: admission.quota(), lease: admission };
  }

  async peek(input: { keyId: string; limits: KeyLimits }): Promise<Quota> {
    return this.store.quota(input.limits, `k:${input.keyId}`, this.store.now());
  }

  async hold(input: HoldInput): Promise<HoldResult> {
    return this.money.hold(input);
  }

  async ledger(input: LedgerInput): Promise<LedgerFigure[]> {
    return this.money.ledger(input);
  }

  async claimOnce(input: ClaimInput): Promise<ClaimResult> {
    return this.claims.claim(input);
  }

  async claimedBy(input: ClaimInput): Promise<string | null> {
    return this.claims.claimedBy(input);
  }

  setLeaseMs(ms: number): void {
    this.term.set(ms);
  }

  stats(): LimiterStats {
    return { redisErrors: 0, failOpenAdmissions: 0, slotsHeld: this.keeper.count(), failOpenHolds: 0, holdsHeld: this.money.holds.count() };
  }

  async refreshLeases(): Promise<void> {
    await Promise.all([this.keeper.refreshNow(), this.money.holds.refreshNow()]);
  }

  entries(): number {
    return this.store.size();
  }

  refreshing(): boolean {
    return this.keeper.timerRunning();
  }

  async close(): Promise<void> {
    this.keeper.stop();
    this.money.holds.stop();
  }
}

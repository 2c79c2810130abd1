/**
 * In-process claims (Limiter.claimOnce) for a sidecar without Redis: the rules of
 * redis/lua/claim.lua for one instance. One entry per holder keeps the claims of its
 * latest epoch; the map is bounded, so endless made-up holders cannot grow it without end.
 */
import type { ClaimInput, ClaimResult } from './limiter.js';

/** Holders whose claims are kept; past this the expired go first, then the oldest. */
export const MAX_CLAIM_HOLDERS = 100_000;

interface Entry {
  epoch: number;
  /** claimed name -> the claimer's token */
  names: Map<string, string>;
  expires: number;
}

export class MemoryClaims {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly now: () => number,
    private readonly max = MAX_CLAIM_HOLDERS,
  ) {}

  claim(input: ClaimInput): ClaimResult {
    return this.claimedBy(input) === input.token ? 'claimed' : 'taken';
  }

  /** The token that holds the claim (this one or the first claimer's), null for an older epoch. */
  claimedBy(input: ClaimInput): string | null {
    const t = this.now();
    const key = `${input.tag}\u0000${input.holder}`;
    let e = this.entries.get(key);
    if (e && e.expires <= t) {
      this.entries.delete(key);
      e = undefined;
    }
    if (e && input.epoch < e.epoch) return null;
    if (!e || input.epoch > e.epoch) {
      if (!e) this.makeRoom(t);
      e = { epoch: input.epoch, names: new Map(), expires: 0 };
      this.entries.set(key, e);
    }
    const holder = e.names.get(input.name);
    if (holder !== undefined && holder !== input.token) return holder;
    e.names.set(input.name, input.token);
    e.expires = t + input.ttlMs;
    return input.token;
  }

  size(): number {
    return this.entries.size;
  }

  private makeRoom(t: number): void {
    if (this.entries.size < this.max) return;
    for (const [key, e] of this.entries) if (e.expires <= t) this.entries.delete(key);
    // Still full: the holders claimed longest ago go first (Map keeps insertion order).
    for (const key of this.entries.keys()) {
      if (this.entries.size < this.max) break;
      this.entries.delete(key);
    }
  }
}

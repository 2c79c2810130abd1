/**
 * In-process claims (Limiter.claimOnce) for a sidecar without Redis: the rules of
 * redis/lua/claim.lua for one instance. One entry per holder keeps the claims of its
 * latest epoch; the map is bounded, so endless made-up holders cannot grow it without end.
 */
import { type ClaimInput, type ClaimResult, claimResult } from './limiter.js';

/** Holders whose claims are kept; past this the expired go first, then the oldest. */
export const MAX_CLAIM_HOLDERS = 100_000;

interface Entry {
  epoch: number;
  /** claimed name -> the claimer's token */
  names: Map<string, string>;
  /** claimed name -> until when it is pending (its claimer has not said done); 0: released */
  pending: Map<string, number>;
  expires: number;
}

export class MemoryClaims {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly now: () => number,
    private readonly max = MAX_CLAIM_HOLDERS,
  ) {}

  claim(input: ClaimInput): ClaimResult {
    const holder = this.claimedBy(input);
    const pending = holder !== null && (input.pendingMs ?? 0) > 0 && this.entryOf(input)?.pending.has(input.name) === true;
    return claimResult(input.token, holder, pending);
  }

  /** The token that holds the claim (this one or the first claimer's), null for an older epoch. */
  claimedBy(input: ClaimInput): string | null {
    const t = this.now();
    const key = `${input.tag}\u0000${input.holder}`;
    let e = this.entryOf(input);
    if (e && input.epoch < e.epoch) return null;
    if (input.turn !== undefined) return e && e.epoch === input.epoch ? this.turn(e, input, t) : null;
    if (!e || input.epoch > e.epoch) {
      if (!e) this.makeRoom(t);
      e = { epoch: input.epoch, names: new Map(), pending: new Map(), expires: 0 };
      this.entries.set(key, e);
    }
    const pendingMs = input.pendingMs ?? 0;
    const holder = e.names.get(input.name);
    if (holder !== undefined && holder !== input.token) {
      const until = e.pending.get(input.name);
      // Held for good, or pending within its time: its claimer's.
      if (until === undefined || until > t) return holder;
      if (pendingMs <= 0) e.pending.delete(input.name);
    }
    if (holder !== input.token && pendingMs > 0) e.pending.set(input.name, t + pendingMs);
    else if (holder === input.token && pendingMs > 0 && e.pending.has(input.name)) e.pending.set(input.name, t + pendingMs);
    e.names.set(input.name, input.token);
    e.expires = t + input.ttlMs;
    return input.token;
  }

  /** What the claimer says of its claim (claim.lua's turns). */
  private turn(e: Entry, input: ClaimInput, t: number): string | null {
    const holder = e.names.get(input.name) ?? null;
    if (holder !== input.token) return holder;
    if (input.turn === 'renew') e.pending.set(input.name, t + (input.pendingMs ?? 0));
    else if (input.turn === 'done') e.pending.delete(input.name);
    else e.pending.set(input.name, 0);
    return holder;
  }

  /** The holder's live entry (an expired one is dropped). */
  private entryOf(input: ClaimInput): Entry | undefined {
    const key = `${input.tag}\u0000${input.holder}`;
    const e = this.entries.get(key);
    if (e && e.expires <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return e;
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

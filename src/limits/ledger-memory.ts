/**
 * In-process spend ledger: the rules of ledger.ts for one instance, without Redis and as
 * the fail-open fallback. Holds are leases: they expire one lease term after they were taken
 * or last refreshed, so a hold whose request never settles comes back by itself.
 */
import type { LeaseTerm } from './lease-term.js';
import { type KeptHolds, type LeaseKeeper, type LeaseTicket, createLeaseKeeper, newLeaseId } from './leases.js';
import { LEDGER_TTL_MS, effectiveBase, fromNano, holdFits, holdNano, liveNano, settledNano, toNano } from './ledger.js';
import type { Holder } from '../policy/holders.js';
import type { Hold, HoldInput, HoldResult, LedgerFigure, LedgerInput } from './limiter.js';

export interface MemoryLedgerOptions {
  now: () => number;
  /** a hold's lifetime without a refresh, and the refresh period (0: no timer, tests call refresh themselves) */
  term: LeaseTerm;
}

export interface MemoryLedger {
  hold(input: HoldInput): HoldResult;
  ledger(input: LedgerInput): LedgerFigure[];
  /** the live holds, kept alive until settled */
  readonly holds: KeptHolds;
}

interface Entry {
  epoch: number;
  base0: number;
  settled: number;
  held: number;
  holds: Map<string, { amount: number; expires: number }>;
  lastUse: number;
}

const SWEEP_EVERY = 1024;
const NOOP_HOLD: Hold = { settle: () => undefined };

/** What a hold needs of its ledger to settle. */
interface HoldOwner {
  now(): number;
  live(key: string, t: number): Entry | undefined;
  /** stops keeping the hold alive (its keeper's ticket) */
  release(kept: LeaseTicket): void;
}

/**
 * One hold: a small object with its settle method, no closures per hold. Its state is in ES
 * private fields: a hold may be printed or logged, and shows nothing of its ledger.
 */
class MemoryHold implements Hold {
  readonly #owner: HoldOwner;
  readonly #id: string;
  readonly #keys: string[];
  readonly #amount: number;
  readonly #kept: LeaseTicket;
  #done = false;

  constructor(owner: HoldOwner, id: string, keys: string[], amount: number, kept: LeaseTicket) {
    this.#owner = owner;
    this.#id = id;
    this.#keys = keys;
    this.#amount = amount;
    this.#kept = kept;
  }

  settle(actual: number): void {
    if (this.#done) return;
    this.#done = true;
    const owner = this.#owner;
    const id = this.#id;
    const amount = this.#amount;
    const keys = this.#keys;
    owner.release(this.#kept);
    const t = owner.now();
    const cost = settledNano(actual, amount);
    for (const key of keys) {
      const e = owner.live(key, t);
      if (!e) continue;
      const h = e.holds.size > 0 ? e.holds.get(id) : undefined;
      if (h) {
        e.holds.delete(id);
        e.held -= h.amount;
      }
      e.settled += cost;
      e.lastUse = t;
    }
  }
}

export function createMemoryLedger(opts: MemoryLedgerOptions): MemoryLedger {
  return new InProcessLedger(opts);
}

/** A holder's entry: `${tag}\0${holder id}`. */
const entryKey = (tag: string, holder: Holder): string => `${tag}\u0000${holder.id}`;

class InProcessLedger implements MemoryLedger, HoldOwner {
  readonly now: () => number;
  private readonly term: LeaseTerm;
  private readonly entries = new Map<string, Entry>();
  /**
   * Each holder list's entry keys, made once: a key made per request is a new string,
   * which the entries map hashes on every lookup. holdersOf memoises a list and its tag
   * per key record; a list asked about under another tag gets its keys made again.
   */
  private readonly keyMemo = new WeakMap<readonly Holder[], { tag: string; keys: string[] }>();
  /** keeps the live holds alive until settled */
  readonly holds: LeaseKeeper;
  private holdsTaken = 0;

  constructor(opts: MemoryLedgerOptions) {
    this.now = opts.now;
    this.term = opts.term;
    this.holds = createLeaseKeeper({
      term: opts.term,
      refresh: async (key, ids) => this.refreshHolds(key, ids),
      onError: () => undefined,
    });
  }

  hold(input: HoldInput): HoldResult {
    if (input.holders.length === 0) return { ok: true, hold: NOOP_HOLD };
    const t = this.now();
    if (++this.holdsTaken % SWEEP_EVERY === 0) this.sweep(t);
    const amount = holdNano(input.amount);
    const keys = this.keysOf(input.tag, input.holders);
    const states: Entry[] = [];
    let refused: Holder['code'] | null = null;
    for (let i = 0; i < keys.length; i++) {
      const holder = input.holders[i]!;
      const key = keys[i]!;
      let e = this.live(key, t);
      const { restart, base } = effectiveBase(e, holder, toNano(holder.base));
      if (!e || restart) {
        // A first or newer epoch: the ledger starts again from the replica's figure, keeping
        // the holds in flight, which the new figure does not know of yet.
        e = { epoch: holder.epoch, base0: base, settled: 0, held: e?.held ?? 0, holds: e?.holds ?? new Map(), lastUse: t };
        this.entries.set(key, e);
      }
      e.lastUse = t;
      states.push(e);
      const limit = holder.limit === null ? null : toNano(holder.limit);
      if (refused === null && !holdFits(holder.kind, liveNano(holder.kind, base, e), amount, limit)) refused = holder.code;
    }
    if (refused !== null) return { ok: false, code: refused };
    return { ok: true, hold: this.record(keys, states, amount, t) };
  }

  private keysOf(tag: string, holders: readonly Holder[]): string[] {
    let m = this.keyMemo.get(holders);
    if (m === undefined || m.tag !== tag) this.keyMemo.set(holders, (m = { tag, keys: holders.map((h) => entryKey(tag, h)) }));
    return m.keys;
  }

  ledger(input: LedgerInput): LedgerFigure[] {
    const t = this.now();
    return input.holders.map((holder) => {
      const e = this.entries.get(entryKey(input.tag, holder));
      const fresh = e && e.lastUse + LEDGER_TTL_MS > t ? e : undefined;
      const { restart, base } = effectiveBase(fresh, holder, toNano(holder.base));
      if (!fresh) return { id: holder.id, live: fromNano(base), epoch: holder.epoch, start: fromNano(base) };
      let held = 0;
      for (const h of fresh.holds.values()) if (h.expires > t) held += h.amount;
      // A newer epoch reads as the next hold makes it: its figure and the holds in flight.
      if (restart) return { id: holder.id, live: fromNano(liveNano(holder.kind, base, { epoch: holder.epoch, base0: base, settled: 0, held })), epoch: holder.epoch, start: fromNano(base) };
      const live = fromNano(liveNano(holder.kind, base, { epoch: fresh.epoch, base0: fresh.base0, settled: fresh.settled, held }));
      return { id: holder.id, live, epoch: fresh.epoch, start: fromNano(fresh.base0) };
    });
  }

  /** The live entry (expired holds dropped), as Redis would have it; undefined once its TTL ran out. */
  live(key: string, t: number): Entry | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.lastUse + LEDGER_TTL_MS <= t) {
      this.entries.delete(key);
      return undefined;
    }
    if (e.holds.size === 0) return e;
    for (const [id, h] of e.holds) {
      if (h.expires <= t) {
        e.holds.delete(id);
        e.held -= h.amount;
      }
    }
    return e;
  }

  release(kept: LeaseTicket): void {
    this.holds.remove(kept);
  }

  /**
   * Records a hold that fits on every holder's entry. A zero hold (an unpriced model) adds
   * nothing to what is held, so nothing records it or keeps it alive; its settlement still
   * counts whatever cost the usage comes to.
   */
  private record(keys: string[], states: Entry[], amount: number, t: number): Hold {
    const id = newLeaseId();
    let kept: LeaseTicket = -1;
    if (amount > 0) {
      for (const e of states) {
        e.holds.set(id, { amount, expires: t + this.term.ms });
        e.held += amount;
      }
      kept = this.holds.add(id, keys);
    }
    return new MemoryHold(this, id, keys, amount, kept);
  }

  /** Only holds still present (ZADD XX in Redis): one that was purged stays gone. */
  private refreshHolds(key: string, ids: string[]): void {
    const e = this.entries.get(key);
    if (!e) return;
    const until = this.now() + this.term.ms;
    for (const id of ids) {
      const h = e.holds.get(id);
      if (h) h.expires = until;
    }
  }

  private sweep(t: number): void {
    for (const key of [...this.entries.keys()]) this.live(key, t);
  }
}

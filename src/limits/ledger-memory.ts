/**
 * In-process spend ledger: the rules of ledger.ts for one instance, without Redis and as
 * the fail-open fallback. Holds are leases: they expire `leaseMs` after they were taken or
 * last refreshed, so a hold whose request never settles comes back by itself.
 */
import { createLeaseKeeper, newLeaseId, type LeaseTicket } from './leases.js';
import { LEDGER_TTL_MS, effectiveBase, fromNano, holdFits, holdNano, liveNano, toNano } from './ledger.js';
import type { Hold, HoldInput, HoldResult, LedgerFigure, LedgerHolder, LedgerInput } from './limiter.js';

export interface MemoryLedgerOptions {
  now: () => number;
  leaseMs: number;
  /** Refresh period of live holds; 0 disables the timer (tests call refresh themselves). */
  refreshEveryMs: number;
}

export interface MemoryLedger {
  hold(input: HoldInput): HoldResult;
  ledger(input: LedgerInput): LedgerFigure[];
  refresh(): Promise<void>;
  count(): number;
  stop(): void;
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

/** One hold: a small object with its settle method, no closures per hold. */
class MemoryHold implements Hold {
  private done = false;

  constructor(
    private readonly owner: HoldOwner,
    private readonly id: string,
    private readonly keys: string[],
    private readonly amount: number,
    private readonly kept: LeaseTicket,
  ) {}

  settle(actual: number): void {
    if (this.done) return;
    this.done = true;
    const { owner, id, amount } = this;
    owner.release(this.kept);
    const t2 = owner.now();
    // An unreadable figure keeps what was held rather than charging nothing.
    const cost = Number.isFinite(actual) ? toNano(Math.max(0, actual)) : amount;
    for (const key of this.keys) {
      const e = owner.live(key, t2);
      if (!e) continue;
      const h = e.holds.get(id);
      if (h) {
        e.holds.delete(id);
        e.held -= h.amount;
      }
      e.settled += cost;
      e.lastUse = t2;
    }
  }
}

export function createMemoryLedger(opts: MemoryLedgerOptions): MemoryLedger {
  const { now, leaseMs } = opts;
  const entries = new Map<string, Entry>();
  let holdsTaken = 0;

  const keeper = createLeaseKeeper({
    everyMs: opts.refreshEveryMs,
    refresh: async (entryKey, ids) => {
      const e = entries.get(entryKey);
      if (!e) return;
      const until = now() + leaseMs;
      // Only holds still present (ZADD XX in Redis): one that was purged stays gone.
      for (const id of ids) {
        const h = e.holds.get(id);
        if (h) h.expires = until;
      }
    },
    onError: () => undefined,
  });

  const keyOf = (tag: string, holder: LedgerHolder): string => `${tag}\u0000${holder.id}`;

  /** The live entry (expired holds dropped), as Redis would have it; undefined once its TTL ran out. */
  const live = (key: string, t: number): Entry | undefined => {
    const e = entries.get(key);
    if (!e) return undefined;
    if (e.lastUse + LEDGER_TTL_MS <= t) {
      entries.delete(key);
      return undefined;
    }
    for (const [id, h] of e.holds) {
      if (h.expires <= t) {
        e.holds.delete(id);
        e.held -= h.amount;
      }
    }
    return e;
  };

  const sweep = (t: number): void => {
    for (const key of [...entries.keys()]) live(key, t);
  };

  const hold = (input: HoldInput): HoldResult => {
    if (input.holders.length === 0) return { ok: true, hold: NOOP_HOLD };
    const t = now();
    if (++holdsTaken % SWEEP_EVERY === 0) sweep(t);
    const amount = holdNano(input.amount);
    const keys: string[] = [];
    const states: Entry[] = [];
    let refused: LedgerHolder['code'] | null = null;
    for (const holder of input.holders) {
      const key = keyOf(input.tag, holder);
      keys.push(key);
      let e = live(key, t);
      const { restart, base } = effectiveBase(e, holder, toNano(holder.base));
      if (!e || restart) {
        // A first or newer epoch: the ledger starts again from the replica's figure.
        e = { epoch: holder.epoch, base0: base, settled: 0, held: 0, holds: new Map(), lastUse: t };
        entries.set(key, e);
      }
      e.lastUse = t;
      states.push(e);
      const limit = holder.limit === null ? null : toNano(holder.limit);
      if (refused === null && !holdFits(holder.kind, liveNano(holder.kind, base, e), amount, limit)) refused = holder.code;
    }
    if (refused !== null) return { ok: false, code: refused };

    const id = newLeaseId();
    // A zero hold (an unpriced model) adds nothing to what is held, so nothing records it
    // or keeps it alive; its settlement still counts whatever cost the usage comes to.
    let kept: LeaseTicket = -1;
    if (amount > 0) {
      for (const e of states) {
        e.holds.set(id, { amount, expires: t + leaseMs });
        e.held += amount;
      }
      kept = keeper.add(id, keys);
    }
    return { ok: true, hold: new MemoryHold(owner, id, keys, amount, kept) };
  };

  const owner: HoldOwner = { now, live, release: (kept) => keeper.remove(kept) };

  const ledger = (input: LedgerInput): LedgerFigure[] => {
    const t = now();
    return input.holders.map((holder) => {
      const e = entries.get(keyOf(input.tag, holder));
      const fresh = e && e.lastUse + LEDGER_TTL_MS > t ? e : undefined;
      const { restart, base } = effectiveBase(fresh, holder, toNano(holder.base));
      if (!fresh || restart) return { id: holder.id, live: fromNano(base) };
      let held = 0;
      for (const h of fresh.holds.values()) if (h.expires > t) held += h.amount;
      return { id: holder.id, live: fromNano(liveNano(holder.kind, base, { epoch: fresh.epoch, base0: fresh.base0, settled: fresh.settled, held })) };
    });
  };

  return {
    hold,
    ledger,
    refresh: () => keeper.refreshNow(),
    count: () => keeper.count(),
    stop: () => keeper.stop(),
  };
}

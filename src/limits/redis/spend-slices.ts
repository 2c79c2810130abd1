/**
 * Spend slices held by this instance (lua/hold.lua grants them, lua/settle.lua settles them).
 * A holder (key budget, project budget, wallet) this instance draws on often may be leased a
 * slice of what it has left, in the hold.lua call that takes one request's hold; later holds
 * on that holder are taken from the slice with no round trip while it covers them, and
 * settle into it, in one batched operation per slice and tick. A request uses slices only
 * when every holder it draws on has one that covers it (all or nothing, as its hold is);
 * otherwise it takes the exact path: one hold.lua call, which first gives back what is left
 * of this instance's slices of those holders, so that Redis sees all of it.
 *
 * Exactness (DESIGN section 6, "Money"):
 *  - Redis records a slice like a hold of its whole amount: it counts in live spend until
 *    it is given back or expires, so holds and slices on all instances never exceed what a
 *    budget or balance has left. A hold taken from a slice is within that amount.
 *  - Settlement keeps the slice's record at least what is in flight on it: a cost comes off
 *    the slice, as far as the slice has room; a cost past that (the usage came to more than
 *    the slice could absorb) is sent to Redis at once (not at the next tick), and ends this
 *    instance's slices of the holder, so its next hold is exact; other instances end theirs
 *    on the news settle.lua publishes when that over-commits the ledger (ledger-news.ts).
 *  - A slice is used only by requests that carry the holder's figures (epoch, base, limit)
 *    it was granted under: a new epoch or figure on this instance's replica ends it at once.
 *    It is used for at most SPEND_SLICE_MAX_MS after its call was sent, so a new epoch that
 *    another instance brought to Redis applies here within a second too.
 *  - Redis keeps a slice leaseMs from its grant or its last refresh (the hold keeper), so a
 *    dead instance's slice comes back by expiry, as its holds do.
 *  - A settlement's reply says whether a live slice is void (gone, or over-committed by
 *    another instance's usage). One that carries nothing (holds of 0 settled at 0) is sent
 *    only for that answer, at most every SPEND_SLICE_CHECK_MS: holds of 0 on a void slice
 *    stop within that time. One with a cost leaves at the next tick.
 *
 * Size: about what this instance held on the holder in the last window (SPEND_SLICE_MAX_MS,
 * or sliceMs when shorter), capped in Redis at 1/SPEND_SLICE_SHARE of what the holder has
 * left, and granted only when that covers SPEND_SLICE_COVER holds like the one asking. So
 * a slice is taken only while what is left is at least SHARE x COVER requests' worth, and
 * shrinks with it: near exhaustion every instance is back to one exact call per hold.
 */
import type { LeaseKeeper } from '../leases.js';
import type { Holder } from '../../policy/holders.js';
import { DemandTable, type DemandEntry } from './demand-table.js';
import type { SettleBatch } from './settle-batch.js';
import { SPEND_SLICE_CHECK_MS, SPEND_SLICE_COVER, type SpendSlice } from './spend-slice.js';

export { SPEND_SLICE_CHECK_MS, SPEND_SLICE_COVER, SPEND_SLICE_MAX_MS, SPEND_SLICE_SHARE, type SpendSlice } from './spend-slice.js';

interface Entry extends DemandEntry {
  slice: SpendSlice | null;
  /** nano-units held in the current window and in the one before */
  amount: number;
  prevAmount: number;
}

export interface SpendSliceTableOptions {
  /** the demand window and a slice's time: min(sliceMs, SPEND_SLICE_MAX_MS, leaseMs) */
  windowMs: number;
  batch: SettleBatch;
  /** the hold keeper: keeps each slice alive in Redis while it is live or has holds in flight */
  keeper: LeaseKeeper;
  ledgerTtlMs: number;
  /** told when a settlement call fails */
  owner: (err: unknown) => void;
  now?: () => number;
}

/** What a hold.lua call asks for: a slice per holder, and the least worth having. */
export interface SpendWant {
  wants: number[];
  least: number;
}

/** `keys`: two per holder, as hold.lua takes them (ledger hash, hold set); the ledger hash names the holder here. */
export class SpendSliceTable extends DemandTable<Entry> {
  private inFlightHolds = 0;
  private kept = 0;

  constructor(private readonly opts: SpendSliceTableOptions) {
    super(opts.windowMs, opts.now);
  }

  protected fresh(): Omit<Entry, keyof DemandEntry> {
    return { slice: null, amount: 0, prevAmount: 0 };
  }

  protected rolled(e: Entry, gap: boolean): void {
    e.prevAmount = gap ? 0 : e.amount;
    e.amount = 0;
  }

  /** Counts a hold of `amount` toward each holder's demand. */
  note(keys: string[], amount: number): void {
    for (let j = 0; j < keys.length; j += 2) this.counted(keys[j]!).amount += amount;
  }

  /** Takes a hold of `amount` from a slice of every holder, or from none: null when one does not cover it. */
  take(keys: string[], holders: readonly Holder[], amount: number): SpendSlice[] | null {
    const t = this.now();
    for (let j = 0; j < holders.length; j++) {
      if (!covers(this.entries.get(keys[2 * j]!)?.slice, holders[j]!, amount, t)) return null;
    }
    const taken: SpendSlice[] = [];
    for (let j = 0; j < holders.length; j++) {
      const s = this.entries.get(keys[2 * j]!)!.slice!;
      s.inFlight += amount;
      s.holds++;
      taken.push(s);
      // Other instances' reads count what this slice last reported in flight (ledger.lua):
      // a hold that raises it is reported at the next settlement tick, as a cost would be.
      if (amount > 0) this.write(s, 0, 0);
    }
    this.inFlightHolds++;
    return taken;
  }

  /** Settles a hold taken from `slices` at `cost`; a cost past what a slice could absorb ends the holders' slices. */
  settle(slices: readonly SpendSlice[], amount: number, cost: number): void {
    this.inFlightHolds--;
    let excess = false;
    for (const s of slices) {
      s.inFlight -= amount;
      s.holds--;
      // A live slice keeps what the hold does not cost; one given back keeps nothing.
      const room = leftOf(s);
      const take = s.live ? Math.min(cost, room) : room;
      s.record -= take;
      if (cost > take) excess = true;
      this.write(s, cost, take);
    }
    if (!excess) return;
    for (const s of slices) this.endLive(s.keys[0]);
    this.opts.batch.flush(); // the header's "at once": other instances hear of it from Redis
  }

  /** The slice per holder worth asking for with a hold of `amount`, or null. */
  want(keys: string[], amount: number): SpendWant | null {
    const least = Math.max(SPEND_SLICE_COVER * amount, 1);
    const wants: number[] = [];
    for (let j = 0; j < keys.length; j += 2) {
      const e = this.entries.get(keys[j]!);
      if (!this.mayAsk(e)) return null;
      const w = Math.max(e.amount, e.prevAmount, 1);
      if (w < least) return null;
      wants.push(w);
    }
    return { wants, least };
  }

  /** The lease call asking for the holders' slices is in flight until `done` settles. */
  trackAll(keys: string[], done: Promise<unknown>): void {
    for (let j = 0; j < keys.length; j += 2) this.track(keys[j]!, done);
  }

  refusedAll(keys: string[]): void {
    for (let j = 0; j < keys.length; j += 2) this.refused(keys[j]!);
  }

  /** The calls asking for slices of any of these holders, or null when none is out. */
  askingAny(keys: string[]): Promise<unknown> | null {
    let waits: Promise<void>[] | null = null;
    for (let j = 0; j < keys.length; j += 2) {
      const p = this.asking(keys[j]!);
      if (p) (waits ??= []).push(p);
    }
    return waits && Promise.all(waits);
  }

  /** Gives back what is left of each holder's live slice (queued: it leaves before this instance's next call). */
  endAll(keys: string[]): void {
    for (let j = 0; j < keys.length; j += 2) this.endLive(keys[j]!);
  }

  /** Ends the holder's live slice, if it has one. */
  endLive(key: string): void {
    const e = this.entries.get(key);
    if (e?.slice) this.end(e, e.slice);
  }

  /** Ends the holder's live slice, and sends what is left of it back now rather than at the next tick. */
  giveBack(key: string): void {
    if (!this.entries.get(key)?.slice?.live) return;
    this.endLive(key);
    this.opts.batch.flush();
  }

  /** Installs the slices Redis granted (`sizes`, one per holder); sentAt: when their call was sent (this clock). */
  install(o: { keys: string[]; tag: string; holders: readonly Holder[]; id: string; sizes: number[]; sentAt: number }): void {
    const t = this.now();
    for (let j = 0; j < o.holders.length; j++) {
      const h = o.holders[j]!;
      const keys: [string, string] = [o.keys[2 * j]!, o.keys[2 * j + 1]!];
      const e = this.entry(keys[0], t);
      if (e.slice) this.end(e, e.slice);
      this.kept++;
      // Spelled out, every field set: one object shape for every slice.
      e.slice = {
        id: o.id, keys, tag: o.tag, kind: h.kind, epoch: h.epoch, base: h.base, limit: h.limit,
        record: o.sizes[j]!, inFlight: 0, holds: 0, reported: 0, until: o.sentAt + this.opts.windowMs, live: true, toldGivenBack: false, asked: o.sentAt,
        kept: this.opts.keeper.add(o.id, [keys[1]]), write: null,
      };
    }
  }

  /** What is left unused of this instance's live slice of a holder (nano-units; 0 without one). */
  unused(key: string, holder: Holder): number {
    const s = this.entries.get(key)?.slice;
    return s && s.epoch === holder.epoch ? leftOf(s) : 0;
  }

  /**
   * What ledger.lua counts of this instance's live slice of a holder beyond the holds in
   * flight on it now (nano-units; 0 without one): what changed since its last report.
   */
  overCounted(key: string, holder: Holder): number {
    const s = this.entries.get(key)?.slice;
    if (!s || s.epoch !== holder.epoch) return 0;
    return Math.min(s.reported, s.record) - s.inFlight;
  }

  /** Gives back every slice whose time is over (all of them with `all`), forgets idle holders. */
  sweep(all = false): void {
    const t = this.now();
    for (const [key, e] of this.entries) {
      if (e.slice && (all || t >= e.slice.until)) this.end(e, e.slice);
      if (!e.slice && !e.asking && t - e.lastUse > 2 * this.sliceMs) this.entries.delete(key);
    }
    this.syncTimer();
  }

  /** Live slices. */
  held(): number {
    let n = 0;
    for (const e of this.entries.values()) if (e.slice) n++;
    return n;
  }

  /** Holds taken from slices and not yet settled. */
  holdsInFlight(): number {
    return this.inFlightHolds;
  }

  /** Slices the hold keeper keeps alive (live ones, and given-back ones with holds in flight). */
  keptCount(): number {
    return this.kept;
  }

  /** Redis answered that the slice is gone or its ledger over-committed: it is given back, if still live. */
  private voided(s: SpendSlice): void {
    const e = this.entries.get(s.keys[0]);
    if (e?.slice === s) this.end(e, s);
  }

  private end(e: Entry, s: SpendSlice): void {
    e.slice = null;
    if (!s.live) return;
    s.live = false;
    const unused = leftOf(s);
    s.record = s.inFlight;
    this.write(s, 0, unused);
  }

  /** Adds to the slice's settlement in the batch; a slice given back ends there with its last hold. */
  private write(s: SpendSlice, cost: number, take: number): void {
    const end = !s.live && s.holds === 0;
    if (end) {
      this.opts.keeper.remove(s.kept);
      this.kept--;
    }
    const w = s.write;
    if (w && !w.sent) {
      w.cost += cost;
      w.take += take;
      w.end = end;
      w.givenBack = s.toldGivenBack = !s.live;
      return;
    }
    const t = this.now();
    // Nothing to settle: Redis would change nothing, and only a live slice's answer (void?),
    // holds in flight it has not reported, or the news that it was given back, is worth a call.
    const unreported = s.live && s.inFlight !== s.reported;
    if (cost === 0 && take === 0 && !end && !unreported && (s.live ? t - s.asked < SPEND_SLICE_CHECK_MS : s.toldGivenBack)) return;
    s.toldGivenBack = !s.live;
    s.asked = t;
    s.write = {
      kind: 'spendSlice', tag: s.tag, sliceId: s.id, keys: s.keys, cost, take, end, givenBack: !s.live, ttlMs: this.opts.ledgerTtlMs, holderKind: s.kind, sent: false,
      inFlightNow: () => (s.reported = s.inFlight),
      owner: this.opts.owner, onVoid: () => this.voided(s),
    };
    this.opts.batch.add(s.write);
  }
}

/** What a slice has not lent to holds in flight (nano-units). */
const leftOf = (s: SpendSlice): number => s.record - s.inFlight;

/** Whether slice `s` may hold `amount` for a request carrying `h`'s figures at time `t`. */
function covers(s: SpendSlice | null | undefined, h: Holder, amount: number, t: number): s is SpendSlice {
  if (!s || t >= s.until || s.epoch !== h.epoch || s.base !== h.base || s.limit !== h.limit) return false;
  const left = leftOf(s);
  // A zero hold needs something left, as an exhausted budget or balance refuses it.
  return amount > 0 ? left >= amount : left > 0;
}

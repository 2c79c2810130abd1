/**
 * Blocks of concurrency slots held by this instance (see lua/slots.lua and lua/lease.lua).
 * A key with a concurrency limit C may lease a block of k of its C slots in the call that
 * admits one request; later requests of that key on this instance take a free slot of the
 * block with no round trip, and give it back to the block (not to Redis) when they end.
 *
 * Exactness: Redis records a block of k slots as k members of the key's lease set, which
 * every build counts, those before blocks included (lua/slots.lua), so the requests in
 * flight on all instances never exceed C. Sizing keeps blocks out of the way near
 * the limit:
 *  - a block is about this instance's peak in flight of the key over the last sliceMs plus
 *    one, at most BLOCK_SHARE of C;
 *  - Redis grants it only while slots in use, blocks included, stay within BLOCK_KEEP_SHARE of C
 *    (lease.lua); past that every instance is back to one call per request.
 * Redis keeps a block for the lease term after its grant or its last refresh (the lease
 * keeper's); this instance stops taking slots from it one term after it sent that grant or
 * refresh (the shortest term in force since, when a reload changed it: lease-term.ts), so
 * it never admits on a block Redis has let go. Slots left unused for a whole sliceMs go back
 * (resize in the settlement batch); on close every unused slot goes back.
 */
import type { LeaseTerm } from '../lease-term.js';
import { DemandTable, type DemandEntry } from './demand-table.js';

/** Largest block, as a share of the concurrency limit. */
export const BLOCK_SHARE = 1 / 16;
/** Slots in use (blocks included) past which no block is granted, as a share of the limit. */
export const BLOCK_KEEP_SHARE = 1 / 2;

export interface Block {
  id: string;
  cap: number;
  /** what Redis records (or less: a grow in flight only ever adds) */
  weight: number;
  used: number;
  /** this clock: no slot is taken from the block from then on */
  validUntil: number;
  /** fewest free slots seen since `win` */
  lowFree: number;
  win: number;
  /** no longer this instance's block: its last slot in use, once free, ends it in Redis */
  dropped?: boolean;
}

interface Entry extends DemandEntry {
  block: Block | null;
  /** requests of the key in flight on this instance, and the most at once in each window */
  inFlight: number;
  peak: number;
  prevPeak: number;
}

export interface BlockTableOptions {
  sliceMs: number;
  term: LeaseTerm;
  /** The block is resized to `weight` in Redis (queued); `dropped`: this instance no longer holds it. */
  resize: (keyId: string, block: Block, weight: number, dropped: boolean) => void;
  now?: () => number;
}

export class BlockTable extends DemandTable<Entry> {
  private readonly byId = new Map<string, string>();
  /** requests in flight on a slot of a block (held, or dropped while they ran) */
  private onBlocks = 0;
  /** dropped blocks with slots still in use: their lease is kept alive until the last one ends */
  private lingering = 0;

  constructor(private readonly opts: BlockTableOptions) {
    super(opts.sliceMs, opts.now);
    opts.term.onChange(() => this.termChanged());
  }

  protected fresh(): Omit<Entry, keyof DemandEntry> {
    return { block: null, inFlight: 0, peak: 0, prevPeak: 0 };
  }

  protected rolled(e: Entry, gap: boolean): void {
    e.prevPeak = gap ? 0 : e.peak;
    e.peak = e.inFlight;
  }

  /** Counts one request of the key toward its demand. */
  note(keyId: string): void {
    this.counted(keyId);
  }

  /** A request of the key is in flight on this instance (from a block or not) until `ended`. */
  started(keyId: string): void {
    const e = this.entry(keyId, this.now());
    e.inFlight++;
    if (e.inFlight > e.peak) e.peak = e.inFlight;
  }

  ended(keyId: string, block: Block | null): void {
    const e = this.entries.get(keyId);
    if (e && e.inFlight > 0) e.inFlight--;
    if (block && block.used > 0) {
      block.used--;
      this.onBlocks--;
      // Redis still counts a dropped block's slots in use (until its expiry): free them.
      if (block.dropped && block.used === 0) {
        this.lingering--;
        this.opts.resize(keyId, block, 0, true);
      }
    }
  }

  /** The key's live block when it has a free slot, else null (nothing taken). */
  free(keyId: string, cap: number): Block | null {
    const b = this.entries.get(keyId)?.block;
    if (!b || b.cap !== cap || this.now() >= b.validUntil || b.used >= b.weight) return null;
    return b;
  }

  take(keyId: string, b: Block): void {
    b.used++;
    this.onBlocks++;
    b.lowFree = Math.min(b.lowFree, b.weight - b.used);
    this.started(keyId);
  }

  current(keyId: string): Block | null {
    return this.entries.get(keyId)?.block ?? null;
  }

  /** The block weight worth asking for now, or 0. */
  want(keyId: string, cap: number): number {
    const e = this.entries.get(keyId);
    if (!this.mayAsk(e)) return 0;
    const w = Math.min(Math.floor(cap * BLOCK_SHARE), Math.max(e.peak, e.prevPeak) + 1);
    const have = e.block && e.block.cap === cap ? e.block.weight : 0;
    return w > have ? w : 0;
  }

  /** Redis set the key's block to `weight` (grant); sentAt is when that call was sent (this clock). */
  granted(keyId: string, id: string, cap: number, weight: number, sentAt: number): Block {
    const e = this.entry(keyId, this.now());
    const old = e.block;
    if (old && old.id === id) {
      old.cap = cap;
      old.weight = weight;
      old.validUntil = Math.max(old.validUntil, sentAt + this.opts.term.lifetimeFrom(sentAt));
      old.lowFree = weight - old.used;
      old.win = this.now();
      return old;
    }
    if (old) this.drop(keyId, e);
    const b: Block = { id, cap, weight, used: 0, validUntil: sentAt + this.opts.term.lifetimeFrom(sentAt), lowFree: weight, win: this.now() };
    e.block = b;
    this.byId.set(id, keyId);
    return b;
  }

  /** Redis no longer records the key's block (it expired): stop using it. */
  lost(keyId: string, id: string): void {
    const e = this.entries.get(keyId);
    if (e?.block?.id === id) this.drop(keyId, e);
  }

  /**
   * The keeper refreshed these lease ids, sent at sentAt; `missing`: those Redis no longer
   * recorded. A block among them is given up (its slots may be someone else's by now);
   * every other block is good for another term from sentAt.
   */
  refreshed(ids: string[], sentAt: number, missing: readonly string[]): void {
    const gone = missing.length === 0 ? null : new Set(missing);
    for (const id of ids) {
      const keyId = this.byId.get(id);
      const e = keyId === undefined ? undefined : this.entries.get(keyId);
      if (!e?.block || e.block.id !== id) continue;
      if (gone?.has(id)) this.drop(keyId!, e);
      else e.block.validUntil = Math.max(e.block.validUntil, sentAt + this.opts.term.lifetimeFrom(sentAt));
    }
  }

  /**
   * A shorter term reaches Redis with the next refresh, which may then set a block's expiry
   * sooner than this instance counted on: no block is used past one new term from now.
   */
  private termChanged(): void {
    const until = this.now() + this.opts.term.ms;
    for (const e of this.entries.values()) if (e.block && e.block.validUntil > until) e.block.validUntil = until;
  }

  /** Stops using the block; its slots in use stay counted in Redis until their requests end. */
  private drop(keyId: string, e: Entry): void {
    const b = e.block!;
    e.block = null;
    b.dropped = true;
    this.byId.delete(b.id);
    if (b.used > 0) this.lingering++;
    this.opts.resize(keyId, b, b.used, true);
  }

  /**
   * Gives back slots that stayed free a whole sliceMs, drops blocks past their validity (all
   * of them with `all`, keeping only slots in use), forgets idle keys.
   */
  sweep(all = false): void {
    const t = this.now();
    for (const [keyId, e] of this.entries) {
      const b = e.block;
      if (b && (all || t >= b.validUntil)) this.drop(keyId, e);
      else if (b && !e.asking && t - b.win >= this.opts.sliceMs) {
        if (b.lowFree > 0) {
          const weight = b.weight - b.lowFree;
          if (weight <= 0 && b.used === 0) this.drop(keyId, e);
          else {
            b.weight = Math.max(weight, b.used);
            this.opts.resize(keyId, b, b.weight, false);
          }
        }
        b.lowFree = b.weight - b.used;
        b.win = t;
      }
      if (!e.block && !e.asking && e.inFlight === 0 && t - e.lastUse > 2 * this.opts.sliceMs) this.entries.delete(keyId);
    }
    this.syncTimer();
  }

  /** Requests in flight on slots of blocks. */
  inUse(): number {
    return this.onBlocks;
  }

  /** Blocks whose lease this instance keeps: held ones, and dropped ones with slots in use. */
  held(): number {
    let n = this.lingering;
    for (const e of this.entries.values()) if (e.block) n++;
    return n;
  }
}

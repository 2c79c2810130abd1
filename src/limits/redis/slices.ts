/**
 * Bucket slices held by this instance (see lua/lease.lua and lua/bucket.lua). A key whose
 * requests are limited by its own RPM/TPM alone may lease a slice of each bucket in the
 * call that admits one request; later requests of that key on this instance are admitted
 * from the slice without a round trip, until it runs out or its `sliceMs` is over. What is
 * left then goes back to Redis (in the settlement batch, or in the next lease call).
 *
 * Sizing keeps the key fair and exact near its limit:
 *  - a slice is what this instance used of the key in the last sliceMs, at most
 *    SLICE_SHARE of the capacity, and only worth asking for when it covers at least two
 *    requests;
 *  - Redis grants it only when the bucket still holds KEEP_SHARE of the capacity after it
 *    (lease.lua); below that every instance is back to one call per request.
 * Redis records each slice with an expiry of 2 x sliceMs (its time); this instance stops
 * using it sliceMs after it sent the request (its clock, which started earlier), so a slice
 * is never used after Redis has let it go.
 */
import { DemandTable, type DemandEntry } from './demand-table.js';

/** Largest slice, as a share of the bucket's capacity. */
export const SLICE_SHARE = 1 / 16;
/** What a bucket must still hold after a slice, as a share of its capacity. */
export const KEEP_SHARE = 1 / 2;
/** Redis keeps a slice this many times sliceMs (see above). */
export const REDIS_LIFETIME_FACTOR = 2;

export interface Slice {
  id: string;
  rpmCap: number;
  tpmCap: number;
  granted: { rpm: number; tpm: number };
  left: { rpm: number; tpm: number };
  /** the key's remaining figures Redis reported with the grant (slice included) */
  seen: { rpm: number; tpm: number };
  until: number;
}

interface Entry extends DemandEntry {
  slice: Slice | null;
  /** tokens reserved in the current window and in the one before */
  tokens: number;
  prevTokens: number;
}

export interface SliceTableOptions {
  sliceMs: number;
  /** A slice is over: give back what is left (queued in the settlement batch). */
  giveBack: (keyId: string, slice: Slice) => void;
  now?: () => number;
}

export interface Want {
  rpm: number;
  tpm: number;
  keepRpm: number;
  keepTpm: number;
}

export class SliceTable extends DemandTable<Entry> {
  constructor(private readonly opts: SliceTableOptions) {
    super(opts.sliceMs, opts.now);
  }

  protected fresh(): Omit<Entry, keyof DemandEntry> {
    return { slice: null, tokens: 0, prevTokens: 0 };
  }

  protected rolled(e: Entry, gap: boolean): void {
    e.prevTokens = gap ? 0 : e.tokens;
    e.tokens = 0;
  }

  /** Counts one request of the key toward its demand. */
  note(keyId: string, tokens: number): void {
    this.counted(keyId).tokens += tokens;
  }

  /** Admits from the key's live slice when it covers the request; null when it does not. */
  take(keyId: string, rpmCap: number, tpmCap: number, tokens: number): Slice | null {
    const s = this.entries.get(keyId)?.slice;
    if (!s || s.rpmCap !== rpmCap || s.tpmCap !== tpmCap || this.now() >= s.until) return null;
    if (rpmCap > 0 && s.left.rpm < 1) return null;
    if (tpmCap > 0 && tokens > s.left.tpm) return null;
    if (rpmCap > 0) s.left.rpm -= 1;
    if (tpmCap > 0) s.left.tpm -= tokens;
    return s;
  }

  /**
   * Settles a request admitted from slice `s` into that slice while it is still the key's
   * live one: what the request gives back (positive) returns to what is left, what it owes
   * (negative) comes out of it when it can. Exact either way: the slice's tokens were taken
   * from Redis when it was granted, and whatever is left goes back with it. False when the
   * settlement has to go to Redis instead.
   */
  settle(keyId: string, s: Slice, delta: { rpm: number; tpm: number }): boolean {
    if (this.entries.get(keyId)?.slice !== s || this.now() >= s.until) return false;
    // A bucket the key has no limit for is not in the slice: nothing to settle there.
    const rpm = s.rpmCap > 0 ? delta.rpm : 0;
    const tpm = s.tpmCap > 0 ? delta.tpm : 0;
    if (s.left.rpm + rpm < 0 || s.left.tpm + tpm < 0) {
      // Owed past what the slice holds: the key's bucket goes into debt in Redis. What the
      // slice holds is part of that bucket, so it goes back too, and the next request is
      // judged by the bucket (section 6: admitted only while it holds the estimate), not
      // admitted from tokens the debt has already used.
      this.retire(keyId);
      return false;
    }
    s.left.rpm += rpm;
    s.left.tpm += tpm;
    return true;
  }

  /** The slice worth asking for now, or null. */
  want(keyId: string, rpmCap: number, tpmCap: number): Want | null {
    const e = this.entries.get(keyId);
    if (!this.mayAsk(e)) return null;
    const count = Math.max(e.count, e.prevCount);
    const rpm = rpmCap > 0 ? Math.min(Math.floor(rpmCap * SLICE_SHARE), count) : 0;
    if (rpmCap > 0 && rpm < 2) return null;
    let tpm = 0;
    if (tpmCap > 0) {
      const avg = (e.tokens + e.prevTokens) / Math.max(1, e.count + e.prevCount);
      tpm = Math.min(Math.floor(tpmCap * SLICE_SHARE), Math.ceil(Math.max(e.tokens, e.prevTokens)));
      // A slice that cannot cover two typical requests saves nothing.
      if (tpm < 1 || tpm < 2 * avg) return null;
    }
    return { rpm, tpm, keepRpm: Math.ceil(rpmCap * KEEP_SHARE), keepTpm: Math.ceil(tpmCap * KEEP_SHARE) };
  }

  /**
   * Gives the key's live slice back now: a settlement put its bucket into debt in Redis, and
   * tokens the slice holds are part of that bucket (the next request is judged by Redis).
   */
  retire(keyId: string): void {
    const s = this.detach(keyId);
    if (s) this.opts.giveBack(keyId, s);
  }

  /** Takes the key's slice out of the table (to be returned by the caller's next lease call). */
  detach(keyId: string): Slice | null {
    const e = this.entries.get(keyId);
    const s = e?.slice ?? null;
    if (e) e.slice = null;
    return s;
  }

  /** Installs a granted slice; sentAt is when its lease call was sent (this clock). */
  install(keyId: string, s: Omit<Slice, 'until' | 'left' | 'id'> & { id: string }, sentAt: number): void {
    const e = this.entry(keyId, this.now());
    const old = e.slice;
    // Spelled out, not spread: every slice then has the same fields in the same order, one
    // object shape, so the reads of a slice on every admission stay monomorphic.
    e.slice = { id: s.id, rpmCap: s.rpmCap, tpmCap: s.tpmCap, granted: s.granted, left: { rpm: s.granted.rpm, tpm: s.granted.tpm }, seen: s.seen, until: sentAt + this.opts.sliceMs };
    if (old) this.opts.giveBack(keyId, old);
  }

  /** Gives back every slice that is over (all of them with `all`), forgets idle keys. */
  sweep(all = false): void {
    const t = this.now();
    for (const [keyId, e] of this.entries) {
      if (e.slice && (all || t >= e.slice.until)) {
        this.opts.giveBack(keyId, e.slice);
        e.slice = null;
      }
      if (!e.slice && !e.asking && t - e.lastUse > 2 * this.opts.sliceMs) this.entries.delete(keyId);
    }
    this.syncTimer();
  }

  /** The keys this instance holds a slice of now. */
  *holding(): IterableIterator<string> {
    for (const [keyId, e] of this.entries) if (e.slice) yield keyId;
  }

  held(): number {
    let n = 0;
    for (const e of this.entries.values()) if (e.slice) n++;
    return n;
  }
}


/**
 * What bucket slices (slices.ts) and slot blocks (slot-blocks.ts) keep alike per key: the
 * key's demand over the current and the previous sliceMs window (which sizes what is worth
 * leasing), the lease call in flight that asks for more, the quiet time after Redis refused,
 * and a sweep that runs every sliceMs / 4 while the table has entries and not at all while
 * it is empty (unref'd, so it never keeps a process up).
 */
export interface DemandEntry {
  /** a lease call that asks for more, while it is in flight */
  asking: Promise<void> | null;
  /** nothing is asked for before this (Redis just refused: the key is near its limit) */
  quietUntil: number;
  /** start of the current window; requests in it and in the one before */
  win: number;
  count: number;
  prevCount: number;
  lastUse: number;
}

export abstract class DemandTable<E extends DemandEntry> {
  protected readonly entries = new Map<string, E>();
  protected readonly now: () => number;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    protected readonly sliceMs: number,
    now?: () => number,
  ) {
    this.now = now ?? (() => performance.now());
  }

  /** A new entry with the table's own fields (the shared ones are set by `entry`). */
  protected abstract fresh(): Omit<E, keyof DemandEntry>;
  /** A new window began: the table moves its own figures; `gap`: a whole window went by unused. */
  protected abstract rolled(e: E, gap: boolean): void;
  /** Ends what is over, forgets idle keys; `all`: ends everything (on close). */
  abstract sweep(all?: boolean): void;

  protected entry(keyId: string, t: number): E {
    let e = this.entries.get(keyId);
    if (!e) {
      // The table's own fields spread last, none added after the spread: every entry of a
      // table then has one object shape, and the reads of an entry stay monomorphic.
      e = { asking: null, quietUntil: 0, win: t, count: 0, prevCount: 0, lastUse: t, ...this.fresh() } as E;
      this.entries.set(keyId, e);
      this.syncTimer();
    }
    return e;
  }

  /** Counts one request of the key toward its demand; returns its entry. */
  protected counted(keyId: string): E {
    const t = this.now();
    const e = this.entry(keyId, t);
    if (t - e.win >= this.sliceMs) {
      const gap = t - e.win >= 2 * this.sliceMs;
      e.prevCount = gap ? 0 : e.count;
      e.count = 0;
      this.rolled(e, gap);
      e.win = t;
    }
    e.count++;
    e.lastUse = t;
    return e;
  }

  /** A lease call that asks for more is in flight for the key. */
  asking(keyId: string): Promise<void> | null {
    return this.entries.get(keyId)?.asking ?? null;
  }

  /** Marks a lease call that asks for more in flight until `done` settles. */
  track(keyId: string, done: Promise<unknown>): void {
    const e = this.entry(keyId, this.now());
    const p = done.then(
      () => undefined,
      () => undefined,
    );
    e.asking = p;
    void p.then(() => {
      if (e.asking === p) e.asking = null;
    });
  }

  /** Redis refused: the key is near its limit; ask again after one sliceMs. */
  refused(keyId: string): void {
    this.entry(keyId, this.now()).quietUntil = this.now() + this.sliceMs;
  }

  /** Whether asking is worth it now: demand of two requests a window, no call out, not quiet. */
  protected mayAsk(e: E | undefined): e is E {
    return !!e && !e.asking && this.now() >= e.quietUntil && Math.max(e.count, e.prevCount) >= 2;
  }

  protected syncTimer(): void {
    const active = this.entries.size > 0;
    if (active && !this.timer) {
      this.timer = setInterval(() => this.sweep(), Math.max(5, Math.floor(this.sliceMs / 4)));
      this.timer.unref();
    } else if (!active && this.timer) this.stop();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

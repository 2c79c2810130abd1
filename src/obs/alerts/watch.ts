/**
 * Finding budget alerts (DESIGN section 13) off the request's path. A hold or settlement
 * queues the holders it drew on (latest facts win, one entry per holder); a moment later one
 * background check reads their live figures from the limits store, and for each threshold
 * reached that this instance has not seen settled yet it asks the store for the claim of that
 * holder, epoch and threshold. Only the claimer reports the crossing, so each is sent once
 * across every instance and worker. Thresholds are claimed in ascending order, one after the
 * other, so one request that crosses two reports both, in order; a lower one another
 * instance holds pending (it claimed it and is delivering it) stops the check there, so
 * that instance claims the higher ones of the same crossing too and sends them in order.
 *
 * A claim the store cannot answer is asked again later with the same token (a grant whose
 * answer was lost is still this instance's), never granted here alone.
 */
import { randomUUID } from 'node:crypto';
import type { LogSink } from '../../log.js';
import type { Holder } from '../../policy/holders.js';
import { type AlertFigure, type Crossing, standing } from './event.js';
import type { AlertStore, ClaimRef } from './store.js';

export type { AlertStore, ClaimRef } from './store.js';

export interface WatchOptions {
  store: AlertStore;
  /** the thresholds in force, ascending; null while alerts are off */
  thresholds: () => readonly number[] | null;
  /** a crossing this instance claimed, and its claim (pending until the event's delivery says otherwise) */
  found: (c: Crossing, claim: ClaimRef) => void;
  /** how long a claim stays pending without a renewal */
  pendingMs: number;
  log: LogSink;
  /** wall clock of the crossings' `at` */
  now?: () => number;
  /** how long touched holders gather before one check reads them all */
  checkDelayMs?: number;
  /** when a claim the store could not answer is asked again */
  claimRetryMs?: number;
  /** the holder as the replica has it now (null: gone); without it, as it was touched */
  current?: (holder: Holder) => Holder | null;
}

/**
 * How long a holder's claims are kept after its last one: longer than any budget period, so
 * an epoch's claims outlive the epoch; a newer epoch's first claim drops them anyway.
 */
export const CLAIM_TTL_MS = 400 * 86_400_000;
/**
 * Touches gather this long before a check: a busy holder is read once per check, not once
 * per hold and settlement, and an alert is found this long after the request that crossed.
 */
const CHECK_DELAY_MS = 100;
const CLAIM_RETRY_MS = 5_000;
/** Holders waiting for a check; past this a touch is dropped (the holder's next hold or settlement queues it again). */
const MAX_QUEUED = 10_000;
/** The holders touched last, checked again when the replica changes their figures. */
const MAX_RECENT = 1_000;
/** Tags read at once in one check. */
const READS_AT_ONCE = 64;
/** Bounds on what this instance remembers; each is cleared when full, which only costs a store call. */
const MAX_SETTLED = 50_000;
const MAX_TOKENS = 10_000;

interface Watched {
  tag: string;
  holder: Holder;
}

const entryKey = (tag: string, id: string): string => `${tag}\u0000${id}`;

/**
 * The claim that records a wallet's balance at its epoch (its token is the figure in
 * nano-units): the ledger that holds it expires a day after its last use, the claims of an
 * epoch are kept CLAIM_TTL_MS, so an idle day does not move what 80 % of it is.
 */
const WALLET_START = 'start';
const NANO = 1e9;

export class AlertWatch {
  private queued = new Map<string, Watched>();
  /** holders whose claim the store could not answer, checked again after claimRetryMs */
  private retry = new Map<string, Watched>();
  /** the holders touched last, oldest first, as last touched or checked */
  private readonly recent = new Map<string, Watched>();
  /** `tag, holder, epoch` -> thresholds claimed by someone: nothing more to ask */
  private readonly settled = new Map<string, Set<number>>();
  /** `tag, holder, epoch, threshold` -> the token of a claim the store could not answer */
  private readonly tokens = new Map<string, string>();
  private timer: NodeJS.Timeout | null = null;
  private retryTimer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private closed = false;
  /** the last check's read failed: one warning for a run of failures, not one a retry */
  private storeFailing = false;

  constructor(private readonly o: WatchOptions) {}

  /** Queues the holders for a check; returns at once. */
  touched(tag: string, holders: readonly Holder[]): void {
    if (this.closed) return;
    for (const holder of holders) {
      const key = entryKey(tag, holder.id);
      this.recent.delete(key);
      this.recent.set(key, { tag, holder });
      if (this.recent.size > MAX_RECENT) this.recent.delete(this.recent.keys().next().value!);
      if (this.queued.size >= MAX_QUEUED && !this.queued.has(key)) return;
      this.queued.set(key, { tag, holder });
    }
    this.schedule();
  }

  /**
   * The replica changed: each recent holder whose figures (its base, budget or epoch) are
   * not what it was checked with is checked again with the new ones. Spend the console
   * bills (usage served while Redis was down, or that this instance never saw) can reach a
   * threshold when no request of the holder's comes any more.
   */
  replicaChanged(): void {
    const current = this.o.current;
    if (this.closed || current === undefined) return;
    for (const [key, { tag, holder }] of [...this.recent]) {
      const now = current(holder);
      if (now === null) this.recent.delete(key);
      else if (now.base !== holder.base || now.limit !== holder.limit || now.epoch !== holder.epoch) this.touched(tag, [now]);
    }
  }

  /** Whether holders wait to be asked again (tests). */
  pendingRetries(): boolean {
    return this.retry.size > 0 || this.retryTimer !== null;
  }

  /** Resolves once the queue is empty and no check runs (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running || this.timer) {
      if (this.timer) {
        clearTimeout(this.timer);
        this.timer = null;
        this.running = this.drain();
      }
      await this.running;
    }
  }

  /** Stops checking; a check under way finishes. */
  async close(): Promise<void> {
    this.closed = true;
    for (const t of [this.timer, this.retryTimer]) if (t) clearTimeout(t);
    this.timer = this.retryTimer = null;
    this.queued.clear();
    this.retry.clear();
    await this.running;
  }

  private schedule(): void {
    if (this.timer || this.running || this.queued.size === 0 || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.running = this.drain();
    }, this.o.checkDelayMs ?? CHECK_DELAY_MS);
    this.timer.unref();
  }

  private async drain(): Promise<void> {
    const batch = this.queued;
    this.queued = new Map();
    const byTag = new Map<string, Holder[]>();
    for (const { tag, holder } of batch.values()) {
      const list = byTag.get(tag);
      if (list) list.push(holder);
      else byTag.set(tag, [holder]);
    }
    const tags = [...byTag];
    for (let i = 0; i < tags.length; i += READS_AT_ONCE) {
      await Promise.all(tags.slice(i, i + READS_AT_ONCE).map(([tag, holders]) => this.check(tag, holders)));
    }
    this.running = null;
    this.schedule();
  }

  /** Reads one tag's holders and claims what they reached. Never rejects. */
  private async check(tag: string, holders: Holder[]): Promise<void> {
    const thresholds = this.o.thresholds();
    if (!thresholds) return;
    const pending = holders.filter((h) => !this.allSettled(tag, h, thresholds));
    if (pending.length === 0) return;
    let figures: AlertFigure[];
    try {
      figures = await this.o.store.ledger({ tag, holders: pending, sharedOnly: true });
    } catch (err) {
      if (!this.storeFailing) this.o.log.warn({ err: err instanceof Error ? err.message : String(err), retry_ms: this.o.claimRetryMs ?? CLAIM_RETRY_MS }, 'budget alert check failed; checking again until the limits store answers');
      this.storeFailing = true;
      for (const holder of pending) this.retryLater(tag, holder);
      return;
    }
    if (this.storeFailing) this.o.log.info({}, 'budget alert checks resumed');
    this.storeFailing = false;
    const claims: Promise<void>[] = [];
    for (const holder of pending) {
      const figure = figures.find((f) => f.id === holder.id);
      if (figure) claims.push(this.judge(tag, holder, figure, thresholds));
    }
    await Promise.all(claims);
  }

  /** Claims what the figure reached; a wallet's is judged against its balance at the epoch as first recorded. */
  private async judge(tag: string, holder: Holder, figure: AlertFigure, thresholds: readonly number[]): Promise<void> {
    // The store has an epoch this replica has not: its budget is not yet known here.
    if (figure.epoch > holder.epoch) return this.retryLater(tag, holder);
    if (holder.kind !== 'wallet') return this.claimReached(tag, holder, figure, thresholds);
    let start: string | null;
    try {
      start = await this.o.store.claimedBy({ tag, holder: holder.id, epoch: figure.epoch, name: WALLET_START, token: String(Math.round(figure.start * NANO)), ttlMs: CLAIM_TTL_MS });
    } catch {
      return this.retryLater(tag, holder);
    }
    if (start === null) return; // an older epoch than the store's: the figures are stale
    return this.claimReached(tag, holder, { ...figure, start: Number(start) / NANO }, thresholds);
  }

  private allSettled(tag: string, holder: Holder, thresholds: readonly number[]): boolean {
    const done = this.settled.get(`${entryKey(tag, holder.id)}\u0000${holder.epoch}`);
    return done !== undefined && thresholds.every((t) => done.has(t));
  }

  /** Claims the reached thresholds in ascending order; stops at one the store cannot answer, to keep the order. */
  private async claimReached(tag: string, holder: Holder, figure: AlertFigure, thresholds: readonly number[]): Promise<void> {
    const where = standing(holder, figure, thresholds);
    if (!where) return;
    const epochKey = `${entryKey(tag, holder.id)}\u0000${figure.epoch}`;
    for (const threshold of where.reached) {
      const done = this.settled.get(epochKey);
      if (done?.has(threshold)) continue;
      const tokenKey = `${epochKey}\u0000${threshold}`;
      const token = this.tokens.get(tokenKey) ?? randomUUID();
      const claim: ClaimRef = { tag, holder: holder.id, epoch: figure.epoch, name: `alert:${threshold}`, token };
      const answer = await this.o.store.claimOnce({ ...claim, ttlMs: CLAIM_TTL_MS, pendingMs: this.o.pendingMs }).catch(() => 'unavailable' as const);
      if (answer === 'held') {
        // Another instance is delivering it: asked again later, taken over if it stops.
        this.retryLater(tag, holder);
        return;
      }
      if (answer === 'unavailable') {
        if (this.tokens.size >= MAX_TOKENS) this.tokens.clear();
        this.tokens.set(tokenKey, token);
        this.retryLater(tag, holder);
        return;
      }
      this.tokens.delete(tokenKey);
      this.markSettled(epochKey, threshold);
      if (answer === 'claimed') {
        const at = (this.o.now ?? Date.now)();
        this.o.found({ holder: holder.id, threshold, budget: where.budget, spent: where.spent, period: holder.period ?? null, epoch: figure.epoch, at }, claim);
      }
    }
  }

  private markSettled(epochKey: string, threshold: number): void {
    let done = this.settled.get(epochKey);
    if (!done) {
      if (this.settled.size >= MAX_SETTLED) this.settled.clear();
      this.settled.set(epochKey, (done = new Set()));
    }
    done.add(threshold);
  }

  private retryLater(tag: string, holder: Holder): void {
    if (this.closed) return;
    this.retry.set(entryKey(tag, holder.id), { tag, holder });
    if (this.retryTimer) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      const again = this.retry;
      this.retry = new Map();
      for (const { tag: t, holder: h } of again.values()) {
        // Asked again with the replica's figures now: its base may have caught up meanwhile.
        const now = this.o.current ? this.o.current(h) : h;
        if (now !== null) this.touched(t, [now]);
      }
    }, this.o.claimRetryMs ?? CLAIM_RETRY_MS);
    this.retryTimer.unref();
  }
}

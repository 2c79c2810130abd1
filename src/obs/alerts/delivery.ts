/**
 * Delivering budget alerts (DESIGN section 13): each event is POSTed to the webhook in the
 * background, retried with backoff until an attempt fails at least `retryWindowMs` after its
 * first attempt, then logged and counted as failed. Events of one holder go in the order
 * they were found (the next waits for the one before); holders do not wait for each other,
 * and a few attempts run at once. The queue is bounded: an event past it is dropped, logged
 * and counted as failed. No request ever waits on any of this. Each event tells its claim
 * what became of it (watch.ts, ClaimRef): one given up early is another instance's to send.
 * Its claim is renewed before each attempt and, while it waits, every `claimRenewMs`: a
 * claim left pending past its time is another instance's to take over, and an event whose
 * claim another instance holds now is left to that instance (sent once, not twice).
 *
 * Logs name the holder, threshold and epoch, never the webhook URL (it may carry a token),
 * the secret or the body's signature.
 */
import type { LogSink } from '../../log.js';

/** The retry schedule and bounds; the defaults are the operated ones, tests shorten them. */
export interface DeliveryTuning {
  /** wait after the first failed attempt; doubled after each failure... */
  firstRetryMs?: number;
  /** ...up to this */
  maxRetryMs?: number;
  /** an event is given up once an attempt fails this long (or longer) after its first attempt */
  retryWindowMs?: number;
  /** one attempt, answer included */
  attemptTimeoutMs?: number;
  /** events waiting or in flight; one more is dropped */
  maxQueued?: number;
  /** attempts in flight at once */
  concurrency?: number;
  /** how often the claims of waiting events are renewed (below the time a claim stays pending) */
  claimRenewMs?: number;
}

export const DELIVERY_DEFAULTS: Required<DeliveryTuning> = {
  firstRetryMs: 1_000,
  maxRetryMs: 60_000,
  retryWindowMs: 600_000,
  attemptTimeoutMs: 10_000,
  maxQueued: 1_000,
  concurrency: 4,
  claimRenewMs: 40_000,
};

/** One event, ready to send: its body is final, so every attempt carries the same bytes and signature. */
export interface Outgoing {
  url: string;
  body: string;
  headers: Record<string, string>;
  /** events with the same lane are sent in order: the holder */
  lane: string;
  /** what logs say of it */
  about: Record<string, unknown>;
  /**
   * Tells the event's claim (watch.ts, ClaimRef) what became of it; resolves false when another
   * instance holds the claim now (it took the claim over), else true; never rejects.
   */
  claim?: (turn: ClaimTurn) => Promise<boolean>;
}

/** `renew`: still being delivered; `done`: delivered, or given up after its window; `release`: given up early (a shutdown, a full queue). */
export type ClaimTurn = 'renew' | 'done' | 'release';

interface Pending extends Outgoing {
  /**
   * performance.now() of its first attempt: its retry window starts there, not when it was
   * queued, so an event waiting behind its holder's earlier one still gets a window of its own
   */
  firstAttemptAt: number;
  attempts: number;
  /** performance.now() of the next attempt */
  dueAt: number;
  /** its attempt started while closing: the last one */
  last: boolean;
  /** an attempt (its claim's renewal included) is under way */
  attempting: boolean;
}

export class Delivery {
  private readonly t: Required<DeliveryTuning>;
  /** each holder's events, oldest first; the head is the one being sent or waiting to be */
  private readonly lanes = new Map<string, Pending[]>();
  private readonly busy = new Set<string>();
  private readonly aborts = new Set<AbortController>();
  private readonly attempts = new Set<Promise<void>>();
  private queued = 0;
  private inFlight = 0;
  private timer: NodeJS.Timeout | null = null;
  /** renews waiting events' claims while any event is queued */
  private keeper: NodeJS.Timeout | null = null;
  private closing = false;
  /** past close's deadline: no attempt starts any more */
  private stopped = false;
  private sent = 0;
  private failed = 0;
  /** told once nothing is queued or in flight */
  private readonly emptied = new Set<() => void>();
  /** claims told what became of their events, awaited by close */
  private readonly told = new Set<Promise<boolean>>();

  constructor(
    private readonly log: LogSink,
    tuning: DeliveryTuning = {},
  ) {
    this.t = { ...DELIVERY_DEFAULTS, ...tuning };
  }

  add(event: Outgoing): void {
    if (this.queued >= this.t.maxQueued || this.closing) {
      this.failed++;
      this.log.warn({ ...event.about, reason: this.closing ? 'shutting down' : 'alert queue full' }, 'budget alert not delivered');
      void this.tell(event, 'release');
      return;
    }
    const now = performance.now();
    const p: Pending = { ...event, firstAttemptAt: now, attempts: 0, dueAt: now, last: false, attempting: false };
    const lane = this.lanes.get(event.lane);
    if (lane) lane.push(p);
    else this.lanes.set(event.lane, [p]);
    this.queued++;
    if (!this.keeper) {
      this.keeper = setInterval(() => this.keepClaims(), this.t.claimRenewMs);
      this.keeper.unref();
    }
    this.pump();
  }

  stats(): { sent: number; failed: number; queued: number } {
    return { sent: this.sent, failed: this.failed, queued: this.queued };
  }

  /** Resolves once every event is sent or given up. */
  idle(): Promise<void> {
    if (this.queued === 0) return Promise.resolve();
    return new Promise((resolve) => this.emptied.add(resolve));
  }

  /**
   * Gives every waiting event one last attempt now, waits up to `timeoutMs` for the attempts,
   * and counts what is left as failed.
   */
  async close(timeoutMs: number): Promise<void> {
    this.closing = true;
    for (const lane of this.lanes.values()) for (const p of lane) p.dueAt = 0;
    this.pump();
    if (this.queued > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.idle(), new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))]);
      clearTimeout(timer);
    }
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    if (this.keeper) clearInterval(this.keeper);
    this.keeper = null;
    // Attempts still under way are cut short and give their events up themselves.
    for (const a of this.aborts) a.abort();
    await Promise.all(this.attempts);
    for (const lane of this.lanes.values()) for (const p of lane) this.giveUp(p, 'shutting down');
    this.lanes.clear();
    this.queued = 0;
    this.wake();
    await Promise.all(this.told);
  }

  /** Starts every attempt that is due and has room; arms a timer for the next one due. */
  private pump(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.stopped) return;
    const now = performance.now();
    let next = Infinity;
    for (const [name, lane] of this.lanes) {
      if (this.busy.has(name)) continue;
      const head = lane[0]!;
      if (head.dueAt > now) {
        next = Math.min(next, head.dueAt);
        continue;
      }
      if (this.inFlight >= this.t.concurrency && !this.closing) return;
      this.busy.add(name);
      this.inFlight++;
      const attempt = this.attempt(name, head).finally(() => this.attempts.delete(attempt));
      this.attempts.add(attempt);
    }
    if (next !== Infinity) {
      this.timer = setTimeout(() => this.pump(), Math.max(0, next - now));
      this.timer.unref();
    }
  }

  private async attempt(name: string, p: Pending): Promise<void> {
    p.attempting = true;
    if (p.attempts === 0) p.firstAttemptAt = performance.now();
    const ours = await this.tell(p, 'renew');
    p.attempts++;
    p.last = this.closing;
    const problem = ours ? await this.post(p) : null;
    this.busy.delete(name);
    this.inFlight--;
    p.attempting = false;
    const now = performance.now();
    if (!ours) {
      this.leave(name, p);
    } else if (problem === null) {
      this.sent++;
      this.log.info({ ...p.about, attempts: p.attempts }, 'budget alert sent');
      void this.tell(p, 'done');
      this.done(name);
    } else if (p.last || (!this.closing && now - p.firstAttemptAt >= this.t.retryWindowMs)) {
      this.giveUp(p, problem);
      this.done(name);
    } else {
      // Closing: an attempt under way when it began failed; the last one goes now.
      p.dueAt = this.closing ? 0 : now + Math.min(this.t.maxRetryMs, this.t.firstRetryMs * 2 ** (p.attempts - 1));
    }
    this.pump();
  }

  /** One POST: null when the webhook took it (2xx), else what went wrong. */
  private async post(p: Pending): Promise<string | null> {
    const abort = new AbortController();
    this.aborts.add(abort);
    try {
      const res = await fetch(p.url, {
        method: 'POST',
        body: p.body,
        headers: p.headers,
        redirect: 'manual',
        signal: AbortSignal.any([abort.signal, AbortSignal.timeout(this.t.attemptTimeoutMs)]),
      });
      await res.body?.cancel();
      return res.status >= 200 && res.status < 300 ? null : `HTTP ${res.status}`;
    } catch (err) {
      return problemOf(err);
    } finally {
      this.aborts.delete(abort);
    }
  }

  /** `p` (its lane's head unless given) is over. */
  private done(name: string, p?: Pending): void {
    const lane = this.lanes.get(name)!;
    lane.splice(p ? lane.indexOf(p) : 0, 1);
    if (lane.length === 0) this.lanes.delete(name);
    this.queued--;
    this.wake();
  }

  /** Renews the claim of every event waiting (not being attempted); one another instance took over is left to it. */
  private keepClaims(): void {
    for (const [name, lane] of this.lanes) {
      for (const p of lane) {
        if (p.attempting) continue;
        void this.tell(p, 'renew').then((ours) => {
          if (ours || p.attempting || !this.lanes.get(name)?.includes(p)) return;
          this.leave(name, p);
          this.pump();
        });
      }
    }
  }

  /** Another instance holds the event's claim now, and sends it: not sent here, nor failed. */
  private leave(name: string, p: Pending): void {
    this.log.info({ ...p.about, attempts: p.attempts }, 'budget alert left to the instance that took its claim over');
    this.done(name, p);
  }

  /** Tells idle() waiters once nothing is left. */
  private wake(): void {
    if (this.queued > 0) return;
    if (this.keeper) clearInterval(this.keeper);
    this.keeper = null;
    for (const resolve of this.emptied) resolve();
    this.emptied.clear();
  }

  /** Given up: after its retry window the claim is done; before it (closing) another instance may send it. */
  private giveUp(p: Pending, reason: string): void {
    this.failed++;
    this.log.warn({ ...p.about, attempts: p.attempts, reason }, 'budget alert not delivered');
    void this.tell(p, this.closing ? 'release' : 'done');
  }

  /** Whether the claim is still this instance's (true when the event has none). */
  private tell(event: Outgoing, turn: ClaimTurn): Promise<boolean> {
    if (!event.claim) return Promise.resolve(true);
    const told: Promise<boolean> = event.claim(turn).finally(() => this.told.delete(told));
    this.told.add(told);
    return told;
  }
}

/** A failed fetch's cause (`ECONNREFUSED`, a timeout, the cut at shutdown), without the URL. */
function problemOf(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  if (err.name === 'TimeoutError') return 'no answer in time';
  if (err.name === 'AbortError') return 'shutting down';
  const code = (err.cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' ? code : err.message;
}

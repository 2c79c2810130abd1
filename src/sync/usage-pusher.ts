/**
 * Pushes usage events to the console (POST /sync/v1/usage, NDJSON) in batches. Events
 * wait in a bounded buffer until the console acknowledges them; a failed push is retried
 * with backoff and jitter (the console ignores repeated request ids, so a retry after a
 * lost answer does not charge twice). What cannot be kept is counted, never silently lost:
 * `dropped` when the buffer is full or events remain at stop, `rejected` when the console
 * refuses a batch outright (4xx), which no retry would fix.
 *
 * After a long outage the backoff has grown to tens of seconds; the sync client notices the
 * console first and calls `nudge()`, which sends what is buffered after a random delay of at
 * most `nudgeJitterMs`, so a fleet that lost the console together does not return in one burst.
 */
import { backoffDelay, type BackoffOptions } from './backoff.js';
import { USAGE_PATH } from '../protocol/records.js';
import type { UsageEvent } from '../protocol/usage.js';
import type { LogSink } from '../log.js';

export interface UsagePusherOptions {
  url: string;
  token: string;
  /** most events held; beyond it new events are dropped and counted */
  maxBuffer: number;
  /** most events per request */
  batchSize: number;
  /** how often buffered events are sent when fewer than batchSize wait */
  flushMs: number;
  fetch?: typeof fetch;
  log?: LogSink;
  backoff?: BackoffOptions;
  /** per-request timeout */
  timeoutMs?: number;
  /** longest random delay before a nudged push; default 1000 */
  nudgeJitterMs?: number;
  /** clock of the retry schedule (ms); default Date.now */
  now?: () => number;
}

export interface UsageStats {
  buffered: number;
  sent: number;
  dropped: number;
  rejected: number;
  /** failed pushes (each retried) */
  failures: number;
}

export interface UsagePusher {
  push(ev: UsageEvent): void;
  /** Sends everything buffered now; stops at the first failure (the timer retries later). */
  flush(): Promise<void>;
  /**
   * The console answers again: send what is buffered within nudgeJitterMs, whatever the
   * backoff says. One send at a time still, so no event goes out twice from here.
   */
  nudge(): void;
  /** Stops the timer and makes a last attempt; whatever is still unsent is counted as dropped. */
  stop(): Promise<void>;
  stats(): UsageStats;
}

/**
 * The console read the batch and will never take it (400, 422). Any other refusal may pass
 * later: a 404 or 503 from an ingress while the console redeploys, a token being rolled
 * out (401, 403), throttling (429); those are retried with backoff, and 413 with smaller
 * batches.
 */
function refusedForGood(status: number): boolean {
  return status === 400 || status === 422;
}

class BatchPusher implements UsagePusher {
  private readonly endpoint: string;
  private readonly doFetch: typeof fetch;
  private readonly now: () => number;
  private readonly buffer: UsageEvent[] = [];
  private readonly counts = { sent: 0, dropped: 0, rejected: 0, failures: 0 };
  /** failed sends in a row: the backoff step */
  private consecutive = 0;
  /** events a batch carries: halved on each 413, back to batchSize after a batch is taken */
  private size: number;
  private retryAt = 0;
  /** one drain at a time, so a batch is never sent twice or spliced twice */
  private draining: Promise<void> | null = null;
  private stopped = false;
  private nudgeTimer: NodeJS.Timeout | null = null;
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly opts: UsagePusherOptions) {
    this.endpoint = `${opts.url.replace(/\/+$/, '')}${USAGE_PATH}`;
    this.size = opts.batchSize;
    this.doFetch = opts.fetch ?? fetch;
    this.now = opts.now ?? Date.now;
    this.timer = setInterval(() => {
      if (this.draining || this.buffer.length === 0 || this.now() < this.retryAt) return;
      void this.drain();
    }, opts.flushMs);
    this.timer.unref();
  }

  push(ev: UsageEvent): void {
    if (this.stopped || this.buffer.length >= this.opts.maxBuffer) {
      const dropped = ++this.counts.dropped;
      if (dropped === 1 || dropped % 1000 === 0) this.opts.log?.warn({ dropped, maxBuffer: this.opts.maxBuffer }, 'usage buffer full; events dropped');
      return;
    }
    this.buffer.push(ev);
    if (this.buffer.length >= this.opts.batchSize && !this.draining && this.now() >= this.retryAt) void this.drain();
  }

  async flush(): Promise<void> {
    if (this.draining) await this.draining;
    await this.drain();
  }

  nudge(): void {
    if (this.stopped || this.nudgeTimer || this.buffer.length === 0 || (this.consecutive === 0 && this.now() >= this.retryAt)) return;
    const random = this.opts.backoff?.random ?? Math.random;
    const delay = Math.round(random() * (this.opts.nudgeJitterMs ?? 1_000));
    const go = (): void => {
      // A failure from here backs off from the start again: the console was just seen.
      this.consecutive = 0;
      this.retryAt = 0;
      if (!this.stopped && this.buffer.length > 0) void this.drain();
    };
    this.nudgeTimer = setTimeout(() => {
      this.nudgeTimer = null;
      // An attempt still under way (it may fail and set a long backoff) goes first.
      if (this.draining) void this.draining.then(go);
      else go();
    }, delay);
    this.nudgeTimer.unref();
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.timer);
    if (this.nudgeTimer) clearTimeout(this.nudgeTimer);
    if (this.draining) await this.draining;
    await this.drain();
    if (this.buffer.length > 0) {
      this.counts.dropped += this.buffer.length;
      this.opts.log?.error({ dropped: this.buffer.length }, 'usage events not delivered before stop');
      this.buffer.length = 0;
    }
  }

  stats(): UsageStats {
    return { buffered: this.buffer.length, ...this.counts };
  }

  private drain(): Promise<void> {
    if (this.draining) return this.draining;
    const run = this.sendAll();
    this.draining = run;
    // Cleared once it has run, never before it is stored: a drain with nothing to send
    // ends at once, and clearing inside it would leave the finished drain stored for good.
    const clear = (): void => {
      if (this.draining === run) this.draining = null;
    };
    void run.then(clear, clear);
    return run;
  }

  private async sendAll(): Promise<void> {
    while (this.buffer.length > 0 && (await this.sendBatch()));
  }

  /** Sends the oldest batch; true when the console took it (or refused it for good). */
  private async sendBatch(): Promise<boolean> {
    const batch = this.buffer.slice(0, this.size);
    if (batch.length === 0) return true;
    try {
      const res = await this.doFetch(this.endpoint, {
        method: 'POST',
        // The wall clock that stamped the events' `at`: the console reads the two clocks' skew from it.
        headers: { authorization: `Bearer ${this.opts.token}`, 'content-type': 'application/x-ndjson', date: new Date().toUTCString() },
        body: batch.map((e) => JSON.stringify(e)).join('\n') + '\n',
        signal: AbortSignal.timeout(this.opts.timeoutMs ?? 10_000),
      });
      await res.arrayBuffer().catch(() => undefined);
      // Too large for the console: the same events go again in halves; one event alone is refused for good.
      if (res.status === 413 && batch.length > 1) {
        this.size = Math.ceil(batch.length / 2);
        return true;
      }
      if (!res.ok && res.status !== 413 && !refusedForGood(res.status)) throw new Error(`console answered ${res.status}`);
      this.settled(batch.length, res.ok ? null : res.status);
      if (res.ok) this.size = this.opts.batchSize;
      return true;
    } catch (err) {
      this.failed(err as Error);
      return false;
    }
  }

  /** The console answered a batch for good: taken, or refused with `refusedWith`. */
  private settled(events: number, refusedWith: number | null): void {
    // Events stay buffered until acknowledged, so the buffer bound also covers events in flight.
    this.buffer.splice(0, events);
    if (refusedWith === null) this.counts.sent += events;
    else {
      this.counts.rejected += events;
      this.opts.log?.error({ status: refusedWith, events }, 'console refused a usage batch; events not retried');
    }
    this.consecutive = 0;
    this.retryAt = 0;
  }

  private failed(err: Error): void {
    this.counts.failures++;
    this.consecutive++;
    const delay = backoffDelay(this.consecutive, this.opts.backoff);
    this.retryAt = this.now() + delay;
    if (this.consecutive === 1 || this.consecutive % 20 === 0) {
      this.opts.log?.warn({ err: err.message, buffered: this.buffer.length, retryInMs: delay }, 'usage push failed; will retry');
    }
  }
}

export function createUsagePusher(opts: UsagePusherOptions): UsagePusher {
  return new BatchPusher(opts);
}

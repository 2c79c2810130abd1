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

export function createUsagePusher(opts: UsagePusherOptions): UsagePusher {
  const endpoint = `${opts.url.replace(/\/+$/, '')}${USAGE_PATH}`;
  const doFetch = opts.fetch ?? fetch;
  const log = opts.log;
  const now = opts.now ?? Date.now;
  const random = opts.backoff?.random ?? Math.random;
  const buffer: UsageEvent[] = [];
  const stats = { sent: 0, dropped: 0, rejected: 0, failures: 0 };
  let consecutive = 0;
  let retryAt = 0;
  /** one drain at a time, so a batch is never sent twice or spliced twice */
  let draining: Promise<void> | null = null;
  let stopped = false;
  let nudgeTimer: NodeJS.Timeout | null = null;

  /** Sends the oldest batch; true when the console took it (or refused it for good). */
  async function sendBatch(): Promise<boolean> {
    const batch = buffer.slice(0, opts.batchSize);
    if (batch.length === 0) return true;
    try {
      const res = await doFetch(endpoint, {
        method: 'POST',
        headers: { authorization: `Bearer ${opts.token}`, 'content-type': 'application/x-ndjson' },
        body: batch.map((e) => JSON.stringify(e)).join('\n') + '\n',
        signal: AbortSignal.timeout(opts.timeoutMs ?? 10_000),
      });
      await res.arrayBuffer().catch(() => undefined);
      if (res.ok || (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429 && res.status !== 401 && res.status !== 403)) {
        // Events stay buffered until acknowledged, so the buffer bound also covers events in flight.
        buffer.splice(0, batch.length);
        if (res.ok) stats.sent += batch.length;
        else {
          stats.rejected += batch.length;
          log?.error({ status: res.status, events: batch.length }, 'console refused a usage batch; events not retried');
        }
        consecutive = 0;
        retryAt = 0;
        return true;
      }
      throw new Error(`console answered ${res.status}`);
    } catch (err) {
      stats.failures++;
      consecutive++;
      const delay = backoffDelay(consecutive, opts.backoff);
      retryAt = now() + delay;
      if (consecutive === 1 || consecutive % 20 === 0) {
        log?.warn({ err: (err as Error).message, buffered: buffer.length, retryInMs: delay }, 'usage push failed; will retry');
      }
      return false;
    }
  }

  function drain(): Promise<void> {
    draining ??= (async () => {
      try {
        while (buffer.length > 0 && (await sendBatch()));
      } finally {
        draining = null;
      }
    })();
    return draining;
  }

  const timer = setInterval(() => {
    if (draining || buffer.length === 0 || now() < retryAt) return;
    void drain();
  }, opts.flushMs);
  timer.unref();

  return {
    push(ev) {
      if (stopped || buffer.length >= opts.maxBuffer) {
        stats.dropped++;
        if (stats.dropped === 1 || stats.dropped % 1000 === 0) log?.warn({ dropped: stats.dropped, maxBuffer: opts.maxBuffer }, 'usage buffer full; events dropped');
        return;
      }
      buffer.push(ev);
      if (buffer.length >= opts.batchSize && !draining && now() >= retryAt) void drain();
    },
    async flush() {
      if (draining) await draining;
      await drain();
    },
    nudge() {
      if (stopped || nudgeTimer || buffer.length === 0 || (consecutive === 0 && now() >= retryAt)) return;
      const delay = Math.round(random() * (opts.nudgeJitterMs ?? 1_000));
      const go = (): void => {
        // A failure from here backs off from the start again: the console was just seen.
        consecutive = 0;
        retryAt = 0;
        if (!stopped && buffer.length > 0) void drain();
      };
      nudgeTimer = setTimeout(() => {
        nudgeTimer = null;
        // An attempt still under way (it may fail and set a long backoff) goes first.
        if (draining) void draining.then(go);
        else go();
      }, delay);
      nudgeTimer.unref();
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      clearInterval(timer);
      if (nudgeTimer) clearTimeout(nudgeTimer);
      if (draining) await draining;
      await drain();
      if (buffer.length > 0) {
        stats.dropped += buffer.length;
        log?.error({ dropped: buffer.length }, 'usage events not delivered before stop');
        buffer.length = 0;
      }
    },
    stats() {
      return { buffered: buffer.length, ...stats };
    },
  };
}

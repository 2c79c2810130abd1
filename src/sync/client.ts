/**
 * The sidecar's sync client (DESIGN section 7): a snapshot at start and after a 410, then
 * long-poll changes, each applied atomically by the target it is given (the replica's
 * sync target applies large ones off the event loop). On any error it backs off with
 * jitter and tries again, and the replica keeps serving its last good state meanwhile.
 */
import { backoffDelay, sleep, type BackoffOptions } from './backoff.js';
import { CHANGES_PATH, SNAPSHOT_PATH } from '../protocol/records.js';
import { InvalidBatchError, type ChangesApplied, type ReplicaWriter } from '../protocol/writer.js';
import { quiet, type LogSink } from '../log.js';

export { createUsagePusher, type UsagePusher, type UsagePusherOptions, type UsageStats } from './usage-pusher.js';

export interface SyncClientOptions {
  /** console base URL, e.g. http://127.0.0.1:7000 */
  url: string;
  token: string;
  /** long-poll wait the console is asked for (0..60000) */
  waitMs: number;
  /** where snapshots and batches go; the composition root hands in the replica's sync target */
  target: ReplicaWriter;
  log?: LogSink;
  now?: () => number;
  fetch?: typeof fetch;
  backoff?: BackoffOptions;
  /** a snapshot that sends no byte for this long is abandoned (and retried) */
  idleTimeoutMs?: number;
  /** called when the console answers after it was away (and at the first success) */
  onConnected?: () => void;
}

export interface SyncStatus {
  /** replica version (null before the first snapshot or import) */
  version: number | null;
  /** when the console last answered successfully (ms since epoch), empty long polls included */
  lastSyncAt: number | null;
  /**
   * Up to when the replica is known to hold what the console holds: now while a connected
   * console holds a long poll open (it answers at once with any change), no longer than
   * waitMs and a margin past its start; else lastSyncAt.
   */
  currentAsOf: number | null;
  lastError: string | null;
  /** the last exchange with the console succeeded */
  connected: boolean;
  /** consecutive failures since the last success */
  failures: number;
  snapshots: number;
  lastSnapshot: { version: number; keys: number; totalMs: number } | null;
}

export interface SyncClient {
  /** Starts syncing; resolves after the first successful sync, or when stopped first. Never rejects. */
  start(): Promise<void>;
  /** Ends the loop, abandoning a long poll or a snapshot in progress (the replica keeps its last good state). */
  stop(): Promise<void>;
  status(): SyncStatus;
}

/** How long past waitMs a long poll may stay open and still count as the console's "nothing new". */
const POLL_MARGIN_MS = 5_000;
/** Longest pause between sync attempts while the console is away. */
const RETRY_MAX_MS = 2_000;
/**
 * With `console.waitMs: 0` (no long poll), the pause after a poll that brought nothing: a
 * change (a deleted key) still applies within a second, and a fleet never polls its
 * console in a loop.
 */
const SHORT_POLL_MS = 500;

class HttpError extends Error {
  constructor(readonly status: number, what: string) {
    super(status === 401 || status === 403 ? `console rejected the sync token on ${what} (${status})` : `console answered ${status} on ${what}`);
  }
}

/** A readable reason for a fetch failure: fetch's own message is only "fetch failed". */
function reason(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ? `${err.message}: ${cause.code ?? cause.message}` : err.message;
}

/** Passes a snapshot body through, refreshing the stall timer on every chunk. */
async function* watched(stream: ReadableStream<Uint8Array>, idle: NodeJS.Timeout): AsyncGenerator<Uint8Array> {
  for await (const chunk of stream) {
    idle.refresh();
    yield chunk;
  }
}

type Counters = Omit<SyncStatus, 'version' | 'currentAsOf'>;

class SyncLoop implements SyncClient {
  private readonly base: string;
  private readonly log: LogSink;
  private readonly now: () => number;
  private readonly doFetch: typeof fetch;
  private readonly headers: Record<string, string>;
  private readonly idleMs: number;
  private readonly backoff: BackoffOptions;
  private readonly stopper = new AbortController();
  private readonly st: Counters = { lastSyncAt: null, lastError: null, connected: false, failures: 0, snapshots: 0, lastSnapshot: null };
  private loop: Promise<void> | null = null;
  /** when the long poll in flight was sent, while the exchange before it succeeded */
  private pollSentAt: number | null = null;
  private markFirst: () => void = () => {};
  /** resolves after the first successful sync, or when stopped first */
  private readonly first = new Promise<void>((resolve) => (this.markFirst = resolve));

  constructor(private readonly opts: SyncClientOptions) {
    this.base = opts.url.replace(/\/+$/, '');
    this.log = opts.log ?? quiet;
    this.now = opts.now ?? Date.now;
    this.doFetch = opts.fetch ?? fetch;
    this.headers = { authorization: `Bearer ${opts.token}` };
    this.idleMs = opts.idleTimeoutMs ?? 30_000;
    // Retries while the console is away stay short (at most RETRY_MAX_MS apart, jittered): a
    // console that returns is seen within seconds, and a failing GET is cheap for it.
    this.backoff = { maxMs: RETRY_MAX_MS, ...opts.backoff };
  }

  start(): Promise<void> {
    this.loop ??= this.run().finally(() => this.markFirst());
    return this.first;
  }

  async stop(): Promise<void> {
    this.stopper.abort(new Error('sync client stopped'));
    this.markFirst();
    await this.loop;
  }

  status(): SyncStatus {
    const t = this.now();
    const held = this.pollSentAt !== null && this.st.connected && t - this.pollSentAt <= this.opts.waitMs + POLL_MARGIN_MS;
    return { version: this.opts.target.version(), ...this.st, currentAsOf: held ? t : this.st.lastSyncAt };
  }

  private async run(): Promise<void> {
    let needSnapshot = true;
    while (!this.stopper.signal.aborted) {
      try {
        const version = this.opts.target.version();
        if (needSnapshot || version === null) {
          await this.snapshot();
          needSnapshot = false;
        } else if ((await this.pollAt(version)) === 'gone') {
          this.log.info({ version }, 'console no longer holds changes after our version; taking a snapshot');
          needSnapshot = true;
        }
        this.succeeded();
      } catch (err) {
        if (this.stopper.signal.aborted) break;
        // The console sent a batch this replica cannot apply; retrying it would fail again, so a snapshot follows.
        if (err instanceof InvalidBatchError) needSnapshot = true;
        await sleep(this.failed(err), this.stopper.signal);
      }
    }
  }

  private succeeded(): void {
    const st = this.st;
    const returned = st.failures > 0 || !st.connected;
    if (returned) this.log.info({ version: this.opts.target.version() }, 'console sync connected');
    st.lastSyncAt = this.now();
    st.connected = true;
    st.failures = 0;
    st.lastError = null;
    this.markFirst();
    if (returned) this.opts.onConnected?.();
  }

  /** Counts a failure and returns how long to wait before the next attempt. */
  private failed(err: unknown): number {
    const st = this.st;
    st.failures++;
    st.connected = false;
    st.lastError = reason(err);
    const delay = backoffDelay(st.failures, this.backoff);
    // The first failure is worth a warning; a console that stays away is reported less loudly.
    const level = st.failures === 1 || st.failures % 20 === 0 ? 'warn' : 'debug';
    const version = this.opts.target.version();
    this.log[level]({ err: st.lastError, failures: st.failures, retryInMs: delay, version }, version === null ? 'console sync failed; no replica yet, not ready' : 'console sync failed; serving from the replica');
    return delay;
  }

  private async snapshot(): Promise<void> {
    const ctl = new AbortController();
    const signal = AbortSignal.any([this.stopper.signal, ctl.signal]);
    const idle = setTimeout(() => ctl.abort(new Error(`snapshot stalled for ${this.idleMs} ms`)), this.idleMs);
    try {
      const res = await this.doFetch(`${this.base}${SNAPSHOT_PATH}`, { headers: this.headers, signal });
      if (res.status !== 200 || !res.body) {
        await res.body?.cancel().catch(() => {});
        throw new HttpError(res.status, 'snapshot');
      }
      const applied = await this.opts.target.applySnapshot({ body: watched(res.body, idle), source: 'console', signal });
      this.st.snapshots++;
      this.st.lastSnapshot = { version: applied.version, keys: applied.keys, totalMs: applied.totalMs };
      this.log.info({ version: applied.version, keys: applied.keys, projects: applied.projects, wallets: applied.wallets, ms: applied.totalMs }, 'snapshot applied');
    } finally {
      clearTimeout(idle);
    }
  }

  private async pollAt(version: number): Promise<'ok' | 'gone'> {
    this.pollSentAt = this.now();
    try {
      return await this.poll(version);
    } finally {
      this.pollSentAt = null;
    }
  }

  /** One long poll. Returns 'gone' on 410 (a snapshot is due). */
  private async poll(after: number): Promise<'ok' | 'gone'> {
    const started = this.now();
    // After a failure, ask without waiting: an answer at once tells the console is back
    // (and the usage pusher can deliver) instead of after a whole long poll.
    const waitMs = this.st.connected ? this.opts.waitMs : 0;
    const signal = AbortSignal.any([this.stopper.signal, AbortSignal.timeout(waitMs + 15_000)]);
    const res = await this.doFetch(`${this.base}${CHANGES_PATH}?after=${after}&waitMs=${waitMs}`, { headers: this.headers, signal });
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => {});
      if (res.status === 410) return 'gone';
      throw new HttpError(res.status, 'changes');
    }
    const text = await res.text();
    const t = performance.now();
    const r: ChangesApplied = await this.opts.target.applyChangeText(text, 'console');
    if (r.applied || r.changes > 0) {
      this.log.debug({ version: r.version, changes: r.changes, ms: Math.round(performance.now() - t), offThread: r.offThread }, 'changes applied');
    }
    if (!r.applied && r.version <= after) {
      // An answer that moves nothing forward long before waitMs (a console shutting down, one
      // that ignores waitMs, or one answering with an older version): do not spin.
      if (waitMs > 0 && this.now() - started < waitMs / 10) await sleep(backoffDelay(1, this.backoff), this.stopper.signal);
      else if (this.opts.waitMs === 0) await sleep(SHORT_POLL_MS, this.stopper.signal);
    }
    return 'ok';
  }
}

export function createSyncClient(opts: SyncClientOptions): SyncClient {
  return new SyncLoop(opts);
}

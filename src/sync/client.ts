/**
 * The sidecar's sync client (DESIGN section 7): a snapshot at start and after a 410, then
 * long-poll changes, each applied atomically by the target it is given (the replica's
 * sync target applies large ones off the event loop). On any error it backs off with
 * jitter and tries again, and the replica keeps serving its last good state meanwhile.
 */
import { backoffDelay, sleep, type BackoffOptions } from './backoff.js';
import { CHANGES_PATH, SNAPSHOT_PATH } from '../protocol/records.js';
import { InvalidBatchError, UnusableDataError, type ChangesApplied } from '../protocol/writer.js';
import { quiet, type LogSink } from '../log.js';
import { MAX_CHANGES_BYTES, textUpTo, watched } from './bodies.js';

export { createUsagePusher, type UsagePusher, type UsagePusherOptions, type UsageStats } from './usage-pusher.js';

import type { SyncClient, SyncClientOptions, SyncStatus } from './sync-client-api.js';

export type { SyncClient, SyncClientOptions, SyncStatus } from './sync-client-api.js';

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
/**
 * Retries after data the console sent could not be applied (a record this version cannot
 * read, during a console-first upgrade): 2 s doubling to a minute, so a fleet does not
 * download whole snapshots every 2 s from a console that will send the same again.
 */
const UNUSABLE_BACKOFF: BackoffOptions = { baseMs: 2_000, maxMs: 60_000 };
type PollResult = 'ok' | 'gone' | 'older' | 'large';
/** Where the replica is: its version, and the console history that version belongs to (null: none named). */
interface Cursor {
  after: number;
  tag: string | null;
}

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
  /** failures in a row whose cause was data that could not be applied */
  private unusable = 0;
  /** a snapshot is due for an older answer; the version it brought, while nothing applied since */
  private olderAsked = false;
  private afterOlder: number | null = null;
  /** the version the last snapshot brought, until a poll after it succeeds */
  private snapshotGave: number | null = null;
  private loop: Promise<void> | null = null;
  /** when the long poll in flight was sent, while the exchange before it succeeded */
  private pollSentAt: number | null = null;
  /** ends the long poll in flight early (snapshotNow) */
  private pollCut: AbortController | null = null;
  private snapshotAsked = false;
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

  snapshotNow(): void {
    this.snapshotAsked = true;
    this.pollCut?.abort(new Error('a snapshot is needed now'));
  }

  private async run(): Promise<void> {
    let needSnapshot = true;
    while (!this.stopper.signal.aborted) {
      // Asked for during a poll (which it cut), a snapshot, or a wait after a failure.
      if (this.snapshotAsked) {
        this.snapshotAsked = false;
        needSnapshot = true;
      }
      try {
        const version = this.opts.target.version();
        // Read with the version, before any await: the pair names one place in one history.
        const tag = this.opts.target.tag?.() ?? null;
        if (!needSnapshot && version !== null && this.opts.target.needsSnapshot?.()) {
          this.log.error({ version }, 'the replica file was deleted or replaced while running: serving the file still open, and taking a snapshot into the one at replica.path');
          needSnapshot = true;
        }
        const snapshotting = needSnapshot || version === null;
        if (snapshotting) {
          await this.snapshot();
          needSnapshot = false;
          this.afterOlder = this.olderAsked ? this.opts.target.version() : null;
          this.olderAsked = false;
          this.snapshotGave = this.opts.target.version();
        } else {
          const result = await this.pollAt({ after: version, tag });
          // A console (or a proxy before it) that answers 410 to the version its own snapshot
          // just gave would have the fleet download snapshots back to back: the snapshot is
          // taken again after the wait for data that cannot be used.
          if (result === 'gone' && this.snapshotGave === version) {
            needSnapshot = true;
            throw new UnusableDataError(`console answered 410 to version ${version}, which its own snapshot just gave`);
          }
          this.snapshotGave = null;
          needSnapshot = this.snapshotDue(result, version);
          // A console whose changes contradict the snapshot it just sent: no snapshot loop, and
          // not current either (the replica is frozen until the console makes sense again).
          if (result === 'older' && !needSnapshot) throw new Error(`console answered changes older than its own snapshot's version ${version}`);
        }
        this.succeeded({ snapshotOnly: snapshotting });
      } catch (err) {
        if (this.stopper.signal.aborted) break;
        // The long poll was cut for a snapshot (snapshotNow): not a failure.
        if (this.snapshotAsked) continue;
        // The console sent a batch this replica cannot apply; retrying it would fail again, so a snapshot follows.
        if (err instanceof InvalidBatchError) needSnapshot = true;
        await sleep(this.failed(err), this.stopper.signal);
      }
    }
  }

  /** Whether a poll's answer calls for a snapshot, said in the log. */
  private snapshotDue(result: PollResult, version: number): boolean {
    if (result === 'gone') this.log.info({ version }, 'console no longer holds changes after our version; taking a snapshot');
    // A console restored from a backup, or another history: its changes after ours would be
    // skipped. Once: again right after that snapshot, the console contradicts itself.
    else if (result === 'older') {
      if (this.afterOlder === version) return false;
      this.log.warn({ version }, 'console answered a version older than the replica\'s (restored, or another history); taking a snapshot');
      this.olderAsked = true;
    } else if (result === 'large') this.log.info({ version, maxBytes: MAX_CHANGES_BYTES }, 'change page too large to read on the event loop; taking a snapshot');
    return result !== 'ok';
  }

  /**
   * A snapshot alone does not end a run of unusable data: when the console's changes after
   * it cannot be used either, the next snapshot waits longer each time (2 s doubling to a
   * minute), rather than every 2 s for as long as the console sends them.
   */
  private succeeded(o: { snapshotOnly: boolean }): void {
    const st = this.st;
    if (!o.snapshotOnly) this.unusable = 0;
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
    const unusable = err instanceof UnusableDataError;
    this.unusable = unusable ? this.unusable + 1 : 0;
    const delay = unusable ? backoffDelay(this.unusable, { ...UNUSABLE_BACKOFF, ...(this.backoff.random ? { random: this.backoff.random } : {}) }) : backoffDelay(st.failures, this.backoff);
    // The first failure is worth a warning; a console that stays away is reported less
    // loudly. Data that cannot be applied is an error each time (a minute apart at most).
    const level = unusable ? 'error' : st.failures === 1 || st.failures % 20 === 0 ? 'warn' : 'debug';
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
      this.log.info({ version: applied.version, keys: applied.keys, projects: applied.projects, wallets: applied.wallets, ms: applied.totalMs, offThread: applied.offThread }, 'snapshot applied');
    } finally {
      clearTimeout(idle);
    }
  }

  private async pollAt(cursor: Cursor): Promise<PollResult> {
    this.pollSentAt = this.now();
    try {
      return await this.poll(cursor);
    } finally {
      this.pollSentAt = null;
    }
  }

  /**
   * One long poll. Returns 'gone' on 410, 'older' for a version below `after`, 'large' for a
   * page past MAX_CHANGES_BYTES: each calls for a snapshot.
   */
  private async poll({ after, tag }: Cursor): Promise<PollResult> {
    const started = this.now();
    // After a failure, ask without waiting: an answer at once tells the console is back
    // (and the usage pusher can deliver) instead of after a whole long poll.
    const waitMs = this.st.connected ? this.opts.waitMs : 0;
    this.pollCut = new AbortController();
    const signal = AbortSignal.any([this.stopper.signal, this.pollCut.signal, AbortSignal.timeout(waitMs + 15_000)]);
    // With the tag, a console restored from a backup answers 410 to a version of the history it lost.
    const query = `after=${after}${tag === null ? '' : `&tag=${encodeURIComponent(tag)}`}&waitMs=${waitMs}`;
    const res = await this.doFetch(`${this.base}${CHANGES_PATH}?${query}`, { headers: this.headers, signal });
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => {});
      if (res.status === 410) return 'gone';
      throw new HttpError(res.status, 'changes');
    }
    const text = await textUpTo(res, MAX_CHANGES_BYTES);
    if (text === null) return 'large';
    const t = performance.now();
    const r: ChangesApplied = await this.opts.target.applyChangeText(text, 'console');
    if (r.applied || r.changes > 0) {
      this.log.debug({ version: r.version, changes: r.changes, ms: Math.round(performance.now() - t), offThread: r.offThread }, 'changes applied');
    }
    if (!r.applied && r.version < after) return 'older';
    // Said "not newer" of a batch past the version polled after: the file was written meanwhile
    // (a `keyward import`), or the replica's writes reach another file.
    if (!r.applied && r.version > after) throw new Error(`change batch ${r.version} was not applied, though the replica served version ${after} when it was asked for: the replica file was written by another process meanwhile, or its writes reach another file`);
    if (!r.applied && r.version === after) {
      // An answer that moves nothing forward long before waitMs (a console shutting down, or
      // one that ignores waitMs): do not spin.
      if (waitMs > 0 && this.now() - started < waitMs / 10) await sleep(backoffDelay(1, this.backoff), this.stopper.signal);
      else if (this.opts.waitMs === 0) await sleep(SHORT_POLL_MS, this.stopper.signal);
    }
    return 'ok';
  }
}

export function createSyncClient(opts: SyncClientOptions): SyncClient {
  return new SyncLoop(opts);
}

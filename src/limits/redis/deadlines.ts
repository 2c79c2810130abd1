/**
 * Deadlines of Redis calls. `bound` rejects a call of the limiter not answered within
 * timeoutMs (CallTimeoutError), as ioredis' `commandTimeout` would, and hands its late
 * answer to the caller's `late`, if any. Redis may still run a call after its deadline, and
 * the scripts that care check a deadline of their own (admit.lua's staleAfterMs, hold.lua's).
 * The failover guard (failover-guard.ts) starts its own deadlines on a second instance, with
 * an action of its own when one passes.
 *
 * Why not `commandTimeout`: it arms one timer per command and clears it on the answer, which
 * at a settlement call every tick is the largest share of what the Redis mode promotes to the
 * old generation (docs/performance.md, "Redis calls"). Here the running deadlines sit in
 * the cells of one array, and one sweep (every tenth of the timeout, 1 to 10 ms) expires the
 * overdue ones; it stops when none runs. A deadline expires between timeoutMs and
 * timeoutMs plus that period after its start.
 */
import { DenseSet } from '../../dense-set.js';

export class CallTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(`redis did not answer within ${timeoutMs} ms`);
    this.name = 'CallTimeoutError';
  }
}

/** One deadline: `expire` runs once its time has passed, unless cleared first. */
export interface Deadline {
  at: number;
  expire: () => void;
  /** its cell in the sweep's array, given back once: by clear() or by the sweep */
  cell: number;
  /** cleared, or expired: either way over */
  done: boolean;
}

export interface DeadlinesOptions {
  timeoutMs: number;
  /** the clock deadlines are read on (performance.now() by default) */
  now?: () => number;
  /**
   * told when a caller's `late` throws: the late answer arrives outside any caller's
   * promise chain, so a throw there would otherwise be an unhandled rejection, which ends
   * the process
   */
  onLateError?: (err: unknown) => void;
}

/** Deadlines timeoutMs after their start, all checked by one sweep (see the header). */
export class Deadlines {
  private readonly pending = new DenseSet<Deadline>();
  private timer: NodeJS.Timeout | null = null;
  private readonly timeoutMs: number;
  private readonly now: () => number;
  /** a tenth of the timeout, between 1 and 10 ms: the most an expiry comes late */
  private readonly sweepMs: number;
  private readonly sweep = (): void => this.expire();
  private readonly onLateError: (err: unknown) => void;

  constructor(opts: DeadlinesOptions) {
    this.timeoutMs = opts.timeoutMs;
    this.now = opts.now ?? (() => performance.now());
    this.onLateError = opts.onLateError ?? (() => undefined);
    this.sweepMs = Math.min(10, Math.max(1, Math.floor(opts.timeoutMs / 10)));
  }

  /** Deadlines running (neither cleared nor expired). */
  get size(): number {
    return this.pending.size;
  }

  /** Whether the sweep is running (only while a deadline runs, or until its next run). */
  get sweeping(): boolean {
    return this.timer !== null;
  }

  /** A deadline timeoutMs from now (or at `notAfter`, when sooner) that runs `expire` when it passes. */
  start(expire: () => void, notAfter = Infinity): Deadline {
    const d: Deadline = { at: Math.min(this.now() + this.timeoutMs, notAfter), expire, cell: -1, done: false };
    d.cell = this.pending.add(d);
    if (!this.timer) {
      this.timer = setInterval(this.sweep, this.sweepMs);
      this.timer.unref();
    }
    return d;
  }

  /** Ends `d` before it expires (nothing happens if it is over already). */
  clear(d: Deadline): void {
    if (d.done) return;
    d.done = true;
    this.pending.delete(d.cell);
  }

  /**
   * `call`'s answer, or a CallTimeoutError once timeoutMs have passed without one. A later
   * answer goes to `late` (else it is dropped): Redis may have granted what the caller no
   * longer waits for, and only the answer says so.
   */
  bound<T>(call: Promise<T>, late?: (answer: T) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const d = this.start(() => reject(new CallTimeoutError(this.timeoutMs)));
      call.then(
        (v) => {
          if (d.done) return this.lateAnswer(v, late);
          this.clear(d);
          resolve(v);
        },
        (err: unknown) => {
          if (d.done) return;
          this.clear(d);
          reject(err);
        },
      );
    });
  }

  private lateAnswer<T>(v: T, late?: (answer: T) => void): void {
    try {
      late?.(v);
    } catch (err) {
      this.onLateError(err);
    }
  }

  /** Expires every deadline whose time has passed; stops the sweep once none runs. */
  expire(): void {
    if (this.pending.size === 0) {
      if (this.timer) clearInterval(this.timer);
      this.timer = null;
      return;
    }
    const t = this.now();
    this.pending.forEach((d) => {
      if (d.at > t) return;
      this.clear(d);
      d.expire();
    });
  }
}

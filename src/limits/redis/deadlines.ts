/**
 * The deadline of every Redis call the limiter makes: a call not answered within timeoutMs
 * is rejected (CallTimeoutError), as ioredis' `commandTimeout` would reject it, and its late
 * answer is dropped. Redis may still run it; the scripts that care check a deadline of
 * their own (admit.lua's staleAfterMs, hold.lua's).
 *
 * Why not `commandTimeout`: it arms one timer per command and clears it on the answer, which
 * at a settlement call every tick is the largest share of what the Redis mode promotes to the
 * old generation (docs/performance.md, "Redis calls"). Here the calls in flight sit in the
 * cells of one array, and one sweep (every tenth of the timeout, 1 to 10 ms) rejects the
 * overdue ones; it stops when nothing is in flight. A call is rejected between timeoutMs and
 * timeoutMs plus that period after it was made.
 */
import { DenseSet } from '../../dense-set.js';

export class CallTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(`redis did not answer within ${timeoutMs} ms`);
    this.name = 'CallTimeoutError';
  }
}

interface Pending {
  at: number;
  reject: (err: unknown) => void;
  /** its cell in `pending`, given back once: on the answer or by the sweep */
  cell: number;
  /** set by the sweep: the cell is given back already */
  expired: boolean;
}

export interface CallDeadlinesOptions {
  timeoutMs: number;
  /** the clock deadlines are read on (performance.now() by default) */
  now?: () => number;
}

export class CallDeadlines {
  private readonly pending = new DenseSet<Pending>();
  private timer: NodeJS.Timeout | null = null;
  private readonly timeoutMs: number;
  private readonly now: () => number;
  /** a tenth of the timeout, between 1 and 10 ms: the most a rejection comes late */
  private readonly sweepMs: number;
  private readonly sweep = (): void => this.expire();

  constructor(opts: CallDeadlinesOptions) {
    this.timeoutMs = opts.timeoutMs;
    this.now = opts.now ?? (() => performance.now());
    this.sweepMs = Math.min(10, Math.max(1, Math.floor(opts.timeoutMs / 10)));
  }

  /** Calls in flight (not yet answered nor rejected). */
  get size(): number {
    return this.pending.size;
  }

  /** Whether the sweep is running (only while a call is in flight, or until its next run). */
  get sweeping(): boolean {
    return this.timer !== null;
  }

  /** `call`'s answer, or a CallTimeoutError once timeoutMs have passed without one. */
  bound<T>(call: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const p: Pending = { at: this.now() + this.timeoutMs, reject, cell: -1, expired: false };
      p.cell = this.pending.add(p);
      if (!this.timer) {
        this.timer = setInterval(this.sweep, this.sweepMs);
        this.timer.unref();
      }
      call.then(
        (v) => {
          if (p.expired) return;
          this.pending.delete(p.cell);
          resolve(v);
        },
        (err: unknown) => {
          if (p.expired) return;
          this.pending.delete(p.cell);
          reject(err);
        },
      );
    });
  }

  /** Rejects every overdue call; stops the sweep once nothing is in flight. */
  expire(): void {
    if (this.pending.size === 0) {
      if (this.timer) clearInterval(this.timer);
      this.timer = null;
      return;
    }
    const t = this.now();
    this.pending.forEach((p) => {
      if (p.at > t) return;
      p.expired = true;
      this.pending.delete(p.cell);
      p.reject(new CallTimeoutError(this.timeoutMs));
    });
  }
}

/**
 * The guard every Redis call of createLimiter goes through (failover.ts). While the first
 * connection is being made, a call waits for it (at most timeoutMs) rather than failing at
 * once, so a freshly started instance does not fail open. Then each call waits at most
 * timeoutMs plus a small slack: the deadline of each Redis call (redis/deadlines.ts)
 * normally answers first, and the guard bounds the whole step, which may wait on more than
 * one call (a hold that waits for another request's slice call, then makes its own). An
 * answer Redis gives after the guard gave up is undone at once (`late`), so it cannot hold a
 * slot or a budget nobody will release.
 *
 * A request's admission and its spend hold share one wait: the hold gets what the admission
 * left of timeoutMs (DESIGN section 6: a request never waits on Redis longer than that), so
 * a paused Redis costs a request one timeout, not one per step.
 */
import type { Cluster, Redis } from 'ioredis';
import { whenServing } from './redis/client.js';
import { Deadlines } from './redis/deadlines.js';
import type { RedisWait } from './limiter.js';

/** Slack on top of timeoutMs for the guard that bounds a whole call. */
const GUARD_SLACK_MS = 25;
/** A failure that came after this share of timeoutMs waited the timeout out: a slow one. */
const SLOW_SHARE = 0.9;

class RedisTimeout extends Error {}

/** One call on Redis and what becomes of it: Redis' answer in time, the fallback's, or a late answer undone. */
export interface GuardedCall<T> {
  /** Sends the call to Redis. */
  send(): Promise<T>;
  /** Redis answered in time. */
  answered(): void;
  /** Redis failed or the guard gave up (`slow`: the call waited the timeout out); fallback() answers. */
  failed(err: unknown, slow: boolean): void;
  fallback(): Promise<T>;
  /** Redis answered after the guard gave up: undo what the answer took. */
  late(answer: T): void;
}

/** The first-connection wait and the deadline of every call. */
export class RedisGuard {
  private connecting = true;
  private readonly firstAttempt: Promise<void>;
  private gaveUp = 0;
  /** each call's deadline: timeoutMs plus the slack */
  private readonly deadlines: Deadlines;

  constructor(
    client: Redis | Cluster,
    private readonly timeoutMs: number,
  ) {
    this.deadlines = new Deadlines({ timeoutMs: timeoutMs + GUARD_SLACK_MS });
    this.firstAttempt = new Promise<void>((resolve) => {
      const settled = (): void => {
        this.connecting = false;
        resolve();
      };
      whenServing(client).then(settled, settled);
      for (const event of ['error', 'close', 'end']) client.once(event, settled);
    });
  }

  /**
   * The call's answer, or the fallback's when `skip` (the breaker is open), the call fails or
   * it outlives the deadline. `wait`: the wait of the request the call is a step of, which
   * its first guarded step starts and every later one shares.
   */
  run<T>(skip: boolean, call: GuardedCall<T>, wait?: RedisWait): Promise<T> {
    const ends = wait ? (wait.endsAt ??= performance.now() + this.timeoutMs) : Infinity;
    if (skip || ends <= performance.now()) return call.fallback();
    return this.connecting ? this.firstConnection().then(() => this.underDeadline(call, ends)) : this.underDeadline(call, ends);
  }

  /** Calls the guard gave up on that Redis did not count as failed itself. */
  timeouts(): number {
    return this.gaveUp;
  }

  /** Resolves when the first connection attempt is over, or after timeoutMs. */
  private firstConnection(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const bound = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, this.timeoutMs);
    });
    return Promise.race([this.firstAttempt, bound]).finally(() => clearTimeout(timer));
  }

  /** One promise and one deadline per call (every admission and hold comes through here), no timer of its own, no race of promises. */
  private underDeadline<T>(call: GuardedCall<T>, requestEnds: number): Promise<T> {
    return new Promise<T>((resolve) => {
      const p = call.send();
      const started = performance.now();
      const fail = (err: unknown): void => {
        call.failed(err, performance.now() - started >= this.timeoutMs * SLOW_SHARE);
        resolve(call.fallback());
      };
      // Over once answered (cleared) or once passed: an answer that finds it over is late.
      const deadline = this.deadlines.start(() => {
        this.gaveUp++;
        fail(new RedisTimeout(`redis did not answer within ${this.timeoutMs} ms`));
      }, requestEnds + GUARD_SLACK_MS);
      p.then(
        (v) => {
          if (deadline.done) return call.late(v);
          this.deadlines.clear(deadline);
          call.answered();
          resolve(v);
        },
        (err: unknown) => {
          // After the deadline the Redis side counted this failure itself; do not count it twice.
          if (deadline.done) return void this.gaveUp--;
          this.deadlines.clear(deadline);
          fail(err);
        },
      );
    });
  }
}

/**
 * The failover rules of createLimiter (failover.ts) for quota reads and spend holds: each
 * call waits on Redis at most timeoutMs (plus a small slack), shares createLimiter's breaker
 * and first-connection wait, and on failure
 *  - hold: `onError: open` holds in the in-process ledger (counted in failOpenHolds),
 *    `closed` answers limits_unavailable. A hold Redis grants after the guard gave up is
 *    released at once (settled at 0), so it cannot sit on a budget until it expires.
 *  - peek, ledger: read the in-process figures in either mode. They only inform the caller
 *    (GET /v1/key); refusing them would turn a display into an outage.
 */
import { type HoldInput, type HoldResult, type Limiter, isLimited } from './limiter.js';

/** createLimiter's breaker and connection state, shared so that admissions and holds agree. */
export interface FailoverGate {
  /** True while the breaker sends calls on this hash tag's shard to the fallback. */
  skip(tag: string): boolean;
  /** While the first connection is being made: resolves when it is up or after timeoutMs. */
  ready(): Promise<void> | undefined;
  succeeded(tag: string): void;
  /** `slow`: the call failed by waiting out the timeout (what trips the breaker) */
  failed(tag: string, err: unknown, slow: boolean): void;
}

export interface MoneyFailoverOptions {
  shared: Pick<Limiter, 'peek' | 'hold' | 'ledger'>;
  local: Pick<Limiter, 'peek' | 'hold' | 'ledger'>;
  timeoutMs: number;
  onError: 'open' | 'closed';
  gate: FailoverGate;
  /** the Redis hash tags calls land on, for per-shard failure tracking */
  tags: { key: (keyId: string) => string; ledger: (tag: string) => string };
}

export type MoneyFailover = Pick<Limiter, 'peek' | 'hold' | 'ledger'> & {
  failOpenHolds(): number;
  guardTimeouts(): number;
};

const GUARD_SLACK_MS = 25;
const UNAVAILABLE_RETRY_MS = 1_000;

class RedisTimeout extends Error {}

export function createMoneyFailover(o: MoneyFailoverOptions): MoneyFailover {
  let failOpenHolds = 0;
  let guardTimeouts = 0;

  /** Runs one Redis call under the breaker and the deadline; `late` undoes what arrives too late. */
  const guarded = <T>(tag: string, call: () => Promise<T>, fallback: () => Promise<T>, late?: (v: T) => void): Promise<T> => {
    if (o.gate.skip(tag)) return fallback();
    const waiting = o.gate.ready();
    return waiting ? waiting.then(() => underDeadline(tag, call, fallback, late)) : underDeadline(tag, call, fallback, late);
  };

  /**
   * The call's answer, or the fallback's once the call fails or outlives the deadline. One
   * promise and one timer per call: every request's hold comes through here, and a race
   * against a guard promise cost two more promises and their reactions.
   */
  const underDeadline = <T>(tag: string, call: () => Promise<T>, fallback: () => Promise<T>, late?: (v: T) => void): Promise<T> =>
    new Promise<T>((resolve) => {
      const p = call();
      let gaveUp = false;
      const started = performance.now();
      const fail = (err: unknown): void => {
        o.gate.failed(tag, err, performance.now() - started >= o.timeoutMs * 0.9);
        resolve(fallback());
      };
      const timer = setTimeout(() => {
        gaveUp = true;
        guardTimeouts++;
        fail(new RedisTimeout(`redis did not answer within ${o.timeoutMs} ms`));
      }, o.timeoutMs + GUARD_SLACK_MS);
      p.then(
        (v) => {
          if (gaveUp) return late?.(v);
          clearTimeout(timer);
          o.gate.succeeded(tag);
          resolve(v);
        },
        (err: unknown) => {
          // After the deadline the Redis side counted this failure itself; do not count it twice.
          if (gaveUp) return void guardTimeouts--;
          clearTimeout(timer);
          fail(err);
        },
      );
    });

  const degradeHold = (input: HoldInput): Promise<HoldResult> => {
    if (o.onError === 'closed') {
      return Promise.resolve({ ok: false, code: 'limits_unavailable', retryAfterMs: UNAVAILABLE_RETRY_MS });
    }
    failOpenHolds++;
    return o.local.hold(input);
  };

  return {
    // Nothing to hold: nothing can be unavailable either.
    hold: (input) =>
      input.holders.length === 0
        ? o.shared.hold(input)
        : guarded(o.tags.ledger(input.tag), () => o.shared.hold(input), () => degradeHold(input), (r) => r.ok && r.hold.settle(0)),
    // Calls that need no Redis skip the gate: their success says nothing about Redis.
    peek: (input) =>
      !isLimited(input.limits.rpm) && !isLimited(input.limits.tpm)
        ? o.shared.peek(input)
        : guarded(o.tags.key(input.keyId), () => o.shared.peek(input), () => o.local.peek(input)),
    ledger: (input) =>
      input.holders.length === 0 ? Promise.resolve([]) : guarded(o.tags.ledger(input.tag), () => o.shared.ledger(input), () => o.local.ledger(input)),
    failOpenHolds: () => failOpenHolds,
    guardTimeouts: () => guardTimeouts,
  };
}

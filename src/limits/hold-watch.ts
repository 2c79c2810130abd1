/**
 * A Limiter that tells a watcher which budget holders each spend hold drew on: once the hold
 * is answered, and again once it settles. Budget alerts (DESIGN section 13) check those
 * holders' live figures in the background; nothing here waits for them.
 *
 * A refused hold is reported as well: a shadowed budget (DESIGN section 12) forwards the
 * request its hold refused, and its holders alert like enforced ones. Every other method goes
 * straight to the limiter underneath.
 */
import type { Holder } from '../policy/holders.js';
import type { Hold, HoldInput, HoldResult, Limiter } from './limiter.js';

export interface HoldWatcher {
  /** false while nothing listens: holds then cost nothing extra */
  readonly watching: boolean;
  /** must return at once (it runs on the request's path) and never throw */
  touched(input: { tag: string; holders: readonly Holder[] }): void;
}

export function watchHolds(limiter: Limiter, watcher: HoldWatcher): Limiter {
  return {
    admit: (input) => limiter.admit(input),
    peek: (input) => limiter.peek(input),
    ledger: (input) => limiter.ledger(input),
    claimOnce: (input) => limiter.claimOnce(input),
    claimedBy: (input) => limiter.claimedBy(input),
    setLeaseMs: (ms) => limiter.setLeaseMs(ms),
    stats: () => limiter.stats(),
    close: () => limiter.close(),
    hold(input: HoldInput): Promise<HoldResult> {
      if (!watcher.watching || input.holders.length === 0) return limiter.hold(input);
      return limiter.hold(input).then((result) => {
        watcher.touched(input);
        return result.ok ? { ok: true, hold: new WatchedHold(result.hold, watcher, input) } : result;
      });
    },
  };
}

/** A hold whose settlement is reported once it has been handed to the limiter. */
class WatchedHold implements Hold {
  readonly #hold: Hold;
  readonly #watcher: HoldWatcher;
  readonly #input: HoldInput;

  constructor(hold: Hold, watcher: HoldWatcher, input: HoldInput) {
    this.#hold = hold;
    this.#watcher = watcher;
    this.#input = input;
  }

  settle(actual: number): void {
    this.#hold.settle(actual);
    this.#watcher.touched(this.#input);
  }
}

/**
 * The failover rules (failover.ts) for quota reads and spend holds: each call waits on Redis
 * at most timeoutMs (plus a small slack), shares the admissions' breaker and first-connection
 * wait, and on failure
 *  - hold: a hold this instance's spend slices cover needs no Redis and is taken from them;
 *    otherwise `onError: open` holds in the in-process ledger (counted in failOpenHolds),
 *    `closed` answers limits_unavailable. A hold Redis grants after the guard gave up is
 *    released at once (settled at 0), so it cannot sit on a budget until it expires.
 *  - peek, ledger: `onError: open` reads the in-process figures, the ones admissions are
 *    held to meanwhile; `closed` rejects with LimitsUnavailableError, as no figure of this
 *    process alone stands for the shared one (GET /v1/key answers 503 limits_unavailable).
 *    A `sharedOnly` ledger read (budget alerts) rejects in either mode.
 *  - claimedBy rejects in either mode, like a `sharedOnly` ledger read.
 *  - claimOnce: `unavailable` in either mode, never a claim in the in-process store: a claim
 *    made by one instance alone could be made again by another, and an alert sent twice is
 *    worse than one sent late (the caller asks again). A grant Redis gives after the guard
 *    gave up stays: the claimer's token makes its next ask answer `claimed` again.
 * Calls that need no Redis skip the guard: their success says nothing about Redis.
 */
import { type Failover, unavailable } from './failover.js';
import type { GuardedCall } from './failover-guard.js';
import type { ClaimInput, ClaimResult, HoldInput, HoldResult, KeyLimits, LedgerFigure, LedgerInput, Limiter, Quota, RedisWait } from './limiter.js';
import { LimitsUnavailableError, isLimited } from './limiter.js';

export function holdWithFailover(failover: Failover, input: HoldInput): Promise<HoldResult> {
  // Nothing to hold: nothing can be unavailable either.
  if (input.holders.length === 0) return failover.shared.hold(input);
  // Taken from spend slices this instance holds: no Redis call, so nothing to guard.
  const sliced = failover.shared.holdNow(input);
  if (sliced) return Promise.resolve(sliced);
  return guarded(failover, new HoldCall(failover, failover.tags.ledger(input.tag), input), input.wait);
}

export function peekWithFailover(failover: Failover, input: { keyId: string; limits: KeyLimits }): Promise<Quota> {
  if (!isLimited(input.limits.rpm) && !isLimited(input.limits.tpm)) return failover.shared.peek(input);
  return guarded(failover, new ReadCall(failover, failover.tags.key(input.keyId), (from) => from.peek(input)));
}

export function ledgerWithFailover(failover: Failover, input: LedgerInput): Promise<LedgerFigure[]> {
  if (input.holders.length === 0) return Promise.resolve([]);
  return guarded(failover, new ReadCall(failover, failover.tags.ledger(input.tag), (from) => from.ledger(input), input.sharedOnly === true));
}

export function claimWithFailover(failover: Failover, input: ClaimInput): Promise<ClaimResult> {
  return guarded(failover, new ClaimCall(failover, failover.tags.ledger(input.tag), input));
}

export function claimedByWithFailover(failover: Failover, input: ClaimInput): Promise<string | null> {
  return guarded(failover, new ReadCall(failover, failover.tags.ledger(input.tag), (from) => from.claimedBy(input), true));
}

const guarded = <T>(failover: Failover, call: OneTagCall<T>, wait?: RedisWait): Promise<T> =>
  failover.guard.run(failover.shards.skipping(failover.shards.of(call.tag), performance.now()), call, wait);

/** A call whose keys all live under one hash tag; its shard is looked up at each step, as the map may change meanwhile. */
abstract class OneTagCall<T> implements GuardedCall<T> {
  constructor(
    protected readonly failover: Failover,
    readonly tag: string,
  ) {}

  abstract send(): Promise<T>;
  abstract fallback(): Promise<T>;

  answered(): void {
    this.failover.shards.succeeded(this.failover.shards.of(this.tag));
  }

  // Holds and quota reads trip a shard's breaker as admissions do: only slow failures count.
  failed(err: unknown, slow: boolean): void {
    this.failover.shards.failed(this.failover.shards.of(this.tag), err, slow);
  }

  late(_answer: T): void {}
}

class HoldCall extends OneTagCall<HoldResult> {
  constructor(failover: Failover, tag: string, private readonly input: HoldInput) {
    super(failover, tag);
  }

  send(): Promise<HoldResult> {
    return this.failover.shared.hold(this.input);
  }

  fallback(): Promise<HoldResult> {
    if (this.failover.onError === 'closed') return Promise.resolve(unavailable());
    this.failover.failedOpen.holds++;
    return this.failover.local.hold(this.input);
  }

  override late(answer: HoldResult): void {
    if (answer.ok) answer.hold.settle(0);
  }
}

/** A read: Redis' figures in time, else the in-process ones (`open`) or a rejection (`closed`). */
class ReadCall<T> extends OneTagCall<T> {
  constructor(
    failover: Failover,
    tag: string,
    private readonly read: (from: Pick<Limiter, 'peek' | 'ledger' | 'claimedBy'>) => Promise<T>,
    /** no in-process figures in `open` mode either */
    private readonly sharedOnly = false,
  ) {
    super(failover, tag);
  }

  send(): Promise<T> {
    return this.read(this.failover.shared);
  }

  fallback(): Promise<T> {
    if (this.failover.onError === 'closed' || this.sharedOnly) return Promise.reject(new LimitsUnavailableError(unavailable().retryAfterMs));
    return this.read(this.failover.local);
  }
}

/** A claim: Redis' answer in time, else `unavailable` (never the in-process store). */
class ClaimCall extends OneTagCall<ClaimResult> {
  constructor(failover: Failover, tag: string, private readonly input: ClaimInput) {
    super(failover, tag);
  }

  send(): Promise<ClaimResult> {
    return this.failover.shared.claimOnce(this.input);
  }

  fallback(): Promise<ClaimResult> {
    return Promise.resolve('unavailable');
  }
}

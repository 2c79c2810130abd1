/**
 * The failover rules (failover.ts) for quota reads and spend holds: each call waits on Redis
 * at most timeoutMs (plus a small slack), shares the admissions' breaker and first-connection
 * wait, and on failure
 *  - hold: `onError: open` holds in the in-process ledger (counted in failOpenHolds),
 *    `closed` answers limits_unavailable. A hold Redis grants after the guard gave up is
 *    released at once (settled at 0), so it cannot sit on a budget until it expires.
 *  - peek, ledger: read the in-process figures in either mode. They only inform the caller
 *    (GET /v1/key); refusing them would turn a display into an outage.
 * Calls that need no Redis skip the guard: their success says nothing about Redis.
 */
import { type Failover, unavailable } from './failover.js';
import type { GuardedCall } from './failover-guard.js';
import type { HoldInput, HoldResult, KeyLimits, LedgerFigure, LedgerInput, Limiter, Quota } from './limiter.js';
import { isLimited } from './limiter.js';

export function holdWithFailover(f: Failover, input: HoldInput): Promise<HoldResult> {
  // Nothing to hold: nothing can be unavailable either.
  if (input.holders.length === 0) return f.shared.hold(input);
  return guarded(f, new HoldCall(f, f.tags.ledger(input.tag), input));
}

export function peekWithFailover(f: Failover, input: { keyId: string; limits: KeyLimits }): Promise<Quota> {
  if (!isLimited(input.limits.rpm) && !isLimited(input.limits.tpm)) return f.shared.peek(input);
  return guarded(f, new ReadCall(f, f.tags.key(input.keyId), (from) => from.peek(input)));
}

export function ledgerWithFailover(f: Failover, input: LedgerInput): Promise<LedgerFigure[]> {
  if (input.holders.length === 0) return Promise.resolve([]);
  return guarded(f, new ReadCall(f, f.tags.ledger(input.tag), (from) => from.ledger(input)));
}

const guarded = <T>(f: Failover, c: OneTagCall<T>): Promise<T> => f.guard.run(f.shards.skipping(f.shards.of(c.tag), performance.now()), c);

/** A call whose keys all live under one hash tag; its shard is looked up at each step, as the map may change meanwhile. */
abstract class OneTagCall<T> implements GuardedCall<T> {
  constructor(
    protected readonly f: Failover,
    readonly tag: string,
  ) {}

  abstract call(): Promise<T>;
  abstract fallback(): Promise<T>;

  answered(): void {
    this.f.shards.succeeded(this.f.shards.of(this.tag));
  }

  // Holds and quota reads trip a shard's breaker as admissions do: only slow failures count.
  failed(err: unknown, slow: boolean): void {
    this.f.shards.failed(this.f.shards.of(this.tag), err, slow);
  }

  late(_answer: T): void {}
}

class HoldCall extends OneTagCall<HoldResult> {
  constructor(f: Failover, tag: string, private readonly input: HoldInput) {
    super(f, tag);
  }

  call(): Promise<HoldResult> {
    return this.f.shared.hold(this.input);
  }

  fallback(): Promise<HoldResult> {
    if (this.f.onError === 'closed') return Promise.resolve(unavailable());
    this.f.failedOpen.holds++;
    return this.f.local.hold(this.input);
  }

  override late(answer: HoldResult): void {
    if (answer.ok) answer.hold.settle(0);
  }
}

/** A read: Redis' figures in time, else the in-process ones, in either mode. */
class ReadCall<T> extends OneTagCall<T> {
  constructor(f: Failover, tag: string, private readonly read: (from: Pick<Limiter, 'peek' | 'ledger'>) => Promise<T>) {
    super(f, tag);
  }

  call(): Promise<T> {
    return this.read(this.f.shared);
  }

  fallback(): Promise<T> {
    return this.read(this.f.local);
  }
}

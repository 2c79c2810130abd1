/**
 * The failover rules of createLimiter (create.ts): what a call on Redis does when Redis
 * errors or does not answer within `timeoutMs`. `onError: open` answers it from the
 * in-process limiter (counted), `closed` answers limits_unavailable. Admissions follow them
 * here, quota reads and spend holds in failover-money.ts. A lease is always finished where it
 * was admitted, because each lease closes over its own limiter.
 *
 * Failures are tracked per shard: the Cluster master that serves a call's hash tags (a
 * single node is one shard). One failing shard sends only the calls that need it to the
 * fallback; keys on healthy shards keep their shared limits. After BREAKER_AFTER slow
 * failures (timeouts) in a row, calls for that shard skip Redis for BREAKER_MS instead of
 * each waiting out the timeout against a paused server. Fast failures (a refused
 * connection, a hash slot not served) do not trip it: they cost little, and trying Redis on
 * every call means that the moment a replica is promoted, or a shard answers again, it is
 * used again, with no window of per-instance limits after the Cluster is whole.
 *
 * Every call waits on Redis at most timeoutMs, and at first for the first connection
 * (failover-guard.ts).
 */
import type { Cluster, Redis } from 'ioredis';
import type { GuardedCall, RedisGuard } from './failover-guard.js';
import { type AdmitInput, type AdmitResult, type Limiter, hasAnyLimit, isLimited } from './limiter.js';
import { hashSlot } from './redis/hash-slot.js';
import { ledgerHashTag } from './redis/ledger.js';
import { type RedisLease, type RedisLimiter, failedHashTags, hashTag } from './redis/api.js';

/** Consecutive slow Redis failures of a shard that send its calls straight to the fallback... */
export const BREAKER_AFTER = 3;
/** ...for this long. */
export const BREAKER_MS = 250;
/** Shard name of a single-node Redis. */
const SINGLE_NODE_SHARD = 'redis';
/** retryAfterMs of a limits_unavailable answer. */
const UNAVAILABLE_RETRY_MS = 1_000;
/** Ledger hash tags remembered (cleared when full: a bound against endless made-up tags). */
const LEDGER_TAG_MEMO = 10_000;

export type OnError = 'open' | 'closed';
export type LimitsLog = (event: string, fields: Record<string, unknown>) => void;

/** What `onError: closed` answers; the pipeline turns it into 503 limits_unavailable. */
export const unavailable = (): { ok: false; code: 'limits_unavailable'; retryAfterMs: number } => ({
  ok: false,
  code: 'limits_unavailable',
  retryAfterMs: UNAVAILABLE_RETRY_MS,
});

/** What is known of one shard. */
interface ShardRecord {
  down: boolean;
  slowInARow: number;
  skipUntil: number;
}

/** Each shard's state and breaker; state changes are logged (`limits_redis_down` / `limits_redis_up`). */
export class Shards {
  private readonly records = new Map<string, ShardRecord>();
  private closing = false;

  constructor(
    private readonly client: Redis | Cluster,
    private readonly log: LimitsLog,
  ) {}

  /**
   * The shard a hash tag depends on: the master the client's hash-slot map names for its hash
   * slot. When a replica is promoted the map names the new master, whose record is clean.
   */
  of(tag: string): string {
    if (!this.client.isCluster) return SINGLE_NODE_SHARD;
    const n = hashSlot(tag);
    return (this.client as Cluster).slots[n]?.[0] ?? `hash slot ${n}`;
  }

  /** Whether the breaker sends the shard's calls to the fallback at `now` (performance.now()). */
  skipping(name: string, now: number): boolean {
    return this.record(name).skipUntil > now;
  }

  succeeded(name: string): void {
    this.record(name).slowInARow = 0;
    this.setDown(name, false);
  }

  /** `slow`: the call waited the timeout out, which is what trips the breaker. */
  failed(name: string, err: unknown, slow: boolean): void {
    const r = this.record(name);
    if (slow && ++r.slowInARow >= BREAKER_AFTER) r.skipUntil = performance.now() + BREAKER_MS;
    this.setDown(name, true, err instanceof Error ? err.message : String(err));
  }

  /** A single node's connection state; a Cluster's shards report through the calls that use them. */
  connection(state: 'up' | 'down', error?: string): void {
    if (!this.client.isCluster) this.setDown(SINGLE_NODE_SHARD, state === 'down', error);
  }

  /** The limiter is closing: its connections going down is no news. */
  close(): void {
    this.closing = true;
  }

  private record(name: string): ShardRecord {
    let r = this.records.get(name);
    if (!r) this.records.set(name, (r = { down: false, slowInARow: 0, skipUntil: 0 }));
    return r;
  }

  private setDown(name: string, isDown: boolean, error?: string): void {
    const r = this.record(name);
    if (isDown === r.down || this.closing) return;
    r.down = isDown;
    this.log(isDown ? 'limits_redis_down' : 'limits_redis_up', { shard: name, ...(error ? { error } : {}) });
  }
}

/** The hash tags calls land on, which name the shard that serves them. */
export class HashTags {
  // Every hold asks for its ledger's hash tag: the same few tags over and over.
  private readonly ledgers = new Map<string, string>();

  constructor(private readonly prefix: string) {}

  route(name: string): string {
    return hashTag(this.prefix, 'r', name);
  }

  key(keyId: string): string {
    return hashTag(this.prefix, 'k', keyId);
  }

  ledger(tag: string): string {
    let t = this.ledgers.get(tag);
    if (t === undefined) {
      if (this.ledgers.size >= LEDGER_TAG_MEMO) this.ledgers.clear();
      this.ledgers.set(tag, (t = ledgerHashTag(this.prefix, tag)));
    }
    return t;
  }
}

/** What the failover rules work with (built by createLimiter). */
export interface Failover {
  shared: RedisLimiter;
  local: Limiter;
  shards: Shards;
  guard: RedisGuard;
  tags: HashTags;
  onError: OnError;
  /** calls answered by the in-process limiter because Redis failed (stats) */
  failedOpen: { admissions: number; holds: number };
}

/** An admission under the failover rules. */
export async function admitWithFailover(failover: Failover, input: AdmitInput): Promise<AdmitResult> {
  // Nothing to count: nothing can be unavailable either, whatever state Redis is in.
  if (!hasAnyLimit(input)) return failover.shared.admit(input);
  // Admitted from a slice or block of slots this instance holds: no Redis call, so nothing to guard.
  const sliced = failover.shared.admitNow(input);
  if (sliced) return sliced;
  const shards = admissionShards(failover, input);
  const now = performance.now();
  return failover.guard.run(
    shards.some((name) => failover.shards.skipping(name, now)),
    new AdmissionCall(failover, input, shards),
    input.wait,
  );
}

/** The shards of the hash tags an admission writes under: the route's and the key's (per-model limits included), where limited. */
function admissionShards(failover: Failover, input: AdmitInput): string[] {
  const { route, limits } = input;
  const shards: string[] = [];
  if (isLimited(route.concurrency) || isLimited(route.rpm)) shards.push(failover.shards.of(failover.tags.route(route.name)));
  const model = input.modelLimit;
  const keyLimited = isLimited(limits.rpm) || isLimited(limits.tpm) || isLimited(limits.concurrency) || (!!model && (isLimited(model.rpm) || isLimited(model.tpm)));
  // A key's per-model buckets live under its hash tag too.
  if (keyLimited) shards.push(failover.shards.of(failover.tags.key(input.keyId)));
  return shards;
}

class AdmissionCall implements GuardedCall<AdmitResult> {
  constructor(
    private readonly failover: Failover,
    private readonly input: AdmitInput,
    private readonly shards: string[],
  ) {}

  send(): Promise<AdmitResult> {
    return this.failover.shared.admit(this.input);
  }

  answered(): void {
    for (const name of this.shards) this.failover.shards.succeeded(name);
  }

  failed(err: unknown, slow: boolean): void {
    // Blame the shards the error came from; a guard timeout names none, so all of them.
    const blamed = failedHashTags(err)?.map((tag) => this.failover.shards.of(tag)) ?? this.shards;
    for (const name of new Set(blamed)) this.failover.shards.failed(name, err, slow);
  }

  fallback(): Promise<AdmitResult> {
    if (this.failover.onError === 'closed') return Promise.resolve(unavailable());
    this.failover.failedOpen.admissions++;
    return this.failover.local.admit(this.input);
  }

  /** Granted after the guard gave up: undone at once, so it cannot hold a slot nobody will finish. */
  late(answer: AdmitResult): void {
    if (answer.ok) (answer.lease as RedisLease).cancel();
  }
}

/**
 * createLimiter: the limiter the sidecar runs with. Without a Redis URL it is the in-process
 * limiter. With one, admissions go to Redis; when Redis errors or does not answer within
 * `timeoutMs`, `onError: open` admits through an in-process limiter (counted in
 * failOpenAdmissions) and `closed` answers limits_unavailable. A lease is always finished
 * where it was admitted, because each lease closes over its own limiter.
 *
 * Failures are tracked per shard: the Cluster master that serves an admission's hash tags
 * (a single node is one shard). One failing shard sends only the admissions that need it to
 * the fallback; keys on healthy shards keep their shared limits. After BREAKER_AFTER slow
 * failures (timeouts) in a row, admissions for that shard skip Redis for BREAKER_MS instead
 * of each waiting out the timeout against a paused server. Fast failures (a refused
 * connection, a slot not served) do not trip it: they cost little, and trying Redis on every
 * admission means that the moment a replica is promoted, or a shard answers again, it is
 * used again, with no window of per-instance limits after the Cluster is whole.
 *
 * While the first connection is being made, an admission waits for it (at most timeoutMs)
 * rather than failing at once, so a freshly started instance does not fail open.
 */
import { closeRedisClient, createRedisClient, whenServing } from './redis/client.js';
import { DEFAULT_LEASE_MS } from './bucket.js';
import type { Cluster } from 'ioredis';
import { createMoneyFailover } from './failover-money.js';
import { ledgerHashTag } from './redis/ledger.js';
import { type AdmitInput, type AdmitResult, type Limiter, hasAnyLimit, isLimited } from './limiter.js';
import { createMemoryLimiter } from './memory.js';
import { type RedisLease, createRedisLimiter, failedHashTags, hashTag } from './redis/limiter.js';
import { hashSlot } from './redis/hash-slot.js';

export interface RedisLimitsConfig {
  /** See client.ts for the URL forms (single node, unix socket, redis+cluster://). */
  url: string;
  /** Key namespace; default `kw`. */
  prefix?: string;
  /** Longest a request waits on Redis before the onError policy applies; default 100. */
  timeoutMs?: number;
  /** default `open`. */
  onError?: 'open' | 'closed';
  /** Bucket slices (redis-lease.ts); on unless `enabled: false`; sliceMs default DEFAULT_SLICE_MS. */
  lease?: { enabled?: boolean; sliceMs?: number };
}

/** How long an instance uses a slice before it gives back what is left. */
export const DEFAULT_SLICE_MS = 1_000;

export interface CreateLimiterOptions {
  redis?: RedisLimitsConfig | null;
  leaseMs?: number;
  /** Clock of the in-process limiter (Redis keeps its own time). */
  now?: () => number;
  /** Redis state changes, per shard: `limits_redis_down` / `limits_redis_up`, with the shard and an error message. */
  log?: (event: string, fields: Record<string, unknown>) => void;
}

/** Consecutive slow Redis failures of a shard that send its admissions straight to the fallback... */
export const BREAKER_AFTER = 3;
/** ...for this long. */
export const BREAKER_MS = 250;
/** Slack on top of timeoutMs for the guard that bounds a whole admission. */
const GUARD_SLACK_MS = 25;
/** Shard name of a single-node Redis. */
const SINGLE = 'redis';
/** retryAfterMs of a limits_unavailable answer. */
const UNAVAILABLE_RETRY_MS = 1_000;
/** Ledger hash tags remembered (cleared when full: a bound against endless made-up tags). */
const LEDGER_TAG_MEMO = 10_000;

class RedisTimeout extends Error {}

/** What is known of one shard. */
interface Shard {
  down: boolean;
  slowInARow: number;
  skipUntil: number;
}

export function createLimiter(opts: CreateLimiterOptions = {}): Limiter {
  const leaseMs = opts.leaseMs ?? DEFAULT_LEASE_MS;
  const local = createMemoryLimiter({ leaseMs, ...(opts.now ? { now: opts.now } : {}) });
  const cfg = opts.redis;
  if (!cfg?.url) return local;

  const timeoutMs = cfg.timeoutMs ?? 100;
  const onError = cfg.onError ?? 'open';
  const prefix = cfg.prefix ?? 'kw';
  const log = opts.log ?? (() => undefined);
  let closing = false;
  const shards = new Map<string, Shard>();
  const shardState = (name: string): Shard => {
    let st = shards.get(name);
    if (!st) shards.set(name, (st = { down: false, slowInARow: 0, skipUntil: 0 }));
    return st;
  };
  const setDown = (name: string, isDown: boolean, error?: string): void => {
    const st = shardState(name);
    if (isDown === st.down || closing) return;
    st.down = isDown;
    log(isDown ? 'limits_redis_down' : 'limits_redis_up', { shard: name, ...(error ? { error } : {}) });
  };

  const client = createRedisClient({
    url: cfg.url,
    timeoutMs,
    // A single node is one shard; a Cluster's shards report through the admissions that use them.
    onState: (state, f) => {
      if (!client.isCluster) setDown(SINGLE, state === 'down', f.error);
    },
  });
  /**
   * The shard an admission's hash tag depends on: the master the client's slot map names for
   * its slot. When a replica is promoted the map names the new master, whose record is clean.
   */
  const shardOf = (tag: string): string => {
    if (!client.isCluster) return SINGLE;
    const slot = hashSlot(tag);
    return (client as Cluster).slots[slot]?.[0] ?? `slot ${slot}`;
  };
  const tagsOf = (input: AdmitInput): string[] => {
    const { route, limits } = input;
    const tags: string[] = [];
    if (isLimited(route.concurrency) || isLimited(route.rpm)) tags.push(hashTag(prefix, 'r', route.name));
    if (isLimited(limits.rpm) || isLimited(limits.tpm) || isLimited(limits.concurrency)) tags.push(hashTag(prefix, 'k', input.keyId));
    return tags;
  };
  const shared = createRedisLimiter({
    redis: client,
    prefix,
    leaseMs,
    // An admission Redis only gets to after ioredis gave up on it must change nothing; a
    // quarter of the budget is left for the reply's way back.
    staleAfterMs: Math.max(1, Math.floor(timeoutMs * 0.75)),
    lease: cfg.lease?.enabled === false ? null : { sliceMs: cfg.lease?.sliceMs ?? DEFAULT_SLICE_MS },
  });
  let failOpenAdmissions = 0;
  let guardTimeouts = 0;

  let connecting = true;
  const firstAttempt = new Promise<void>((resolve) => {
    const settled = (): void => {
      connecting = false;
      resolve();
    };
    whenServing(client).then(settled, settled);
    for (const event of ['error', 'close', 'end']) client.once(event, settled);
  });
  const firstConnection = (): Promise<void> => {
    let timer: NodeJS.Timeout | undefined;
    const bound = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
    });
    return Promise.race([firstAttempt, bound]).finally(() => clearTimeout(timer));
  };

  /**
   * ioredis' commandTimeout normally answers first; this guard also bounds what it does not
   * (a NOSCRIPT resend, Cluster redirections). An admission Redis grants after the guard
   * gave up is undone at once, so it cannot hold a slot nobody will finish.
   */
  const withDeadline = (p: Promise<AdmitResult>): Promise<AdmitResult> => {
    let timer: NodeJS.Timeout | undefined;
    let late = false;
    const guard = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        late = true;
        guardTimeouts++;
        reject(new RedisTimeout(`redis did not answer within ${timeoutMs} ms`));
      }, timeoutMs + GUARD_SLACK_MS);
    });
    void p.then(
      (res) => {
        if (late && res.ok) (res.lease as RedisLease).cancel();
      },
      () => {
        // The Redis limiter counted this failure itself; do not count it twice.
        if (late) guardTimeouts--;
      },
    );
    return Promise.race([p, guard]).finally(() => clearTimeout(timer));
  };

  // Every hold asks for its ledger's hash tag (for the breaker): the same few tags over and over.
  const ledgerTags = new Map<string, string>();
  const ledgerTagOf = (tag: string): string => {
    let t = ledgerTags.get(tag);
    if (t === undefined) {
      if (ledgerTags.size >= LEDGER_TAG_MEMO) ledgerTags.clear();
      ledgerTags.set(tag, (t = ledgerHashTag(prefix, tag)));
    }
    return t;
  };

  // Quota reads and spend holds follow the same breaker and onError rules (failover-money.ts).
  const money = createMoneyFailover({
    shared,
    local,
    timeoutMs,
    onError,
    tags: { key: (keyId) => hashTag(prefix, 'k', keyId), ledger: ledgerTagOf },
    gate: {
      skip: (tag) => shardState(shardOf(tag)).skipUntil > performance.now(),
      ready: () => (connecting ? firstConnection() : undefined),
      succeeded: (tag) => {
        const name = shardOf(tag);
        shardState(name).slowInARow = 0;
        setDown(name, false);
      },
      // Holds and quota reads trip a shard's breaker as admissions do: only slow failures count.
      failed: (tag, err, slow) => {
        const name = shardOf(tag);
        const st = shardState(name);
        if (slow && ++st.slowInARow >= BREAKER_AFTER) st.skipUntil = performance.now() + BREAKER_MS;
        setDown(name, true, err instanceof Error ? err.message : String(err));
      },
    },
  });

  const degrade = (input: AdmitInput): Promise<AdmitResult> => {
    if (onError === 'closed') {
      return Promise.resolve({ ok: false, code: 'limits_unavailable', retryAfterMs: UNAVAILABLE_RETRY_MS });
    }
    failOpenAdmissions++;
    return local.admit(input);
  };

  return {
    async admit(input) {
      // Nothing to count: nothing can be unavailable either, whatever state Redis is in.
      if (!hasAnyLimit(input)) return shared.admit(input);
      // Admitted from a slice or block of slots this instance holds: no Redis call, so nothing to guard.
      const sliced = shared.admitNow(input);
      if (sliced) return sliced;
      const tags = tagsOf(input);
      const names = tags.map(shardOf);
      const now = performance.now();
      if (names.some((n) => shardState(n).skipUntil > now)) return degrade(input);
      if (connecting) await firstConnection();
      const started = performance.now();
      try {
        const res = await withDeadline(shared.admit(input));
        for (const n of names) {
          shardState(n).slowInARow = 0;
          setDown(n, false);
        }
        return res;
      } catch (err) {
        // Blame the shards the error came from; a guard timeout names none, so all of them.
        const blamed = failedHashTags(err)?.map(shardOf) ?? names;
        const slow = performance.now() - started >= timeoutMs * 0.9;
        for (const n of new Set(blamed)) {
          const st = shardState(n);
          if (slow && ++st.slowInARow >= BREAKER_AFTER) st.skipUntil = performance.now() + BREAKER_MS;
          setDown(n, true, err instanceof Error ? err.message : String(err));
        }
        return degrade(input);
      }
    },
    peek: money.peek,
    hold: money.hold,
    ledger: money.ledger,
    stats() {
      const s = shared.stats();
      const l = local.stats();
      return {
        redisErrors: s.redisErrors + guardTimeouts + money.guardTimeouts(),
        failOpenAdmissions,
        slotsHeld: s.slotsHeld + l.slotsHeld,
        failOpenHolds: money.failOpenHolds(),
        holdsHeld: s.holdsHeld + l.holdsHeld,
      };
    },
    async close() {
      closing = true;
      await Promise.all([shared.close(), local.close()]);
      await closeRedisClient(client, Math.max(timeoutMs, 100));
    },
  };
}

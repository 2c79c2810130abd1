/**
 * createLimiter: the limiter the sidecar runs with. Without a Redis URL it is the in-process
 * limiter (memory.ts). With one, calls go to the Redis limiter (redis/limiter.ts) under the
 * failover rules (failover.ts, failover-money.ts), with the in-process limiter as the
 * fail-open fallback.
 *
 * Every setting arrives filled in: the config schema (src/config/schema.ts) is where their
 * defaults are stated.
 */
import { admitWithFailover, type Failover, HashTags, type LimitsLog, type OnError, Shards } from './failover.js';
import { RedisGuard } from './failover-guard.js';
import { claimWithFailover, claimedByWithFailover, holdWithFailover, ledgerWithFailover, peekWithFailover } from './failover-money.js';
import type { Limiter } from './limiter.js';
import { createMemoryLimiter } from './memory.js';
import { closeRedisClient, createRedisClient } from './redis/client.js';
import { createRedisLimiter } from './redis/limiter.js';
import { evictionRisks } from './redis/eviction.js';

/** The config's `redis` section (DESIGN section 2). */
export interface RedisLimitsConfig {
  /** See redis/client.ts for the URL forms (single node, unix socket, redis+cluster://). */
  url: string;
  /** Key namespace. */
  prefix: string;
  /** Longest a request waits on Redis before the onError policy applies. */
  timeoutMs: number;
  onError: OnError;
  /** Bucket slices and blocks of concurrency slots (redis/lease-path.ts). */
  lease: { enabled: boolean; sliceMs: number };
}

export interface CreateLimiterOptions {
  redis?: RedisLimitsConfig | null;
  /** The config's `limits.leaseMs`: a concurrency slot's or spend hold's lifetime without a refresh. */
  leaseMs: number;
  /** Clock of the in-process limiter (Redis keeps its own time). */
  now?: () => number;
  /** Redis state changes, per shard: `limits_redis_down` / `limits_redis_up`, with the shard and an error message. */
  log?: LimitsLog;
}

/** Closing waits at least this long for Redis to acknowledge, however short timeoutMs is. */
const MIN_CLOSE_WAIT_MS = 100;

export function createLimiter(opts: CreateLimiterOptions): Limiter {
  const local = createMemoryLimiter({ leaseMs: opts.leaseMs, ...(opts.now ? { now: opts.now } : {}) });
  if (!opts.redis?.url) return local;
  return failoverLimiter(opts.redis, local, opts);
}

/**
 * An admission Redis only gets to after its call's deadline passed must change nothing; a quarter
 * of the budget is left for the reply's way back.
 */
const staleAfterMs = (timeoutMs: number): number => Math.max(1, Math.floor(timeoutMs * 0.75));

/** A warning for each node whose settings may evict keyward's keys (redis/eviction.ts), once per node. */
async function warnOfEviction(client: Parameters<typeof evictionRisks>[0], o: { log: LimitsLog; warned: Set<string> }): Promise<void> {
  for (const risk of await evictionRisks(client)) {
    if (o.warned.has(risk.node)) continue;
    o.warned.add(risk.node);
    o.log('limits_redis_may_evict', { ...risk, hint: 'set maxmemory-policy noeviction (or no maxmemory): an evicted key is a limit or budget not enforced' });
  }
}

function failoverLimiter(cfg: RedisLimitsConfig, local: Limiter, opts: CreateLimiterOptions): Limiter {
  const { timeoutMs } = cfg;
  // A single node is one shard; a Cluster's shards report through the calls that use them.
  const log = opts.log ?? (() => undefined);
  const warned = new Set<string>();
  const client = createRedisClient({
    url: cfg.url,
    timeoutMs,
    onState: (state, fields) => {
      shards.connection(state, fields.error);
      if (state === 'up') void warnOfEviction(client, { log, warned });
    },
  });
  const shards = new Shards(client, log);
  const guard = new RedisGuard(client, timeoutMs);
  const shared = createRedisLimiter({
    redis: client,
    prefix: cfg.prefix,
    leaseMs: opts.leaseMs,
    staleAfterMs: staleAfterMs(timeoutMs),
    callTimeoutMs: timeoutMs,
    lease: cfg.lease.enabled ? { sliceMs: cfg.lease.sliceMs } : null,
  });
  const failover: Failover = {
    shared,
    local,
    shards,
    guard,
    tags: new HashTags(cfg.prefix),
    onError: cfg.onError,
    failedOpen: { admissions: 0, holds: 0 },
  };
  return {
    admit: (input) => admitWithFailover(failover, input),
    peek: (input) => peekWithFailover(failover, input),
    hold: (input) => holdWithFailover(failover, input),
    ledger: (input) => ledgerWithFailover(failover, input),
    claimOnce: (input) => claimWithFailover(failover, input),
    claimedBy: (input) => claimedByWithFailover(failover, input),
    setLeaseMs(ms) {
      shared.setLeaseMs(ms);
      local.setLeaseMs(ms);
    },
    stats() {
      const s = shared.stats();
      const l = local.stats();
      return {
        redisErrors: s.redisErrors + guard.timeouts(),
        failOpenAdmissions: failover.failedOpen.admissions,
        slotsHeld: s.slotsHeld + l.slotsHeld,
        failOpenHolds: failover.failedOpen.holds,
        holdsHeld: s.holdsHeld + l.holdsHeld,
      };
    },
    async close() {
      shards.close();
      await Promise.all([shared.close(), local.close()]);
      await closeRedisClient(client, Math.max(timeoutMs, MIN_CLOSE_WAIT_MS));
    },
  };
}

/**
 * createLimiter: the limiter the sidecar runs with. Without a Redis URL it is the in-process
 * limiter. With one, admissions go to Redis; when Redis errors or does not answer within
 * `timeoutMs`, `onError: open` admits through an in-process limiter (counted in
 * failOpenAdmissions) and `closed` answers limits_unavailable. A lease is always finished
 * where it was admitted, because each lease closes over its own limiter.
 *
 * After BREAKER_AFTER failures in a row, admissions skip Redis for BREAKER_MS instead of each
 * waiting out the timeout against a paused server; then Redis is tried again, so recovery
 * is automatic. A single failure does not trip it: that would send a whole burst to the
 * per-instance fallback and loosen every limit for a moment.
 *
 * While the first connection is being made, an admission waits for it (at most timeoutMs)
 * rather than failing at once, so a freshly started instance does not fail open.
 */
import { closeRedisClient, createRedisClient } from './client.js';
import { DEFAULT_LEASE_MS } from './bucket.js';
import { createMoneyFailover } from './failover-money.js';
import { type AdmitInput, type AdmitResult, type Limiter, hasAnyLimit } from './limiter.js';
import { createMemoryLimiter } from './memory.js';
import { type RedisLease, createRedisLimiter } from './redis.js';

export interface RedisLimitsConfig {
  /** See client.ts for the URL forms (single node, unix socket, redis+cluster://). */
  url: string;
  /** Key namespace; default `kw`. */
  prefix?: string;
  /** Longest a request waits on Redis before the onError policy applies; default 100. */
  timeoutMs?: number;
  /** default `open`. */
  onError?: 'open' | 'closed';
}

export interface CreateLimiterOptions {
  redis?: RedisLimitsConfig | null;
  leaseMs?: number;
  /** Clock of the in-process limiter (Redis keeps its own time). */
  now?: () => number;
  /** Redis state changes: `limits_redis_down` / `limits_redis_up`, with an error message. */
  log?: (event: string, fields: Record<string, unknown>) => void;
}

/** Consecutive Redis failures that send admissions straight to the fallback... */
export const BREAKER_AFTER = 3;
/** ...for this long. */
export const BREAKER_MS = 250;
/** Slack on top of timeoutMs for the guard that bounds a whole admission. */
const GUARD_SLACK_MS = 25;
/** retryAfterMs of a limits_unavailable answer. */
const UNAVAILABLE_RETRY_MS = 1_000;

class RedisTimeout extends Error {}

export function createLimiter(opts: CreateLimiterOptions = {}): Limiter {
  const leaseMs = opts.leaseMs ?? DEFAULT_LEASE_MS;
  const local = createMemoryLimiter({ leaseMs, ...(opts.now ? { now: opts.now } : {}) });
  const cfg = opts.redis;
  if (!cfg?.url) return local;

  const timeoutMs = cfg.timeoutMs ?? 100;
  const onError = cfg.onError ?? 'open';
  const log = opts.log ?? (() => undefined);
  let down = false;
  let closing = false;
  const setDown = (isDown: boolean, error?: string): void => {
    if (isDown === down || closing) return;
    down = isDown;
    log(isDown ? 'limits_redis_down' : 'limits_redis_up', error ? { error } : {});
  };

  const client = createRedisClient({
    url: cfg.url,
    timeoutMs,
    onState: (state, f) => setDown(state === 'down', f.error),
  });
  const shared = createRedisLimiter({
    redis: client,
    prefix: cfg.prefix ?? 'kw',
    leaseMs,
    // An admission Redis only gets to after ioredis gave up on it must change nothing; a
    // quarter of the budget is left for the reply's way back.
    staleAfterMs: Math.max(1, Math.floor(timeoutMs * 0.75)),
  });
  let failOpenAdmissions = 0;
  let guardTimeouts = 0;
  let failuresInARow = 0;
  let skipUntil = 0;

  let connecting = true;
  const firstAttempt = new Promise<void>((resolve) => {
    const settled = (): void => {
      connecting = false;
      resolve();
    };
    for (const event of ['ready', 'error', 'close', 'end']) client.once(event, settled);
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

  // Quota reads and spend holds follow the same breaker and onError rules (failover-money.ts).
  const money = createMoneyFailover({
    shared,
    local,
    timeoutMs,
    onError,
    gate: {
      skip: () => performance.now() < skipUntil,
      ready: () => (connecting ? firstConnection() : undefined),
      succeeded: () => {
        failuresInARow = 0;
        setDown(false);
      },
      failed: (err) => {
        if (++failuresInARow >= BREAKER_AFTER) skipUntil = performance.now() + BREAKER_MS;
        setDown(true, err instanceof Error ? err.message : String(err));
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
      if (performance.now() < skipUntil) return degrade(input);
      if (connecting) await firstConnection();
      try {
        const res = await withDeadline(shared.admit(input));
        failuresInARow = 0;
        setDown(false);
        return res;
      } catch (err) {
        if (++failuresInARow >= BREAKER_AFTER) skipUntil = performance.now() + BREAKER_MS;
        setDown(true, err instanceof Error ? err.message : String(err));
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

/**
 * Redis time minus local time, learned from script replies: a deadline sent to Redis has to
 * be in Redis time. A sample can only come out low (the reply takes time to be read), never
 * high, so the largest recent sample is the best estimate. It decays by 1 ms per second so
 * that a local clock stepping forward is followed; until then deadlines are only more lenient.
 */
export interface RedisClock {
  learn(redisNow: number | undefined): void;
  /** When set (staleAfterMs), the Redis time after which a call sent now must change nothing; else 0. */
  deadline(): number;
}

/**
 * The offset assumed before any reply has told it: Redis up to this far ahead of local time.
 * Without a deadline, calls sent before the first reply (a Redis that hung right after the
 * connection opened) ran whenever Redis got to them, long after their requests were answered
 * 503, and took from buckets and budgets. A Redis further ahead refuses those first calls as
 * late, and their replies teach the offset.
 */
export const UNKNOWN_OFFSET_MS = 1_000;

export function createRedisClock(staleAfterMs: number | undefined, now: () => number = Date.now): RedisClock {
  let offset: number | null = null;
  let sampledAt = 0;
  return {
    learn(redisNow) {
      if (typeof redisNow !== 'number') return;
      const local = now();
      const sample = redisNow - local;
      const decayed = offset === null ? sample : offset - Math.max(0, local - sampledAt) / 1000;
      offset = Math.max(sample, decayed);
      sampledAt = local;
    },
    deadline: () => (staleAfterMs ? Math.ceil(now() + (offset ?? UNKNOWN_OFFSET_MS) + staleAfterMs) : 0),
  };
}

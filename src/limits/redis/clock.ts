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

export function createRedisClock(staleAfterMs: number | undefined): RedisClock {
  let offset: number | null = null;
  let sampledAt = 0;
  return {
    learn(redisNow) {
      if (typeof redisNow !== 'number') return;
      const local = Date.now();
      const sample = redisNow - local;
      const decayed = offset === null ? sample : offset - Math.max(0, local - sampledAt) / 1000;
      offset = Math.max(sample, decayed);
      sampledAt = local;
    },
    deadline: () => (staleAfterMs && offset !== null ? Math.ceil(Date.now() + offset + staleAfterMs) : 0),
  };
}

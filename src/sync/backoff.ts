/**
 * Retry delays for the sync client and the usage pusher: exponential, capped, with jitter
 * so that many sidecars that lost the console together do not come back in lockstep.
 */
export interface BackoffOptions {
  baseMs?: number;
  maxMs?: number;
  /** injectable for tests; defaults to Math.random */
  random?: () => number;
}

/**
 * Delay before retry number `attempt` (1-based): half of the capped exponential step plus
 * a random part of the other half ("equal jitter"), so it is never zero and never above max.
 */
export function backoffDelay(attempt: number, opts: BackoffOptions = {}): number {
  const base = opts.baseMs ?? 250;
  const max = opts.maxMs ?? 30_000;
  const step = Math.min(max, base * 2 ** Math.min(Math.max(attempt - 1, 0), 30));
  return Math.round(step / 2 + (opts.random ?? Math.random)() * (step / 2));
}

/** Resolves after `ms`, or at once when the signal aborts. Never rejects. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}

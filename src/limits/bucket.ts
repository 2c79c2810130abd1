/**
 * Token-bucket and lease arithmetic shared by the in-process limiter. lua/bucket.lua (used by
 * admit, lease, settle and peek) implements the same formulas, plus the slice ceiling of
 * redis/slices.ts; the conformance suite holds both to them.
 *
 * A bucket of capacity N refills continuously at N per WINDOW_MS. It is stored as
 * (tokens, ts): the level at time ts. An absent bucket is full; a stored one is kept
 * for keepMs.
 */

import type { LimitCheck, LimitCode, Quota } from './limiter.js';

export const WINDOW_MS = 60_000;

/**
 * Upper bound on retryAfterMs for a concurrency denial. A slot frees when any in-flight
 * request ends, which nobody can predict, and live leases are refreshed so their expiry
 * says little; we answer the soonest lease expiry when it is sooner, else this.
 */
export const CONCURRENCY_RETRY_MS = 1_000;

export interface BucketState {
  tokens: number;
  ts: number;
}

/** Level of the bucket at `now`: stored level plus refill, never above capacity. */
export function bucketLevel(state: BucketState | undefined, capacity: number, now: number): number {
  if (!state) return capacity;
  const elapsed = Math.max(0, now - state.ts);
  return Math.min(capacity, state.tokens + (elapsed * capacity) / WINDOW_MS);
}

/** Milliseconds until a bucket at `level` holds `need` tokens (at least 1). */
export function refillWaitMs(level: number, need: number, capacity: number): number {
  return Math.max(1, Math.ceil(((need - level) * WINDOW_MS) / capacity));
}

/** Milliseconds until a bucket at `level` is full again. */
export function fullAgainMs(level: number, capacity: number): number {
  return Math.max(1, Math.ceil(((capacity - level) * WINDOW_MS) / capacity));
}

/**
 * How long a stored bucket is kept (its TTL): at least one window, and until it is full
 * again. A bucket at 0 or more tokens untouched for a window is full at any capacity, so
 * forgetting it then (absent = full) refills nothing, even after the capacity was raised
 * (DESIGN section 12: a changed limit applies to the state it finds). One in debt is kept
 * until it is full at the capacity read last (bucket.lua's store and bucket alike).
 */
export function keepMs(level: number, capacity: number): number {
  return Math.max(WINDOW_MS, fullAgainMs(level, capacity));
}

/**
 * TPM admission rule: the bucket holds the estimate, or it is full (so one request larger
 * than the whole bucket can still go through, taking the bucket negative). A request that
 * reserves nothing (count_tokens) is never held back by TPM.
 */
export function tpmAdmits(level: number, tokens: number, capacity: number): boolean {
  return tokens <= 0 || level >= tokens || level >= capacity;
}

/** Tokens the TPM bucket must hold before `tokens` is admitted. */
export function tpmNeed(tokens: number, capacity: number): number {
  return Math.min(tokens, capacity);
}

/** retryAfterMs for a full lease set, from the soonest expiry (see CONCURRENCY_RETRY_MS). */
export function concurrencyWaitMs(soonestExpiry: number | undefined, now: number): number {
  if (soonestExpiry === undefined) return CONCURRENCY_RETRY_MS;
  return Math.max(1, Math.min(CONCURRENCY_RETRY_MS, Math.ceil(soonestExpiry - now)));
}

/** Result codes shared with the Lua scripts (admit.lua and lease.lua return the index, from 1). */
export const CODES = ['route_capacity_exceeded', 'rpm_exceeded', 'tpm_exceeded', 'concurrency_exceeded'] as const;

/** The checks in admit.lua's order; admit.lua returns the refusing one's index, from 1. */
export const CHECKS: readonly LimitCheck[] = ['route_concurrency', 'route_rpm', 'rpm', 'tpm', 'concurrency', 'model_rpm', 'model_tpm'];

/** The code each check answers with (DESIGN section 5, step 8). */
export const CHECK_CODES: Readonly<Record<LimitCheck, LimitCode>> = {
  route_concurrency: 'route_capacity_exceeded',
  route_rpm: 'route_capacity_exceeded',
  rpm: 'rpm_exceeded',
  tpm: 'tpm_exceeded',
  concurrency: 'concurrency_exceeded',
  model_rpm: 'rpm_exceeded',
  model_tpm: 'tpm_exceeded',
};

/** A refusal's quota figures: as read, with remaining 0 on the key's own bucket that refused. */
export function refusedQuota(quota: Quota, check: LimitCheck): Quota {
  if (check === 'rpm' && quota.requests) return { requests: { ...quota.requests, remaining: 0 }, tokens: quota.tokens };
  if (check === 'tpm' && quota.tokens) return { requests: quota.requests, tokens: { ...quota.tokens, remaining: 0 } };
  return quota;
}

/** A bucket's quota figures at `level` (admit.lua and peek.lua compute the same). */
export function bucketQuota(level: number, capacity: number): { limit: number; remaining: number; resetMs: number } {
  return {
    limit: capacity,
    remaining: Math.max(0, Math.floor(level)),
    resetMs: level >= capacity ? 0 : Math.ceil(((capacity - level) * WINDOW_MS) / capacity),
  };
}

/** The key's own quota from a script reply [rpm remaining, rpm reset, tpm remaining, tpm reset]; 0 = no limit. */
export function quotaFromReply(rpm: number, tpm: number, v: number[]): Quota {
  return {
    requests: rpm > 0 ? { limit: rpm, remaining: Number(v[0] ?? 0), resetMs: Number(v[1] ?? 0) } : null,
    tokens: tpm > 0 ? { limit: tpm, remaining: Number(v[2] ?? 0), resetMs: Number(v[3] ?? 0) } : null,
  };
}

/** The tokens a request reserves for its estimate: whole, never negative. */
export function reservedTokens(estimate: number): number {
  return Math.max(0, Math.ceil(estimate));
}

/**
 * What settling a TPM reservation to the real usage gives back: reserved minus real
 * (positive refunds, negative charges the difference). Null when the usage is unknown or
 * equals the reservation: then the reservation stands as it is.
 */
export function tokensBack(reserved: number, usage: { tokens: number | null } | undefined): number | null {
  const real = usage?.tokens;
  if (typeof real !== 'number' || !Number.isFinite(real) || real === reserved) return null;
  return reserved - reservedTokens(real);
}

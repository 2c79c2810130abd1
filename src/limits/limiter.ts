/**
 * The Limiter contract (DESIGN section 6). The pipeline calls `admit` once per model
 * request after the policy check, and `finish` on the returned lease exactly when the
 * response has ended or either side has gone away. Implementations: redis.ts
 * (shared, exact across instances) and memory.ts (one process; also the fail-open
 * fallback). Both pass the same conformance suite.
 */

/** A key's own limits; null or 0 means unlimited. */
export interface KeyLimits {
  rpm: number | null;
  tpm: number | null;
  concurrency: number | null;
}

/** Capacity of the upstream the request is routed to, across all keys; 0 = unlimited. */
export interface RouteCapacity {
  name: string;
  concurrency: number;
  rpm: number;
}

export interface AdmitInput {
  keyId: string;
  limits: KeyLimits;
  /** TPM reservation: estimated prompt tokens plus the requested output cap. 0 for count_tokens. */
  tokens: number;
  route: RouteCapacity;
  requestId: string;
}

export type LimitCode = 'route_capacity_exceeded' | 'rpm_exceeded' | 'tpm_exceeded' | 'concurrency_exceeded';

export interface Lease {
  /**
   * Settles the TPM reservation and frees the concurrency slots. `tokens` is the real
   * usage read from the response (input + output), or null when it is unknown (stream
   * cut short, no usage reported): then the reservation is kept. Idempotent; never throws.
   */
  finish(usage: { tokens: number | null }): void;
}

export type AdmitResult =
  | { ok: true; lease: Lease }
  | { ok: false; code: LimitCode; retryAfterMs: number }
  /** Redis failed and `onError: closed`: the pipeline answers 503 limits_unavailable. */
  | { ok: false; code: 'limits_unavailable'; retryAfterMs: number };

export interface LimiterStats {
  redisErrors: number;
  failOpenAdmissions: number;
  slotsHeld: number;
}

export interface Limiter {
  admit(input: AdmitInput): Promise<AdmitResult>;
  stats(): LimiterStats;
  close(): Promise<void>;
}

/** Treats null and non-positive limits alike: no limit. */
export function isLimited(n: number | null | undefined): n is number {
  return typeof n === 'number' && n > 0;
}

/** Whether the request is subject to any limit at all; if not, no store needs to be asked. */
export function hasAnyLimit(input: Pick<AdmitInput, 'limits' | 'route'>): boolean {
  const { limits, route } = input;
  return [limits.rpm, limits.tpm, limits.concurrency, route.concurrency, route.rpm].some(isLimited);
}

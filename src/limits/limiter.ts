/**
 * The Limiter contract (DESIGN section 6). The pipeline calls `admit` once per model
 * request after the policy check, and `finish` on the returned lease exactly when the
 * response has ended or either side has gone away. Implementations: redis/limiter.ts
 * (shared, exact across instances) and memory.ts (one process; also the fail-open
 * fallback). Both pass the same conformance suite.
 *
 * Where things are: create.ts builds the limiter the sidecar runs with; failover.ts,
 * failover-guard.ts and failover-money.ts say what happens when Redis fails; memory.ts (with
 * memory-store.ts, memory-admission.ts), ledger-memory.ts and claims-memory.ts are the
 * in-process limiter, ledger and claims; bucket.ts, ledger.ts, leases.ts and lease-term.ts hold
 * the arithmetic, lease keeping and lease term they share with Redis; hold-watch.ts reports
 * holds to the budget alerts.
 * redis/ holds the Redis limiter (limiter.ts), its two admission paths (request-path.ts,
 * lease-path.ts), its ledger (ledger.ts, with hold-queue.ts and spend-slices.ts), claims
 * (claims.ts), the settlement batch and the Lua.
 */

import type { Holder } from '../policy/holders.js';

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

/** The key's first matching `modelLimits` entry: its own buckets, under the key's hash tag. */
export interface ModelLimitInput {
  pattern: string;
  rpm: number | null;
  tpm: number | null;
}

export interface AdmitInput {
  keyId: string;
  limits: KeyLimits;
  /** Applies in addition to the key's own limits, with the same codes (DESIGN section 6). */
  modelLimit?: ModelLimitInput | null;
  /** TPM reservation: estimated prompt tokens plus the requested output cap. 0 for count_tokens. */
  tokens: number;
  route: RouteCapacity;
  /** the request's wait on Redis (absent: this call's own) */
  wait?: RedisWait;
}

/**
 * The one wait on Redis that a request's steps share (DESIGN section 6: a request never waits
 * on Redis longer than `redis.timeoutMs`): its first guarded step starts it, the later ones
 * get what is left (failover-guard.ts). One per request, made by keyward: nothing the client
 * sends names it, so no other request can find it.
 */
export interface RedisWait {
  /** when the wait ends (performance.now()); null until a step starts it */
  endsAt: number | null;
}

export const newRedisWait = (): RedisWait => ({ endsAt: null });

export type LimitCode = 'route_capacity_exceeded' | 'rpm_exceeded' | 'tpm_exceeded' | 'concurrency_exceeded';

/**
 * Which check refused, where codes are shared: the route's concurrency and RPM both answer
 * route_capacity_exceeded, the key's and its per-model RPM both rpm_exceeded. Shadow limits
 * (DESIGN section 12) turn off exactly the check that refused and ask again.
 */
export type LimitCheck = 'route_concurrency' | 'route_rpm' | 'rpm' | 'tpm' | 'concurrency' | 'model_rpm' | 'model_tpm';

export interface Lease {
  /**
   * Settles the TPM reservation and frees the concurrency slots. `tokens` is the real
   * usage read from the response (input + output), or null when it is unknown (stream
   * cut short, no usage reported): then the reservation is kept. Idempotent; never throws.
   */
  finish(usage: { tokens: number | null }): void;
  /**
   * Undoes the admission entirely (RPM tokens, the TPM reservation, slots), for a request
   * refused after it (step 9) that was never forwarded: it took nothing. Idempotent, like
   * finish; once either has run, the other does nothing.
   */
  cancel(): void;
}

/** One bucket's figures; resetMs is the time until it is full again. */
export interface QuotaFigures {
  limit: number;
  remaining: number;
  resetMs: number;
}

/** The key's own RPM/TPM buckets (for x-ratelimit-* headers and GET /v1/key); null = no such limit. */
export interface Quota {
  requests: QuotaFigures | null;
  tokens: QuotaFigures | null;
}

/**
 * A refusal by a limit: nothing was consumed. `quota` is the key's own RPM/TPM figures as the
 * refusal found them, with remaining 0 on the bucket that refused (what a 429 for the key's
 * own RPM or TPM shows, DESIGN section 11).
 */
export interface LimitRefusal {
  ok: false;
  code: LimitCode;
  check: LimitCheck;
  retryAfterMs: number;
  quota: Quota;
}

export type AdmitResult =
  | { ok: true; lease: Lease; quota: Quota }
  | LimitRefusal
  /** Redis failed and `onError: closed`: the pipeline answers 503 limits_unavailable. */
  | { ok: false; code: 'limits_unavailable'; retryAfterMs: number };

export interface LimiterStats {
  redisErrors: number;
  failOpenAdmissions: number;
  slotsHeld: number;
  /** Spend holds taken by the in-process ledger because Redis failed (`onError: open`). */
  failOpenHolds: number;
  /** Spend holds in flight on this instance. */
  holdsHeld: number;
}

export interface HoldInput {
  /** the request's wait on Redis, shared with its admission (absent: this call's own) */
  wait?: RedisWait;
  /** one Redis Cluster hash tag for all of this request's holders: team key -> its project id, personal key -> its user id */
  tag: string;
  /**
   * Each budget holder's live ledger (DESIGN section 6, "Money"), from policy/holders.ts:
   * id (`key:k_1`, `project:p_1`, `wallet:u_1`), kind, base (the replica's figure: a budget
   * holder's `spent`, a wallet's `balance`), limit (the budget; null for a wallet), epoch,
   * and the code that refuses a hold it cannot fit.
   */
  holders: Holder[];
  /** the cost estimate (>= 0, in the console's currency) */
  amount: number;
}

export type HoldResult =
  | { ok: true; hold: Hold }
  | { ok: false; code: Holder['code']; retryAfterMs?: undefined }
  | { ok: false; code: 'limits_unavailable'; retryAfterMs: number };

export interface Hold {
  /** Replaces the hold with the actual cost (0 releases it). Idempotent, never throws; may be batched. */
  settle(actual: number): void;
}

export interface LedgerInput {
  tag: string;
  holders: Holder[];
  /**
   * Only the shared store's figures: when it cannot answer, reject with
   * LimitsUnavailableError in either `onError` mode, never this process's own figures
   * (budget alerts: a crossing judged on one instance's figures alone could be missed).
   */
  sharedOnly?: boolean;
}

/** Live spend (budget) or live balance (wallet), holds included. */
export interface LedgerFigure {
  id: string;
  live: number;
  /**
   * The epoch these figures belong to: the holder's, or a newer one the store has seen
   * already (this instance's replica lags behind another's).
   */
  epoch: number;
  /** The holder's figure when that epoch was first seen (a wallet: its balance at its epoch). */
  start: number;
}

/**
 * A claim (budget alerts, DESIGN section 13): `name` for one holder's epoch, granted to one
 * claimer across every instance and worker sharing the store.
 */
export interface ClaimInput {
  /** the holder's ledger hash tag (HoldInput.tag): the claim lives beside its ledger */
  tag: string;
  /** the holder's id (`key:k_1`, `project:p_1`, `wallet:u_1`) */
  holder: string;
  epoch: number;
  /** what is claimed, e.g. one alert threshold */
  name: string;
  /**
   * The claimer's mark. Asking again with the same token answers `claimed` again: a claim
   * whose answer was lost to a timeout can be asked for once more without losing it.
   */
  token: string;
  /** how long the holder's claims are kept after the last one */
  ttlMs: number;
  /**
   * > 0: the claim is pending this long, until its claimer says it is `done` (or `renew`s
   * it); a claim left pending past that is another claimer's to take over. Absent: for good.
   */
  pendingMs?: number;
  /**
   * Absent: claims. Else what the token that holds the claim says of it: `renew` (pending
   * pendingMs more), `done` (for good), `release` (any claimer takes it over now).
   */
  turn?: ClaimTurn;
}

export type ClaimTurn = 'renew' | 'done' | 'release';

/**
 * `claimed`: this token holds the claim; `taken`: another one does, or the claim is for an
 * epoch older than one claimed already; `held`: another one holds it pending (ask again
 * later: it is taken over if its claimer stops); `unavailable`: the store could not answer
 * (ask again later).
 */
export type ClaimResult = 'claimed' | 'taken' | 'held' | 'unavailable';

/** The answer to a claim from the token that holds it and whether it is pending. */
export const claimResult = (token: string, holder: string | null, pending: boolean): ClaimResult =>
  holder === token ? 'claimed' : holder && pending ? 'held' : 'taken';

/**
 * What `peek` and `ledger` reject with when the store failed and `onError: closed`: no
 * figure of this process alone stands for the shared one then (GET /v1/key answers 503).
 */
export class LimitsUnavailableError extends Error {
  readonly code = 'limits_unavailable';
  constructor(readonly retryAfterMs: number) {
    super('the limits store is unavailable');
  }
}

export interface Limiter {
  admit(input: AdmitInput): Promise<AdmitResult>;
  /** The key's own quota figures now; no side effects (GET /v1/key). Rejects with LimitsUnavailableError (see there). */
  peek(input: { keyId: string; limits: KeyLimits }): Promise<Quota>;
  /** Takes the request's spend hold on every holder at once, or none (step 9). */
  hold(input: HoldInput): Promise<HoldResult>;
  /** Each holder's live figures; no side effects. Rejects with LimitsUnavailableError (see there). */
  ledger(input: LedgerInput): Promise<LedgerFigure[]>;
  /**
   * Claims `name` once per holder and epoch, across every instance sharing the store. A claim
   * of a newer epoch forgets the holder's older ones. Never falls back to this process alone:
   * when the store fails the answer is `unavailable`, never a second grant.
   */
  claimOnce(input: ClaimInput): Promise<ClaimResult>;
  /**
   * claimOnce that says who holds the claim: `input.token` when this call holds it, the
   * first claimer's token when another does, null when the epoch is older than the one the
   * store has. Rejects with LimitsUnavailableError when the store cannot answer (in either
   * `onError` mode). Budget alerts record a wallet's balance at its epoch this way: the
   * token is the figure, and the first one recorded stands for the epoch.
   */
  claimedBy(input: ClaimInput): Promise<string | null>;
  /**
   * Puts a new `limits.leaseMs` in force (a reload, DESIGN section 12): every slot, hold
   * and slice granted or refreshed from now on lives that long without a refresh. Those
   * granted before keep their expiry until their next refresh, which comes no later than
   * it would have.
   */
  setLeaseMs(ms: number): void;
  stats(): LimiterStats;
  close(): Promise<void>;
}

/** Treats null and non-positive limits alike: no limit. */
export function isLimited(n: number | null | undefined): n is number {
  return typeof n === 'number' && n > 0;
}

/** A limit as a capacity: 0 when there is no limit. */
export function capacityOf(n: number | null | undefined): number {
  return isLimited(n) ? n : 0;
}

/** Whether the request is subject to any limit at all; if not, no store needs to be asked. */
export function hasAnyLimit(input: Pick<AdmitInput, 'limits' | 'route' | 'modelLimit'>): boolean {
  const { limits, route, modelLimit } = input;
  return [limits.rpm, limits.tpm, limits.concurrency, route.concurrency, route.rpm, modelLimit?.rpm, modelLimit?.tpm].some(isLimited);
}

/** What a key without RPM/TPM limits reports. */
export const NO_QUOTA: Quota = Object.freeze({ requests: null, tokens: null });

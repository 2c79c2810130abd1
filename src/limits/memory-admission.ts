/**
 * One admission of the in-process limiter, and its lease once admitted: the rules of
 * lua/admit.lua on a MemoryStore. Every check runs before anything is written; the first
 * failure names the code and the longest wait among failures is when the request would fit.
 */
import { concurrencyWaitMs, refillWaitMs, reservedTokens, tokensBack, tpmAdmits, tpmNeed } from './bucket.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from './leases.js';
import { type AdmitInput, type AdmitResult, type Lease, type LimitCode, type Quota, capacityOf, isLimited } from './limiter.js';
import { type MemoryStore, soonestExpiry } from './memory-store.js';

/** What an admission needs of its limiter. */
export interface AdmissionContext {
  store: MemoryStore;
  keeper: LeaseKeeper;
  leaseMs: number;
}

/**
 * One admission; once admitted, its lease. Its state is in ES private fields: a lease may be
 * printed or logged with its admission result, and shows nothing of its limiter.
 */
export class MemoryAdmission implements Lease {
  readonly #ctx: AdmissionContext;
  readonly #input: AdmitInput;
  readonly #t: number;
  readonly #tokens: number;
  /** the prefixes of the route's, the key's and the key's per-model buckets and lease sets */
  readonly #routePrefix: string;
  readonly #keyPrefix: string;
  readonly #modelPrefix: string;
  /** per-model capacities, 0 = none */
  readonly #modelRpm: number;
  readonly #modelTpm: number;
  /** bucket levels read by the checks, written back less what the request takes */
  #routeRpmLevel = 0;
  #keyRpmLevel = 0;
  #keyTpmLevel = 0;
  #modelRpmLevel = 0;
  #modelTpmLevel = 0;
  #code: LimitCode | null = null;
  #wait = -Infinity;
  #leaseId = '';
  readonly #setKeys: string[] = [];
  #kept: LeaseTicket = -1;
  #done = false;

  constructor(ctx: AdmissionContext, input: AdmitInput, t: number) {
    this.#ctx = ctx;
    this.#input = input;
    this.#t = t;
    this.#tokens = reservedTokens(input.tokens);
    this.#routePrefix = `r:${input.route.name}`;
    this.#keyPrefix = `k:${input.keyId}`;
    // The per-model buckets live beside the key's own, named by the matching pattern.
    this.#modelPrefix = `${this.#keyPrefix}:m:${input.modelLimit?.pattern ?? ''}`;
    this.#modelRpm = capacityOf(input.modelLimit?.rpm);
    this.#modelTpm = capacityOf(input.modelLimit?.tpm);
  }

  /** The denial when any limit refuses the request; null when it fits them all. */
  denial(): AdmitResult | null {
    const { route, limits } = this.#input;
    const r = this.#routePrefix;
    const k = this.#keyPrefix;
    const m = this.#modelPrefix;
    if (isLimited(route.concurrency)) this.#checkSlots(`${r}:conc`, route.concurrency, 'route_capacity_exceeded');
    if (isLimited(route.rpm)) this.#routeRpmLevel = this.#checkRequests(`${r}:rpm`, route.rpm, 'route_capacity_exceeded');
    if (isLimited(limits.rpm)) this.#keyRpmLevel = this.#checkRequests(`${k}:rpm`, limits.rpm, 'rpm_exceeded');
    if (isLimited(limits.tpm)) this.#keyTpmLevel = this.#checkTokens(`${k}:tpm`, limits.tpm);
    if (isLimited(limits.concurrency)) this.#checkSlots(`${k}:conc`, limits.concurrency, 'concurrency_exceeded');
    if (this.#modelRpm > 0) this.#modelRpmLevel = this.#checkRequests(`${m}:rpm`, this.#modelRpm, 'rpm_exceeded');
    if (this.#modelTpm > 0) this.#modelTpmLevel = this.#checkTokens(`${m}:tpm`, this.#modelTpm);
    return this.#code === null ? null : { ok: false, code: this.#code, retryAfterMs: this.#wait };
  }

  /** Takes a token of each RPM bucket, the reservation of each TPM bucket and a slot of each lease set. */
  take(): void {
    const { route, limits } = this.#input;
    const { store, keeper, leaseMs } = this.#ctx;
    const t = this.#t;
    const tokens = this.#tokens;
    if (isLimited(route.rpm)) store.store(`${this.#routePrefix}:rpm`, route.rpm, this.#routeRpmLevel - 1, t);
    if (isLimited(limits.rpm)) store.store(`${this.#keyPrefix}:rpm`, limits.rpm, this.#keyRpmLevel - 1, t);
    if (isLimited(limits.tpm) && tokens > 0) store.store(`${this.#keyPrefix}:tpm`, limits.tpm, this.#keyTpmLevel - tokens, t);
    if (this.#modelRpm > 0) store.store(`${this.#modelPrefix}:rpm`, this.#modelRpm, this.#modelRpmLevel - 1, t);
    if (this.#modelTpm > 0 && tokens > 0) store.store(`${this.#modelPrefix}:tpm`, this.#modelTpm, this.#modelTpmLevel - tokens, t);
    this.#leaseId = newLeaseId();
    if (isLimited(route.concurrency)) this.#setKeys.push(`${this.#routePrefix}:conc`);
    if (isLimited(limits.concurrency)) this.#setKeys.push(`${this.#keyPrefix}:conc`);
    for (const setKey of this.#setKeys) store.addLease(setKey, this.#leaseId, t + leaseMs);
    this.#kept = keeper.add(this.#leaseId, this.#setKeys);
  }

  /** The key's own RPM/TPM figures as the admission left them. */
  quota(): Quota {
    return this.#ctx.store.quota(this.#input.limits, this.#keyPrefix, this.#t);
  }

  finish(usage: { tokens: number | null }): void {
    if (this.#done) return;
    this.#done = true;
    const { store, keeper } = this.#ctx;
    keeper.remove(this.#kept);
    for (const setKey of this.#setKeys) store.removeLease(setKey, this.#leaseId);
    const back = tokensBack(this.#tokens, usage);
    if (back === null) return;
    const keyTpm = this.#input.limits.tpm;
    if (isLimited(keyTpm)) store.adjust(`${this.#keyPrefix}:tpm`, keyTpm, back);
    if (this.#modelTpm > 0) store.adjust(`${this.#modelPrefix}:tpm`, this.#modelTpm, back);
  }

  #deny(code: LimitCode, wait: number): void {
    this.#code ??= code;
    this.#wait = Math.max(this.#wait, wait);
  }

  /** A lease set of `cap` slots has one free. */
  #checkSlots(setKey: string, cap: number, code: LimitCode): void {
    const set = this.#ctx.store.liveSet(setKey, this.#t);
    if ((set?.size ?? 0) >= cap) this.#deny(code, concurrencyWaitMs(soonestExpiry(set), this.#t));
  }

  /** An RPM bucket holds a token; returns its level. */
  #checkRequests(key: string, cap: number, code: LimitCode): number {
    const level = this.#ctx.store.level(key, cap, this.#t);
    if (level < 1) this.#deny(code, refillWaitMs(level, 1, cap));
    return level;
  }

  /** A TPM bucket admits the reservation (bucket.ts, tpmAdmits); returns its level. */
  #checkTokens(key: string, cap: number): number {
    const level = this.#ctx.store.level(key, cap, this.#t);
    if (!tpmAdmits(level, this.#tokens, cap)) this.#deny('tpm_exceeded', refillWaitMs(level, tpmNeed(this.#tokens, cap), cap));
    return level;
  }
}

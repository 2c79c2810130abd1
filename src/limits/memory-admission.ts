/**
 * One admission of the in-process limiter, and its lease once admitted: the rules of
 * lua/admit.lua on a MemoryStore. Every check runs before anything is written; the first
 * failure names the code and the longest wait among failures is when the request would fit.
 */
import { CHECK_CODES, concurrencyWaitMs, refillWaitMs, refusedQuota, reservedTokens, tokensBack, tpmAdmits, tpmNeed } from './bucket.js';
import type { LeaseTerm } from './lease-term.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from './leases.js';
import { type AdmitInput, type Lease, type LimitCheck, type LimitCode, type LimitRefusal, type Quota, capacityOf, isLimited } from './limiter.js';
import { type MemoryStore, soonestExpiry } from './memory-store.js';

/** What an admission needs of its limiter. */
export interface AdmissionContext {
  store: MemoryStore;
  keeper: LeaseKeeper;
  term: LeaseTerm;
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
  #check: LimitCheck = 'rpm';
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
  denial(): LimitRefusal | null {
    const { route, limits } = this.#input;
    const r = this.#routePrefix;
    const k = this.#keyPrefix;
    const m = this.#modelPrefix;
    if (isLimited(route.concurrency)) this.#checkSlots(`${r}:conc`, route.concurrency, 'route_concurrency');
    if (isLimited(route.rpm)) this.#routeRpmLevel = this.#checkRequests(`${r}:rpm`, route.rpm, 'route_rpm');
    if (isLimited(limits.rpm)) this.#keyRpmLevel = this.#checkRequests(`${k}:rpm`, limits.rpm, 'rpm');
    if (isLimited(limits.tpm)) this.#keyTpmLevel = this.#checkTokens(`${k}:tpm`, limits.tpm, 'tpm');
    if (isLimited(limits.concurrency)) this.#checkSlots(`${k}:conc`, limits.concurrency, 'concurrency');
    if (this.#modelRpm > 0) this.#modelRpmLevel = this.#checkRequests(`${m}:rpm`, this.#modelRpm, 'model_rpm');
    if (this.#modelTpm > 0) this.#modelTpmLevel = this.#checkTokens(`${m}:tpm`, this.#modelTpm, 'model_tpm');
    if (this.#code === null) return null;
    return { ok: false, code: this.#code, check: this.#check, retryAfterMs: this.#wait, quota: refusedQuota(this.quota(), this.#check) };
  }

  /** Takes a token of each RPM bucket, the reservation of each TPM bucket and a slot of each lease set. */
  take(): void {
    const { route, limits } = this.#input;
    const { store, keeper, term } = this.#ctx;
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
    for (const setKey of this.#setKeys) store.addLease(setKey, this.#leaseId, t + term.ms);
    this.#kept = keeper.add(this.#leaseId, this.#setKeys);
  }

  /** The key's own RPM/TPM figures as the admission left them. */
  quota(): Quota {
    return this.#ctx.store.quota(this.#input.limits, this.#keyPrefix, this.#t);
  }

  finish(usage: { tokens: number | null }): void {
    this.#close(tokensBack(this.#tokens, usage), 0);
  }

  cancel(): void {
    this.#close(this.#tokens, 1);
  }

  /** Frees the slots and gives `tokensBack` to the TPM buckets and `requestsBack` to the RPM buckets. */
  #close(tokensBack: number | null, requestsBack: number): void {
    if (this.#done) return;
    this.#done = true;
    const { store, keeper } = this.#ctx;
    keeper.remove(this.#kept);
    for (const setKey of this.#setKeys) store.removeLease(setKey, this.#leaseId);
    const { route, limits } = this.#input;
    if (requestsBack > 0) {
      if (isLimited(route.rpm)) store.adjust(`${this.#routePrefix}:rpm`, route.rpm, requestsBack);
      if (isLimited(limits.rpm)) store.adjust(`${this.#keyPrefix}:rpm`, limits.rpm, requestsBack);
      if (this.#modelRpm > 0) store.adjust(`${this.#modelPrefix}:rpm`, this.#modelRpm, requestsBack);
    }
    if (tokensBack === null || tokensBack === 0) return;
    if (isLimited(limits.tpm)) store.adjust(`${this.#keyPrefix}:tpm`, limits.tpm, tokensBack);
    if (this.#modelTpm > 0) store.adjust(`${this.#modelPrefix}:tpm`, this.#modelTpm, tokensBack);
  }

  /** The first failing check names the code and the check; the wait is the longest among failures. */
  #deny(check: LimitCheck, wait: number): void {
    if (this.#code === null) {
      this.#code = CHECK_CODES[check];
      this.#check = check;
    }
    this.#wait = Math.max(this.#wait, wait);
  }

  /** A lease set of `cap` slots has one free. */
  #checkSlots(setKey: string, cap: number, check: LimitCheck): void {
    const set = this.#ctx.store.liveSet(setKey, this.#t);
    if ((set?.size ?? 0) >= cap) this.#deny(check, concurrencyWaitMs(soonestExpiry(set), this.#t));
  }

  /** An RPM bucket holds a token; returns its level. */
  #checkRequests(key: string, cap: number, check: LimitCheck): number {
    const level = this.#ctx.store.level(key, cap, this.#t);
    if (level < 1) this.#deny(check, refillWaitMs(level, 1, cap));
    return level;
  }

  /** A TPM bucket admits the reservation (bucket.ts, tpmAdmits); returns its level. */
  #checkTokens(key: string, cap: number, check: LimitCheck): number {
    const level = this.#ctx.store.level(key, cap, this.#t);
    if (!tpmAdmits(level, this.#tokens, cap)) this.#deny(check, refillWaitMs(level, tpmNeed(this.#tokens, cap), cap));
    return level;
  }
}

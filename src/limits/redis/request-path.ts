/**
 * The per-request admission path (lua/admit.lua): every request whose route or per-model
 * limits rule out the lease path (lease-path.ts), and every request when `lease` is off.
 *
 * Why admission stays one round trip: a Lua script may only touch keys of one hash slot in a
 * Cluster, and a route's keys and a key's keys live in different hash slots (often on
 * different nodes), so no single script can check both atomically there.
 *  - Standalone Redis has no hash slots: one admit.lua call gets both groups of keys and
 *    checks route, RPM, TPM, concurrency in order before writing anything. Exact, nothing
 *    consumed on any denial.
 *  - Cluster, when both the route and the key are limited: admit.lua runs once per hash tag,
 *    both calls sent at the same time (one round trip of latency). Each call is itself
 *    all-or-nothing. When one side admits and the other denies, the admitted side is undone
 *    with settle.lua (its RPM token and TPM reservation given back, its slot freed); that
 *    extra trip happens only on the denial path. The price: for the moment between the two
 *    calls and the undo, the undone reservation is visible to concurrent requests, which
 *    may see one slot or token fewer than they would have. When only the route or only the
 *    key is limited (the common case) there is a single call and no such window.
 */
import { quotaFromReply, reservedTokens, tokensBack } from '../bucket.js';
import type { LeaseTerm } from '../lease-term.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from '../leases.js';
import { type AdmitInput, type AdmitResult, NO_QUOTA, capacityOf, hasAnyLimit } from '../limiter.js';
import { type RedisLease, StaleAdmissionError, errorTags, hashTag } from './api.js';
import type { RedisClock } from './clock.js';
import { admitRefusal, checkAdmitRefusal, knownOutcome } from './replies.js';
import type { RunScript } from './scripts.js';
import type { BucketWrite } from './settle-batch.js';

/** A group of writes inside one hash tag, as settle.lua takes them. */
export interface Part {
  tag: string;
  buckets: BucketWrite[];
  sets: string[];
}

/** What the per-request path needs of its limiter (limiter.ts). */
export interface RequestPathContext {
  /** the script runner that flushes the settlement batch first */
  send: RunScript;
  clock: RedisClock;
  keeper: LeaseKeeper;
  /** a slot's lifetime without a refresh */
  term: LeaseTerm;
  prefix: string;
  cluster: boolean;
  /** Queues the parts' writes for the next settlement batch. */
  settle(leaseId: string, parts: Part[]): void;
  /** Counts a Redis failure (stats().redisErrors). */
  failed(op: 'admit' | 'settle', err: unknown): void;
}

const NOOP_LEASE: RedisLease = { finish: () => undefined, cancel: () => undefined };

/** Rejects when Redis fails (createLimiter applies onError). */
export function admitPerRequest(ctx: RequestPathContext, input: AdmitInput): Promise<AdmitResult> {
  if (!hasAnyLimit(input)) return Promise.resolve({ ok: true, lease: NOOP_LEASE, quota: NO_QUOTA });
  return new RequestAdmission(ctx, input).admit();
}

/**
 * One request on the per-request path: its limits, its keys, and once admitted its lease.
 * Its state is in ES private fields: a lease may be printed or logged with its admission
 * result, and shows nothing of its limiter.
 */
class RequestAdmission implements RedisLease {
  readonly #ctx: RequestPathContext;
  /** each limit's capacity, 0 = not limited */
  readonly #routeConc: number;
  readonly #routeRpm: number;
  readonly #keyRpm: number;
  readonly #keyTpm: number;
  readonly #keyConc: number;
  readonly #modelRpm: number;
  readonly #modelTpm: number;
  readonly #tokens: number;
  readonly #routeTag: string;
  readonly #keyTag: string;
  readonly #routeKeys: string[];
  readonly #keyKeys: string[];
  readonly #leaseId: string;
  /** What undoing each side takes: its tokens back and its slot freed. */
  readonly #routeUndo: Part;
  readonly #keyUndo: Part;
  readonly #deadline: number;
  #kept: LeaseTicket = -1;
  #done = false;

  constructor(ctx: RequestPathContext, input: AdmitInput) {
    const { route, limits } = input;
    this.#ctx = ctx;
    this.#tokens = reservedTokens(input.tokens);
    this.#routeConc = capacityOf(route.concurrency);
    this.#routeRpm = capacityOf(route.rpm);
    this.#keyRpm = capacityOf(limits.rpm);
    this.#keyTpm = capacityOf(limits.tpm);
    this.#keyConc = capacityOf(limits.concurrency);
    this.#modelRpm = capacityOf(input.modelLimit?.rpm);
    this.#modelTpm = capacityOf(input.modelLimit?.tpm);
    this.#routeTag = hashTag(ctx.prefix, 'r', route.name);
    this.#keyTag = hashTag(ctx.prefix, 'k', input.keyId);
    this.#routeKeys = [`${this.#routeTag}:rpm`, `${this.#routeTag}:conc`];
    this.#keyKeys = this.#keyKeysOf(input.modelLimit?.pattern);
    this.#leaseId = newLeaseId();
    this.#routeUndo = this.#routeUndoPart();
    this.#keyUndo = this.#keyUndoPart();
    this.#deadline = ctx.clock.deadline();
  }

  async admit(): Promise<AdmitResult> {
    const routeOn = this.#routeConc > 0 || this.#routeRpm > 0;
    const keyOn = this.#keyRpm > 0 || this.#keyTpm > 0 || this.#keyConc > 0 || this.#modelRpm > 0 || this.#modelTpm > 0;
    let verdict: number[];
    try {
      verdict = this.#ctx.cluster && routeOn && keyOn ? await this.#askEachHashTag() : await this.#ask(routeOn, keyOn);
    } catch (err) {
      this.#ctx.failed('admit', err);
      throw err;
    }
    if (verdict[0] !== 1) return admitRefusal(verdict, { rpm: this.#keyRpm, tpm: this.#keyTpm });
    // Admitted: the request's slots are kept alive until it finishes.
    this.#kept = this.#ctx.keeper.add(this.#leaseId, [...this.#routeUndo.sets, ...this.#keyUndo.sets]);
    return { ok: true, lease: this, quota: quotaFromReply(this.#keyRpm, this.#keyTpm, verdict.slice(4)) };
  }

  finish(usage: { tokens: number | null }): void {
    try {
      const back = tokensBack(this.#tokens, usage);
      const keyPart: Part = {
        tag: this.#keyTag,
        buckets: [
          ...(back !== null && this.#keyTpm > 0 ? [{ key: this.#keyKeys[1]!, cap: this.#keyTpm, delta: back }] : []),
          ...(back !== null && this.#modelTpm > 0 ? [{ key: this.#keyKeys[5]!, cap: this.#modelTpm, delta: back }] : []),
        ],
        sets: this.#keyUndo.sets,
      };
      this.#close([{ tag: this.#routeTag, buckets: [], sets: this.#routeUndo.sets }, keyPart]);
    } catch (err) {
      this.#ctx.failed('settle', err);
    }
  }

  cancel(): void {
    try {
      this.#close([this.#routeUndo, this.#keyUndo]);
    } catch (err) {
      this.#ctx.failed('settle', err);
    }
  }

  /** One admit.lua call on the route's group of keys (r), the key's (k), or both (a single node). */
  async #ask(r: boolean, k: boolean): Promise<number[]> {
    try {
      const keys = [...(r ? this.#routeKeys : []), ...(k ? this.#keyKeys : [])];
      // Admitted in Redis, answered after the call's deadline: nobody will finish it, so it is undone now.
      const late = (answer: unknown): void => {
        if (Array.isArray(answer) && Number(answer[0]) === 1) this.#ctx.settle(this.#leaseId, [...(r ? [this.#routeUndo] : []), ...(k ? [this.#keyUndo] : [])]);
      };
      const v = knownOutcome('admit.lua', await this.#ctx.send('keywardAdmit', keys, this.#argv(r, k), late), [1, 0, -1]);
      this.#ctx.clock.learn(v[3]);
      if (v[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
      if (v[0] === 0) checkAdmitRefusal(v);
      return v;
    } catch (err) {
      if (typeof err === 'object' && err !== null) errorTags.set(err, [...(r ? [this.#routeTag] : []), ...(k ? [this.#keyTag] : [])]);
      throw err;
    }
  }

  /** Cluster: one call per hash tag, sent together; an admitted side is undone if the other is not. */
  async #askEachHashTag(): Promise<number[]> {
    const [r, k] = await Promise.allSettled([this.#ask(true, false), this.#ask(false, true)]);
    const routeAdmitted = r.status === 'fulfilled' && r.value[0] === 1;
    const keyAdmitted = k.status === 'fulfilled' && k.value[0] === 1;
    if (routeAdmitted && keyAdmitted) return k.value;
    if (routeAdmitted) this.#ctx.settle(this.#leaseId, [this.#routeUndo]);
    if (keyAdmitted) this.#ctx.settle(this.#leaseId, [this.#keyUndo]);
    if (r.status === 'rejected') throw r.reason;
    if (k.status === 'rejected') throw k.reason;
    // Route first: its code and check win; the wait is the longest among the failing sides;
    // the key's quota figures are the key side's, whatever it answered.
    const denied = [r.value, k.value].filter((v) => v[0] !== 1);
    const [first] = denied;
    return [0, first![1]!, Math.max(...denied.map((v) => v[2]!)), first![3]!, ...k.value.slice(4, 8), first![8]!];
  }

  #close(parts: Part[]): void {
    if (this.#done) return;
    this.#done = true;
    this.#ctx.keeper.remove(this.#kept);
    this.#ctx.settle(this.#leaseId, parts);
  }

  /** RPM, TPM, lease set and its version 2 block weights (lua/slots.lua); the model's buckets ride along only when the key has a per-model limit. */
  #keyKeysOf(pattern: string | undefined): string[] {
    const t = this.#keyTag;
    const keys = [`${t}:rpm`, `${t}:tpm`, `${t}:conc`, `${t}:concw`];
    if (this.#modelRpm === 0 && this.#modelTpm === 0) return keys;
    const model = `${t}:m:${encodeURIComponent(pattern ?? '')}`;
    keys.push(`${model}:rpm`, `${model}:tpm`);
    return keys;
  }

  #routeUndoPart(): Part {
    return {
      tag: this.#routeTag,
      buckets: this.#routeRpm > 0 ? [{ key: this.#routeKeys[0]!, cap: this.#routeRpm, delta: 1 }] : [],
      sets: this.#routeConc > 0 ? [this.#routeKeys[1]!] : [],
    };
  }

  #keyUndoPart(): Part {
    const tokens = this.#tokens;
    const keys = this.#keyKeys;
    return {
      tag: this.#keyTag,
      buckets: [
        ...(this.#keyRpm > 0 ? [{ key: keys[0]!, cap: this.#keyRpm, delta: 1 }] : []),
        ...(this.#keyTpm > 0 && tokens > 0 ? [{ key: keys[1]!, cap: this.#keyTpm, delta: tokens }] : []),
        ...(this.#modelRpm > 0 ? [{ key: keys[4]!, cap: this.#modelRpm, delta: 1 }] : []),
        ...(this.#modelTpm > 0 && tokens > 0 ? [{ key: keys[5]!, cap: this.#modelTpm, delta: tokens }] : []),
      ],
      sets: this.#keyConc > 0 ? [keys[2]!] : [],
    };
  }

  /** admit.lua's ARGV (see its header). */
  #argv(r: boolean, k: boolean): (string | number)[] {
    return [
      this.#leaseId, this.#ctx.term.ms,
      r ? 1 : 0, this.#routeConc, this.#routeRpm,
      k ? 1 : 0, this.#keyRpm, this.#keyTpm, this.#keyConc, this.#tokens,
      this.#deadline, this.#modelRpm, this.#modelTpm,
    ];
  }
}

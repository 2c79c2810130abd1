/**
 * The decision pipeline: DESIGN section 5 in order, the first failure ends it. Every
 * step takes data and returns a value (a denial, or what the next step needs); nothing
 * here writes to the client. The exchange renders a Deny or forwards an Allow, so the
 * whole order is table-testable with a replica lookup, a limiter and a body reader
 * handed in.
 */
import { extractCredential, unknownKeyDenial, type OtherKey } from '../auth/credentials.js';
import { isWellFormedKey } from '../auth/keyformat.js';
import { hashRemembered, type KeyHasher, type KeyMemo } from '../auth/hash.js';
import { deny, type Denial } from '../errors.js';
import { hasAnyLimit, isLimited, newRedisWait, NO_QUOTA, type AdmitInput, type Lease, type Limiter, type Quota, type RedisWait } from '../limits/limiter.js';
import { admitShadowed, holdShadowed } from '../limits/shadow.js';
import { checkKey, checkModel, checkModels, checkStanding, modelLimitFor } from '../policy/decide.js';
import { holdersOf } from '../policy/holders.js';
import { costOf, priceName, type Price } from '../policy/pricing.js';
import { checkNetwork, looksLikeBrowser } from '../policy/network.js';
import { promptTokens, type Estimate } from '../policy/estimate.js';
import type { KeyFacts } from '../policy/facts.js';
import { dropLaterStepCodes, hasLaterStepCodes, isShadowed, shadowSet, type ShadowSet } from '../policy/shadow.js';
import { classify } from '../routes.js';
import type { BodyResult, BodySource, ReadOptions } from './body/read.js';
import type { UploadResult } from './body/upload.js';
import type { Snapshot } from './snapshot.js';
import { keyless, keyPrefixes } from './key-in-fields.js';
import { liveBudgetDenial } from './live-budget.js';

/**
 * What the pipeline decides with besides the config: the replica, the limiter, the key
 * hasher. The config's settings come with each request, in the snapshot it arrived under.
 */
export interface PipelineDeps {
  hashKey: KeyHasher;
  keyFormat: 'any' | 'keyward';
  lookup: (hash: string) => KeyFacts | null;
  ready: () => boolean;
  limiter: Limiter;
  /** the console's price for a model (most specific record), null when unpriced */
  priceFor: (model: string) => Price | null;
  /** a key's routing mode names no upstream: the request goes to `default` */
  onUnknownRouting: (mode: string) => void;
}

/** What the pipeline reads of a request: its head, and its body only when a step needs it. */
export interface RequestInput {
  method: string;
  url: string;
  rawHeaders: readonly string[];
  /** the client's address (DESIGN section 4), null when it cannot be told */
  clientIp: string | null;
  /** the connection's last key and its hash (none: the key is hashed) */
  keyMemo?: KeyMemo;
  /** step 6: reads the model body (called at most once, only on model routes) */
  readBody: (opts: ReadOptions) => Promise<BodyResult>;
  /** files routes: checks the body's declared size and wraps it to be counted as it streams */
  openUpload: (opts: { limit: number }) => UploadResult;
}

import { denied, type Allow, type Decision, type Seen } from './decision.js';

export type { Allow, Decision, Deny, Seen } from './decision.js';
export { denied };

/** The checks shadowed for this key: the config's `limits.shadow` and the key record's own. */
const shadowOf = (snap: Snapshot, facts: KeyFacts): ShadowSet => snap.shadow | shadowSet(facts.key.shadow);

function chooseUpstream(deps: PipelineDeps, snap: Snapshot, facts: KeyFacts): string {
  const mode = facts.key.routing;
  if (mode === null || snap.capacity.has(mode)) return mode ?? 'default';
  deps.onUnknownRouting(mode);
  return 'default';
}

const known = (deps: PipelineDeps, key: string, memo?: KeyMemo): KeyFacts | null =>
  deps.keyFormat === 'keyward' && !isWellFormedKey(key) ? null : deps.lookup(hashRemembered(deps.hashKey, key, memo));

/** The header of the first other key (credentials.ts) that is a key of the replica's. */
function otherKnownKey(deps: PipelineDeps, others: readonly OtherKey[]): string | null {
  for (const o of others) if (known(deps, o.value) !== null) return o.header;
  return null;
}

/** Steps 1-5: route, readiness, credential, key, network policy, standing. */
function authenticate(input: RequestInput, deps: PipelineDeps, snap: Snapshot, seen: Seen): Denial | null {
  const classified = classify(snap.rules, input.method, input.url);
  if (!classified.ok) {
    return classified.code === 'not_found' ? deny('not_found', { params: { method: input.method } }) : deny('invalid_path', { detail: classified.message });
  }
  const route = classified.route;
  seen.route = route;
  if (!deps.ready()) return deny('not_ready', { retryAfterMs: 1000 });
  const cred = extractCredential(input.rawHeaders, route.credentials);
  if (!cred.ok) return cred.denial;
  const smuggled = cred.others.length > 0 ? otherKnownKey(deps, cred.others) : null;
  if (smuggled) return deny('conflicting_api_keys', { variant: 'other_header', params: { header: smuggled } });
  const key = cred.key;
  const facts = known(deps, key, input.keyMemo);
  seen.facts = facts;
  return (
    checkKey(facts, () => unknownKeyDenial(key)) ??
    checkNetwork(facts!.key, { clientIp: input.clientIp, browser: looksLikeBrowser(input.rawHeaders), refuseBrowsers: snap.config.server.refuseBrowsers }) ??
    checkStanding(facts!, route.class, { budget: isShadowed(shadowOf(snap, facts!), 'budget'), codes: seen.shadow })
  );
}

/** Step 8's input: the key's limits, the TPM reservation and the upstream's capacity. */
function admission(snap: Snapshot, seen: Allow['seen'], tokens: number, wait: RedisWait): AdmitInput {
  const key = seen.facts.key;
  const capacity = snap.capacity.get(seen.upstream) ?? { concurrency: 0, rpm: 0 };
  return {
    keyId: key.id,
    limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency },
    modelLimit: modelLimitFor(key, seen.model),
    tokens,
    route: { name: seen.upstream, ...capacity },
    wait,
  };
}

/** The output a request reserves: the largest cap it names, else the configured default. */
function outputCap(named: number | null, fallback: number): number {
  return typeof named === 'number' && Number.isFinite(named) && named > 0 ? Math.ceil(named) : fallback;
}

/** Every Allow is built here, with its fields in one order: one object shape, no spreads. */
function allowed(seen: Allow['seen'], f: Omit<Allow, 'allow' | 'seen'>): Allow {
  return {
    allow: true,
    seen,
    body: f.body,
    bodyRead: f.bodyRead,
    lease: f.lease,
    quota: f.quota,
    hold: f.hold,
    price: f.price,
    tokens: f.tokens,
    estimate: f.estimate,
    metered: f.metered,
  };
}

/** the estimate of a request that is not metered (shared: estimates are only read) */
const NONE: Readonly<Estimate> = Object.freeze({ prompt: 0, output: 0, deferred: false });

/** What steps 6 and 7 leave: the body to forward, and the request's estimate when it is metered. */
type BodyStep = { denial: Denial } | { body: BodySource | null; estimate: Estimate; metered: boolean };

/**
 * Steps 6 and 7: a model request's body is read for its model, which must be in the key's
 * scope; a files body streams through unread, held to the upload limit it declares.
 */
async function bodyStep(input: RequestInput, o: { snap: Snapshot; admitted: Allow['seen']; seen: Seen }): Promise<BodyStep> {
  const { server, limits } = o.snap.config;
  const route = o.admitted.route;
  if (route.class !== 'model') {
    const upload = input.openUpload({ limit: server.maxUploadBytes });
    return upload.ok ? { body: upload.source, estimate: NONE, metered: false } : { denial: upload.denial };
  }
  const read = await input.readBody({ limit: server.maxJsonBodyBytes, uploadLimit: server.maxUploadBytes, modelRequired: route.modelRequired });
  if (!read.ok) return { denial: read.denial };
  const body = read.body.replay;
  o.seen.model = read.body.model;
  // A bodiless call on a stored response (GET or DELETE /v1/responses/{id}, a cancel)
  // selects no model, so scope does not apply; any other request without a model passes
  // only a key with an empty scope. An empty body (chunked with no chunk: 0 bytes read) is
  // no body, as `Content-Length: 0` is.
  const key = o.admitted.facts.key;
  const bodiless = body === null || read.body.estimateBytes === 0;
  // Only on a refusal: the model's name goes back in the answer, unless it holds a key.
  const shown = (model: string): string => keyless(model, keyPrefixes(input.rawHeaders));
  const scope = bodiless && route.storedCall ? null : (checkModel(key, read.body.model, shown) ?? checkModels(key, read.body.models, shown));
  if (scope) return { denial: scope };
  const metered = body !== null && !route.countTokens;
  const estimate: Estimate = metered
    ? { prompt: promptTokens(read.body.estimateBytes), output: outputCap(read.body.maxOutputTokens, limits.defaultOutputTokens), deferred: read.body.background }
    : NONE;
  if (metered && read.body.bytesSeen) estimate.bytesSeen = read.body.bytesSeen;
  return { body, estimate, metered };
}

/**
 * A listing response carries the key's own RPM and TPM figures like any forwarded response
 * (DESIGN section 11), read without taking anything; figures the limits store cannot give
 * now are left out rather than failing a request that no limit applies to.
 */
async function listingQuota(limiter: Limiter, key: KeyFacts['key']): Promise<Quota> {
  if (!isLimited(key.rpm) && !isLimited(key.tpm)) return NO_QUOTA;
  try {
    return await limiter.peek({ keyId: key.id, limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency } });
  } catch {
    return NO_QUOTA;
  }
}

/** Step 5 with live spend, for a model request a later step refuses or would refuse (live-budget.ts). */
function liveBudget(deps: PipelineDeps, o: { snap: Snapshot; admitted: Allow['seen']; wait: RedisWait }): Promise<Denial | null> {
  const facts = o.admitted.facts;
  if (o.admitted.route.class !== 'model') return Promise.resolve(null);
  const shadowed = isShadowed(shadowOf(o.snap, facts), 'budget');
  return liveBudgetDenial(deps.limiter, { facts, wait: o.wait, shadowed, codes: o.admitted.shadow });
}

/**
 * Step 9 refused the hold. When the live ledger shows a budget spent before this request's
 * cost, step 5 refused it: that holder's code and "used up", not the first holder the cost
 * did not fit and "ask for fewer tokens"; and the codes shadowed steps 6 to 8 recorded go,
 * as those steps come after. Null: the request's own cost is what did not fit. A hold of 0
 * (not metered) was that question already.
 */
async function spentBeforeHold(deps: PipelineDeps, o: { snap: Snapshot; admitted: Allow['seen']; wait: RedisWait; metered: boolean }): Promise<Denial | null> {
  const codes = o.admitted.shadow;
  if (!o.metered && !hasLaterStepCodes(codes)) return null;
  const spent = await liveBudget(deps, o);
  if (spent !== null) dropLaterStepCodes(codes);
  return spent;
}

/** Decides `input` under the settings of `snap`, the snapshot the request arrived under. */
export const newSeen = (): Seen => ({ route: null, facts: null, upstream: null, model: null, shadow: [] });

/**
 * Decides one request. `seen`, when the caller passes it, fills in as the steps learn the
 * route, key and model, so a request answered before its decision (its client gone mid-body,
 * its body stalled) is still logged with them.
 */
export async function decide(input: RequestInput, deps: PipelineDeps, snap: Snapshot, o: { seen?: Seen } = {}): Promise<Decision> {
  const seen = o.seen ?? newSeen();
  const wait = newRedisWait();
  const authDenial = authenticate(input, deps, snap, seen);
  if (authDenial) return denied(seen, authDenial);
  const admitted = seen as Allow['seen'];
  admitted.upstream = chooseUpstream(deps, snap, admitted.facts);
  const route = admitted.route;
  if (route.class === 'listing' || route.class === 'self') {
    const quota = route.class === 'listing' ? await listingQuota(deps.limiter, admitted.facts.key) : NO_QUOTA;
    return allowed(admitted, { body: null, bodyRead: false, lease: null, quota, hold: null, price: null, tokens: 0, estimate: NONE, metered: false });
  }

  const bodyRead = route.class === 'model';
  const read = await bodyStep(input, { snap, admitted, seen });
  if ('denial' in read) return denied(seen, (await liveBudget(deps, { snap, admitted, wait })) ?? read.denial);
  const { body, estimate, metered } = read;
  const tokens = estimate.prompt + estimate.output;

  const limits = admission(snap, admitted, tokens, wait);
  const shadow = { shadow: shadowOf(snap, admitted.facts), codes: seen.shadow };
  let lease: Lease | null = null;
  let quota = NO_QUOTA;
  // Nothing to enforce: no limiter round trip at all.
  if (hasAnyLimit(limits)) {
    const result = await admitShadowed(deps.limiter, limits, shadow);
    if (!result.ok) {
      // Limits that cannot be read now are answered at once: a ledger call would wait out the same timeout again.
      const spent = result.code === 'limits_unavailable' ? null : await liveBudget(deps, { snap, admitted, wait });
      if (spent) return denied(seen, spent);
      // A key's own RPM or TPM refusal shows the key's figures, as an OpenAI-compatible upstream's 429 does.
      const figures = result.code !== 'limits_unavailable' && (result.check === 'rpm' || result.check === 'tpm') ? result.quota : null;
      return denied(seen, deny(result.code, { retryAfterMs: result.retryAfterMs }), figures);
    }
    lease = result.lease;
    quota = result.quota;
  }
  // Step 9: the cost estimate is held on every budget the key draws on, all or none.
  // Budgets apply to model routes only: a files request holds nothing and checks none.
  const { tag, holders } = holdersOf(admitted.facts);
  if (holders.length === 0 || route.class !== 'model') return allowed(admitted, { body, bodyRead, lease, quota, hold: null, price: null, tokens, estimate, metered });
  // A request that is not metered (count_tokens, a call without a body) holds nothing, but
  // a budget its live ledger shows exhausted still refuses it (DESIGN section 5: live spend),
  // where the replica's figures may not have caught up yet: a hold of 0 asks exactly that.
  const price = metered ? deps.priceFor(priceName(seen.model)) : null;
  // A shadowed budget its live ledger shows spent is step 5's code, before those of shadowed limits.
  if (isShadowed(shadow.shadow, 'budget') && hasLaterStepCodes(seen.shadow)) await liveBudget(deps, { snap, admitted, wait });
  const held = await holdShadowed(deps.limiter, { wait, tag, holders, amount: metered ? costOf(price, { input: estimate.prompt, output: estimate.output }) : 0 }, shadow);
  if (!held.ok) {
    lease?.cancel(); // refused before forwarding: the admission took nothing
    if (held.code === 'limits_unavailable') return denied(seen, deny(held.code, { retryAfterMs: held.retryAfterMs }));
    return denied(seen, (await spentBeforeHold(deps, { snap, admitted, wait, metered })) ?? deny(held.code, metered ? { variant: 'hold' } : {}));
  }
  if (metered) return allowed(admitted, { body, bodyRead, lease, quota, hold: held.hold, price, tokens, estimate, metered });
  held.hold.settle(0);
  return allowed(admitted, { body, bodyRead, lease, quota, hold: null, price: null, tokens, estimate, metered });
}

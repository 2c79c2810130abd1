/**
 * The request pipeline: DESIGN section 5 in order, the first failure answers and
 * nothing is forwarded. Pure decisions come from routes, auth and policy; this file
 * only reads the request, asks the replica and the limiter, and writes the answer.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import { extractCredential, unknownKeyMessage } from '../auth/credentials.js';
import { isWellFormedKey } from '../auth/keyformat.js';
import type { KeyHasher } from '../auth/hash.js';
import { deny, renderError, type Denial, type ErrorStyle } from '../errors.js';
import { hasAnyLimit, type Limiter } from '../limits/limiter.js';
import { checkKey, checkModel, checkModels, checkStanding } from '../policy/decide.js';
import type { KeyFacts } from '../replica/store.js';
import { classify, type Route, type RouteRule } from '../routes.js';
import { hasBody, readModelBody, type BodySource } from './body.js';
import type { RequestContext } from './context.js';
import type { Forwarder } from './forward.js';
import { estimateTokens } from './usage.js';

export interface PipelineDeps {
  rules: readonly RouteRule[];
  hashKey: KeyHasher;
  keyFormat: 'any' | 'keyward';
  lookup: (hash: string) => KeyFacts | null;
  ready: () => boolean;
  limiter: Limiter;
  forwarder: Forwarder;
  upstreams: ReadonlyMap<string, { concurrency: number; rpm: number }>;
  maxJsonBodyBytes: number;
  /** output estimate for a request that names no cap (DESIGN section 6) */
  defaultOutputTokens: number;
  /** a key's routing mode names no upstream: the request goes to `default` */
  onUnknownRouting: (mode: string) => void;
  onDecision: (ctx: RequestContext, outcome: 'allow' | 'deny') => void;
}

/**
 * A denied request's unread body: Node discards a small one and keeps the connection;
 * a large or unsized one is not worth reading, so that connection is closed instead.
 */
function leavesLargeBodyUnread(req: IncomingMessage): boolean {
  if (req.complete || !hasBody(req)) return false;
  return !(Number(req.headers['content-length']) <= 65_536);
}

/** Writes a denial in the route's style. */
export function sendDenial(req: IncomingMessage, res: ServerResponse, ctx: RequestContext, denial: Denial, style: ErrorStyle): void {
  ctx.code = denial.code;
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const out = renderError(denial, style);
  const headers: Record<string, string> = { ...out.headers, 'x-request-id': ctx.reqId };
  if (leavesLargeBodyUnread(req)) headers.connection = 'close';
  res.writeHead(out.status, headers);
  res.end(out.body);
}

function chooseUpstream(deps: PipelineDeps, facts: KeyFacts): string {
  const mode = facts.key.routing;
  if (mode === null || deps.upstreams.has(mode)) return mode ?? 'default';
  deps.onUnknownRouting(mode);
  return 'default';
}

/** Steps 1-5: route, credential, key, standing. Returns the route and facts, or answers. */
function authenticate(req: IncomingMessage, res: ServerResponse, ctx: RequestContext, deps: PipelineDeps): { route: Route; facts: KeyFacts } | null {
  const classified = classify(deps.rules, ctx.method, req.url ?? '/');
  if (!classified.ok) {
    sendDenial(req, res, ctx, deny(classified.code, classified.message), 'openai');
    return null;
  }
  const route = classified.route;
  ctx.route = route;
  if (!deps.ready()) {
    sendDenial(req, res, ctx, deny('not_ready', 'The sidecar has not loaded its key replica yet; try again shortly.', { retryAfterMs: 1000 }), route.style);
    return null;
  }
  const cred = extractCredential(req.rawHeaders, route.credentials);
  if (!cred.ok) {
    sendDenial(req, res, ctx, cred.denial, route.style);
    return null;
  }
  const key = cred.key;
  const facts = deps.keyFormat === 'keyward' && !isWellFormedKey(key) ? null : deps.lookup(deps.hashKey(key));
  const denial = checkKey(facts, () => unknownKeyMessage(key)) ?? checkStanding(facts!, route.class);
  if (denial) {
    ctx.facts = facts;
    sendDenial(req, res, ctx, denial, route.style);
    return null;
  }
  ctx.facts = facts;
  return { route, facts: facts! };
}

export async function handleRequest(req: IncomingMessage, res: ServerResponse, ctx: RequestContext, deps: PipelineDeps, expectContinue: boolean): Promise<void> {
  const auth = authenticate(req, res, ctx, deps);
  if (!auth) return deps.onDecision(ctx, 'deny');
  const { route, facts } = auth;
  ctx.upstream = chooseUpstream(deps, facts);
  if (route.class === 'listing') {
    deps.onDecision(ctx, 'allow');
    return forward(req, res, ctx, deps, { body: null, expectContinue });
  }

  let tokens = 0;
  let body = null;
  if (route.class === 'model') {
    if (expectContinue) res.writeContinue();
    const read = await readModelBody(req, { limit: deps.maxJsonBodyBytes, modelRequired: route.modelRequired });
    if (res.destroyed) return; // the client went away while we read
    if (!read.ok) {
      sendDenial(req, res, ctx, read.denial, route.style);
      return deps.onDecision(ctx, 'deny');
    }
    body = read.body;
    ctx.model = body.model;
    // A bodiless call (GET or DELETE /v1/responses/{id}, a cancel) selects no model, so scope does not apply.
    const scope = body.replay === null ? null : (checkModel(facts.key, body.model) ?? checkModels(facts.key, body.models));
    if (scope) {
      sendDenial(req, res, ctx, scope, route.style);
      return deps.onDecision(ctx, 'deny');
    }
    // A bodiless call (a stored response, a cancel) generates nothing: no output estimate.
    tokens = route.countTokens || body.replay === null ? 0 : estimateTokens({ bodyBytes: body.estimateBytes, maxOutputTokens: body.maxOutputTokens ?? deps.defaultOutputTokens });
  }

  const capacity = deps.upstreams.get(ctx.upstream) ?? { concurrency: 0, rpm: 0 };
  const admission = {
    keyId: facts.key.id,
    limits: { rpm: facts.key.rpm, tpm: facts.key.tpm, concurrency: facts.key.concurrency },
    tokens,
    route: { name: ctx.upstream, ...capacity },
    requestId: ctx.reqId,
  };
  // Nothing to enforce: no limiter round trip at all.
  if (!hasAnyLimit(admission)) {
    deps.onDecision(ctx, 'allow');
    return forward(req, res, ctx, deps, { body: body?.replay ?? null, expectContinue: expectContinue && route.class !== 'model' });
  }
  const admitted = await deps.limiter.admit(admission);
  if (!admitted.ok) {
    const message = LIMIT_MESSAGES[admitted.code];
    sendDenial(req, res, ctx, deny(admitted.code, message, { retryAfterMs: admitted.retryAfterMs }), route.style);
    return deps.onDecision(ctx, 'deny');
  }
  ctx.lease = admitted.lease;
  if (res.destroyed) {
    ctx.lease.finish({ tokens: route.countTokens ? 0 : null });
    return;
  }
  deps.onDecision(ctx, 'allow');
  forward(req, res, ctx, deps, { body: body?.replay ?? null, expectContinue: expectContinue && route.class !== 'model' });
}

const LIMIT_MESSAGES = {
  route_capacity_exceeded: 'The upstream this key is routed to is at capacity; retry after the indicated time.',
  rpm_exceeded: "This key's requests-per-minute limit is reached; retry after the indicated time.",
  tpm_exceeded: "This key's tokens-per-minute limit is reached; retry after the indicated time.",
  concurrency_exceeded: 'This key has too many requests in flight; retry when one has finished.',
  limits_unavailable: 'The limits store is unavailable and the sidecar is configured to fail closed; retry shortly.',
} as const;

function forward(req: IncomingMessage, res: ServerResponse, ctx: RequestContext, deps: PipelineDeps, opts: { body: BodySource | null; expectContinue: boolean }): void {
  if (opts.expectContinue) res.writeContinue();
  ctx.upstreamStart = performance.now();
  deps.forwarder.forward(req, res, { upstream: ctx.upstream ?? 'default', body: opts.body });
}

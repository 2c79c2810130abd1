/**
 * Per-request state carried from arrival to the access log line. Built once per
 * request; the log line is derived from it when the response ends.
 */
import type { IncomingMessage } from 'node:http';
import { randomUUID } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import type { AccessLine } from '../obs/logger.js';
import type { RequestSpan, SpanFacts } from '../obs/tracing/span.js';
import type { Hold, Lease, Quota } from '../limits/limiter.js';
import type { Price } from '../policy/pricing.js';
import { classify, type Route } from '../routes.js';
import type { ErrorStyle } from '../errors.js';
import type { KeyFacts } from '../policy/facts.js';
import type { Estimate, Settled } from '../policy/estimate.js';
import type { Arrival } from './arrival.js';
import { keyless, keyPrefixes, withoutUserInfo } from './key-in-fields.js';
import type { BodyWatch } from './body/idle.js';
import type { Forwarding } from './upstream/forward.js';
import type { Seen } from './pipeline.js';
import type { Snapshot } from './snapshot.js';
import type { UsageTap } from './usage/tap.js';

export interface RequestContext {
  /** the config the request arrived under, held until it ends */
  snapshot: Snapshot;
  reqId: string;
  /** the client sent reqId (x-request-id): not unique to this request */
  clientReqId: boolean;
  start: number;
  method: string;
  path: string;
  route: Route | null;
  code: string | null;
  facts: KeyFacts | null;
  model: string | null;
  upstream: string | null;
  apiVersion: string | null;
  appName: string | null;
  appUrl: string | null;
  upstreamStart: number | null;
  upstreamMs: number | null;
  /** the client's address (DESIGN section 4) */
  clientIp: string | null;
  /** a model request that generates: settled and billed (see pipeline's Allow) */
  metered: boolean;
  /** its prompt-token estimate and reserved output */
  estimate: Estimate;
  /** reads the response's usage and generated text as it streams to the client */
  tap: UsageTap | null;
  /** the upstream's status, once its response started */
  upstreamStatus: number | null;
  /** the upstream's response, once it started (whether any body byte came) */
  upstreamBody: IncomingMessage | null;
  /** the upstream failed before any output (unreachable, timeout) */
  upstreamFailed: boolean;
  /** what the request was settled and billed at (null: nothing; undefined: not settled yet) */
  settled: Settled | null | undefined;
  lease: Lease | null;
  /** the upstream call once forwarded (to abort it when the client's body stalls) */
  forwarding: Forwarding | null;
  /** the key's figures after admission, sent back as x-ratelimit-* headers */
  quota: Quota | null;
  /** the spend hold and the price it is settled at */
  hold: Hold | null;
  price: Price | null;
  /** the watch on the request body for a stall (null: nothing watched) */
  bodyWatch: BodyWatch | null;
  /** what the pipeline read of the request, which holds its connection's reading while it is decided */
  arrival: Arrival | null;
  /** its response's index among those in flight (-1: not in flight) */
  openIndex: number;
  /** milliseconds from arrival to allow/deny (null: no decision was reached) */
  decisionMs: number | null;
  /** codes of shadowed checks that would have refused it, in decision order (DESIGN section 12) */
  shadow: readonly string[];
  /** its trace span (null: tracing is off) */
  span: RequestSpan | null;
  /** what the pipeline has learned while deciding (see adoptSeen) */
  seen: Seen | null;
  /** the status written straight on the socket when the parser refused its body (null: none) */
  answeredOnSocket: number | null;
  /** keyward cut it for a body that stalled (cutStalledBody) */
  stalled: boolean;
  /** the upstream connection's failure after its response head (the response's close decides what it cost) */
  upstreamError: string | null;
  /** the leading parts of the keys the request carries, kept out of the fields it chose (key-in-fields.ts) */
  keyPrefixes: readonly string[];
}

/**
 * The decision's findings go onto the context: the route, key, model and shadow codes. A
 * request answered before its decision was applied (its client gone mid-body, its body
 * stalled, an error) takes what the pipeline had learned by then, so its access line,
 * metrics, span and denial style say what it was.
 */
export function adoptSeen(ctx: RequestContext): void {
  const seen = ctx.seen;
  if (seen === null || ctx.route !== null) return;
  ctx.route = seen.route;
  ctx.facts = seen.facts;
  ctx.upstream = seen.upstream;
  ctx.model = seen.model;
  // The context keeps its shared empty list unless a shadowed check would have refused.
  if (seen.shadow.length > 0) ctx.shadow = seen.shadow;
}

/** before admission nothing is estimated (shared: estimates are replaced, never written to) */
const NO_ESTIMATE: Readonly<Estimate> = Object.freeze({ prompt: 0, output: 0, deferred: false });
/** no shadowed check refused (shared: replaced, never written to) */
const NO_SHADOW: readonly string[] = Object.freeze([]);

/** C0, DEL and C1 (NEL and CSI among them) */
const CONTROL = /[\x00-\x1f\x7f-\x9f]/g; // eslint-disable-line no-control-regex
const NON_ASCII = /[^\x00-\x7f]/; // eslint-disable-line no-control-regex

/**
 * Attribution headers: trimmed, control characters removed, at most 256 characters. Node
 * reads header bytes as Latin-1; clients send UTF-8, so a value whose bytes past ASCII are
 * valid UTF-8 is read as such (what the client wrote, not its bytes one by one).
 */
export function cleanAttribution(value: string | string[] | undefined): string | null {
  const v = cleanWhole(value);
  return v === null ? null : cutAttribution(v);
}

function cleanWhole(value: string | string[] | undefined): string | null {
  if (value === undefined) return null;
  let v = Array.isArray(value) ? value[0] ?? '' : value;
  if (NON_ASCII.test(v)) {
    const bytes = Buffer.from(v, 'latin1');
    if (isUtf8(bytes)) v = bytes.toString('utf8');
  }
  v = v.replace(CONTROL, '').trim();
  return v === '' ? null : v;
}

/** At most 256 characters, cut between characters, never inside a surrogate pair. */
const cutAttribution = (v: string): string => (v.length > 256 ? v.slice(0, isHighSurrogate(v.charCodeAt(255)) ? 255 : 256) : v);

/**
 * An attribution header as it is logged: the whole value is looked at for a key (and a
 * URL's user-info taken off) before the cut, which could leave a key's first characters,
 * too few to be found afterwards.
 */
function attribution(value: string | string[] | undefined, keys: readonly string[], url = false): string | null {
  const v = cleanWhole(value);
  if (v === null) return null;
  return cutAttribution(keyless(url ? withoutUserInfo(v)! : v, keys));
}

const isHighSurrogate = (c: number): boolean => c >= 0xd800 && c <= 0xdbff;

const SANE_REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

/** An incoming x-request-id is honoured only when it is short and plain. */
export function saneRequestId(value: string | string[] | undefined): string | null {
  const v = Array.isArray(value) ? value[0] : value;
  return v !== undefined && SANE_REQUEST_ID.test(v) ? v : null;
}

/**
 * The request's path for logs and spans: never its query or fragment. An absolute-form
 * target (refused 400) keeps its scheme, host and path but not its user-info, which may
 * hold a key (`http://user:<key>@host/v1/models`).
 */
export function requestPath(url: string): string {
  if (url.charCodeAt(0) !== 47 /* / */) {
    if (url === '*') return url;
    if (!URL.canParse(url)) return '(malformed request target)';
    const u = new URL(url);
    return u.host === '' ? u.protocol : `${u.protocol}//${u.host}${u.pathname}`;
  }
  const q = url.indexOf('?');
  const h = url.indexOf('#');
  const end = q === -1 ? h : h === -1 ? q : Math.min(q, h);
  return end === -1 ? url : url.slice(0, end);
}

export function newContext(req: IncomingMessage, opts: { snapshot: Snapshot; now: number; clientIp: string | null }): RequestContext {
  const url = req.url ?? '/';
  const version = req.headers[opts.snapshot.versionHeader];
  const keys = keyPrefixes(req.rawHeaders);
  // An id that holds a key is not logged, nor sent back: one is made instead.
  const sent = saneRequestId(req.headers['x-request-id']);
  const clientReqId = sent !== null && keyless(sent, keys) === sent ? sent : null;
  return {
    snapshot: opts.snapshot,
    reqId: clientReqId ?? randomUUID(),
    clientReqId: clientReqId !== null,
    start: opts.now,
    method: req.method ?? 'GET',
    path: requestPath(url),
    route: null,
    code: null,
    facts: null,
    model: null,
    upstream: null,
    apiVersion: attribution(version, keys),
    appName: attribution(req.headers['x-app-name'], keys),
    appUrl: attribution(req.headers['x-app-url'], keys, true),
    upstreamStart: null,
    upstreamMs: null,
    clientIp: opts.clientIp,
    metered: false,
    estimate: NO_ESTIMATE,
    tap: null,
    upstreamStatus: null,
    upstreamBody: null,
    upstreamFailed: false,
    settled: undefined,
    lease: null,
    forwarding: null,
    quota: null,
    hold: null,
    price: null,
    bodyWatch: null,
    arrival: null,
    openIndex: -1,
    decisionMs: null,
    shadow: NO_SHADOW,
    span: null,
    seen: null,
    answeredOnSocket: null,
    stalled: false,
    upstreamError: null,
    keyPrefixes: keys,
  };
}

/** No output: the upstream has not answered, or sent a head without a body byte, which is no more a response than none (DESIGN section 6). */
export const producedNoOutput = (ctx: RequestContext): boolean => ctx.upstreamStatus === null || ctx.upstreamBody?.readableDidRead === false;

/**
 * The logged path: as received (it was checked, not normalised), never the query, at most
 * 512 characters; looked at whole for a key first, as a cut could leave too little of one to find.
 */
const loggedPath = (path: string, keys: readonly string[]): string => {
  const p = keyless(path, keys);
  return p.length > 512 ? p.slice(0, 512) : p;
};

export function accessLine(ctx: RequestContext, status: number, now: number): AccessLine {
  const key = ctx.facts?.key;
  const keys = ctx.keyPrefixes;
  return {
    req_id: ctx.reqId,
    method: ctx.method,
    path: loggedPath(ctx.path, keys),
    route: ctx.route?.name ?? null,
    status,
    code: ctx.code,
    key_id: key?.id ?? null,
    key_kind: key?.kind ?? null,
    project_id: key?.projectId ?? null,
    user_id: key?.userId ?? null,
    model: keyless(ctx.model, keys),
    routing: ctx.upstream,
    // The attribution fields were made keyless when the context was built.
    app_name: ctx.appName,
    app_url: ctx.appUrl,
    input_tokens: ctx.settled?.input_tokens ?? null,
    output_tokens: ctx.settled?.output_tokens ?? null,
    usage_estimated: ctx.settled ? ctx.settled.estimated : null,
    client_ip: ctx.clientIp === null ? null : ctx.clientIp.slice(0, 64),
    api_version: ctx.apiVersion,
    duration_ms: Math.round((now - ctx.start) * 1000) / 1000,
    upstream_ms: ctx.upstreamMs === null ? null : Math.round(ctx.upstreamMs * 1000) / 1000,
    shadow: ctx.shadow,
  };
}

/** The access line of bytes that never became a request (a parser refusal): nothing of it is known but its answer. */
export function unparsedLine(o: { reqId: string; status: number; code: string; clientIp: string | null }): AccessLine {
  return {
    req_id: o.reqId, method: '-', path: '-', route: null, status: o.status, code: o.code,
    key_id: null, key_kind: null, project_id: null, user_id: null, model: null, routing: null, app_name: null, app_url: null,
    input_tokens: null, output_tokens: null, usage_estimated: null,
    client_ip: o.clientIp === null ? null : o.clientIp.slice(0, 64),
    api_version: null, duration_ms: 0, upstream_ms: null, shadow: NO_SHADOW,
  };
}

/** What the request's span records when it ends: the access line's facts that DESIGN section 13 names. */
export function spanFacts(ctx: RequestContext, status: number, cut: SpanFacts['cut'] = null): SpanFacts {
  const key = ctx.facts?.key;
  const keys = ctx.keyPrefixes;
  return {
    routeClass: ctx.route?.class ?? null,
    method: ctx.method,
    path: loggedPath(ctx.path, keys),
    status,
    cut,
    route: ctx.route?.name ?? null,
    code: ctx.code,
    keyId: key?.id ?? null,
    projectId: key?.projectId ?? null,
    model: keyless(ctx.model, keys),
    shadow: ctx.shadow,
    decisionMs: ctx.decisionMs,
    inputTokens: ctx.settled?.input_tokens ?? null,
    outputTokens: ctx.settled?.output_tokens ?? null,
  };
}

/** The error style of a request: its route's, classified again when no decision has named the route yet. */
export function styleOf(ctx: RequestContext, url: string): ErrorStyle {
  if (ctx.route) return ctx.route.style;
  const classified = classify(ctx.snapshot.rules, ctx.method, url);
  return classified.ok ? classified.route.style : 'openai';
}

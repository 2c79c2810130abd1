/**
 * One request's life: the pipeline decides, then this module either answers the denial
 * or forwards, taps the response for usage, and when the response has ended (or either
 * side went away) settles every limit, reports usage, counts the request and writes its
 * access line. Denials are written here and nowhere else.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { performance } from 'node:perf_hooks';
import { deny, renderError, type Denial, type ErrorStyle } from '../errors.js';
import type { LogSink } from '../log.js';
import type { AccessWriter } from '../obs/logger.js';
import type { Metrics } from '../obs/metrics.js';
import type { KeyFacts } from '../policy/facts.js';
import type { UsageEvent } from '../protocol/usage.js';
import { hasBody } from './body/read.js';
import { watchBodyIdle } from './body/idle.js';
import { Arrival, clientIpOf } from './arrival.js';
import { answerParserRefusal } from './upstream/framing.js';
import { accessLine, newContext, type RequestContext } from './context.js';
import type { ForwardFailure, Forwarder, ForwardHooks } from './upstream/forward.js';
import { settleUsage } from '../policy/estimate.js';
import { costOf } from '../policy/pricing.js';
import { addQuotaHeaders } from './quota-headers.js';
import type { Cidr } from '../policy/network.js';
import { decide, type Allow, type Decision, type PipelineDeps } from './pipeline.js';
import { createUsageTap } from './usage/tap.js';
import { DenseSet } from '../dense-set.js';

export interface ExchangeDeps {
  pipeline: PipelineDeps;
  forwarder: Forwarder;
  metrics: Metrics;
  access: AccessWriter;
  /** receives one event per model response that reported usage; null: nobody listens */
  usageSink: ((event: UsageEvent) => void) | null;
  log: LogSink;
  /** `<vendor>-version`, logged as api_version */
  versionHeader: string;
  /** `server.trustedProxies`: peers whose X-Forwarded-For is believed */
  trustedProxies: readonly Cidr[];
  /** a request body with no byte for this long is cut with 408 (0: never) */
  bodyIdleTimeoutMs: number;
  /** GET /v1/key: the caller's own key and live figures (DESIGN section 11) */
  describeKey: (facts: KeyFacts) => Promise<unknown>;
}

export interface Exchanges {
  handle(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): void;
  inFlight(): number;
  /**
   * From now on every response asks the client to close its connection, those in flight
   * included while their headers are still to be sent; `closeIdle` runs after each
   * response that ends during the drain, to let go of its connection if it is idle now.
   */
  startDraining(opts?: { closeIdle?: () => void }): void;
  /** resolves when nothing is in flight, or after `graceMs` */
  drained(graceMs: number): Promise<void>;
}

/**
 * A denied request's unread body: Node discards a small one and keeps the connection;
 * a large or unsized one is not worth reading, so that connection is closed instead.
 */
function leavesLargeBodyUnread(req: IncomingMessage): boolean {
  if (req.complete || !hasBody(req)) return false;
  return !(Number(req.headers['content-length']) <= 65_536);
}

function sendDenial(req: IncomingMessage, res: ServerResponse, ctx: RequestContext, denial: Denial, style: ErrorStyle): void {
  ctx.code = denial.code;
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const out = renderError(denial, style);
  // Copied, then added to: a spread followed by a new property would build a hidden class per call.
  const headers: Record<string, string> = Object.assign({}, out.headers);
  headers['x-request-id'] = ctx.reqId;
  if (leavesLargeBodyUnread(req)) headers.connection = 'close';
  res.writeHead(out.status, headers);
  res.end(out.body);
}

/** The request a connection is on, so a parser refusal mid-body knows whose answer has begun. */
const CURRENT = Symbol('keyward.currentRequest');
type TrackedSocket = Duplex & { [CURRENT]?: ServerResponse };

/** The request's context on its response, for the shared 'close' listener. */
const CONTEXT = Symbol('keyward.context');
type ContextResponse = ServerResponse & { [CONTEXT]?: RequestContext };

/** A request Node could not parse as HTTP: answered on the socket, which then closes. */
export function answerClientError(err: NodeJS.ErrnoException, socket: Duplex): void {
  const res = (socket as TrackedSocket)[CURRENT];
  answerParserRefusal(err, socket, res ? { req: res.req, res } : undefined);
}

/**
 * Settles a request once its response has ended or either side went away: what it is
 * billed at follows the one rule in settleUsage (reported usage, else the estimate);
 * every limit it holds is settled to that, and its concurrency slots are freed.
 */
function settle(ctx: RequestContext): void {
  if (ctx.metered && ctx.upstreamStart !== null) {
    // A stream cut short still shows what it had generated so far.
    const tapped = ctx.tap?.end() ?? null;
    ctx.tap = null;
    ctx.settled = settleUsage({
      usage: tapped?.usage ?? null,
      // no tap: an unreadable response (null), or none at all because the client left first (nothing seen)
      textChars: tapped ? tapped.textChars : ctx.upstreamStatus === null ? 0 : null,
      promptTokens: ctx.estimate.prompt,
      reservedOutput: ctx.estimate.output,
      upstreamStatus: ctx.upstreamStatus,
      upstreamFailed: ctx.upstreamFailed,
    });
  }
  const settled = ctx.settled;
  ctx.lease?.finish({ tokens: settled ? settled.input_tokens + settled.output_tokens : 0 });
  // The hold becomes the actual cost; nothing generated releases it.
  ctx.hold?.settle(settled ? costOf(ctx.price, { input: settled.input_tokens, output: settled.output_tokens }) : 0);
}

const FAILURES: Record<ForwardFailure, (err: Error) => Denial> = {
  // the body stream's own answer (an upload over its limit), else its description of what it refused
  rejected: (err) => (err as Error & { denial?: Denial }).denial ?? deny('invalid_request', { detail: err.message }),
  timeout: () => deny('upstream_timeout'),
  unavailable: () => deny('upstream_unavailable'),
};

export function createExchanges(deps: ExchangeDeps): Exchanges {
  let draining = false;
  let closeIdle: (() => void) | null = null;
  let onIdle: (() => void) | null = null;
  /** responses not yet closed: what is in flight (not a Set: src/dense-set.ts says why) */
  const open = new DenseSet<ServerResponse>();

  const finish = (res: ServerResponse, ctx: RequestContext) => {
    open.delete(ctx.openIndex);
    ctx.openIndex = -1;
    settle(ctx);
    // 499: the client went away before the response was complete (nginx's convention)
    const status = res.writableFinished ? res.statusCode : 499;
    const settled = ctx.settled;
    if (settled && ctx.facts && deps.usageSink) {
      deps.usageSink({
        request_id: ctx.reqId,
        key_id: ctx.facts.key.id,
        model: ctx.model,
        input_tokens: settled.input_tokens,
        output_tokens: settled.output_tokens,
        status,
        at: new Date().toISOString(),
        ...(settled.estimated ? { estimated: true } : {}),
      });
    }
    deps.metrics.request(ctx.route?.name ?? 'none', status, ctx.code ?? '');
    deps.access(accessLine(ctx, status, performance.now()));
    // A keep-alive connection whose answer began before the drain would otherwise stay
    // open, and in use by its client, until the drain ends and every connection is cut.
    if (draining) closeIdle?.();
    if (open.size === 0) onIdle?.();
  };

  // One listener for every response: the request ends (finish), then its body watch stops.
  function onResponseClose(this: ContextResponse): void {
    const ctx = this[CONTEXT]!;
    finish(this, ctx);
    ctx.bodyWatch?.stop();
    // A keep-alive connection would otherwise hold this exchange's whole graph (request,
    // context, body, tap) until its next request, however long that connection idles.
    // Kept while the request's body is still arriving: a parser refusal later in it must
    // know that this answer has begun (answerClientError).
    const socket = this.req.socket as TrackedSocket | null;
    if (socket?.[CURRENT] === this && this.req.complete) socket[CURRENT] = undefined;
  }

  // One set of hooks for every forwarded call: each finds its request's context on the response.
  const hooks: ForwardHooks = {
    onResponse(res, proxyRes, head) {
      const ctx = (res as ContextResponse)[CONTEXT]!;
      ctx.upstreamMs = performance.now() - ctx.upstreamStart!;
      ctx.upstreamStatus = proxyRes.statusCode ?? null;
      // The client can quote the id its access-log line carries, unless the upstream names its own.
      if (head.get('x-request-id') === undefined) head.add('x-request-id', ctx.reqId);
      if (ctx.quota) addQuotaHeaders(head, ctx.quota);
      if (!ctx.metered) return null;
      ctx.tap = createUsageTap({ contentType: head.get('content-type'), contentEncoding: head.get('content-encoding') });
      return ctx.tap;
    },
    onFailure(res, kind, err) {
      const ctx = (res as ContextResponse)[CONTEXT]!;
      if (ctx.upstreamStatus === null) ctx.upstreamFailed = true;
      // mid-response: the client must see a broken response, not a truncated "success"
      if (res.headersSent) return void res.destroy();
      if (kind !== 'rejected') deps.log.warn({ req_id: ctx.reqId, upstream: ctx.upstream, err: err.message }, 'upstream failure');
      sendDenial(res.req, res, ctx, FAILURES[kind](err), ctx.route?.style ?? 'openai');
    },
  };

  const forward = (req: IncomingMessage, res: ServerResponse, ctx: RequestContext, allow: Allow, expectContinue: boolean) => {
    if (expectContinue && !allow.bodyRead) res.writeContinue();
    ctx.upstreamStart = performance.now();
    ctx.forwarding = deps.forwarder.forward(req, res, { upstream: allow.seen.upstream, body: allow.body, hooks });
  };

  // A body that stalls is cut with 408: the upstream request (if any) is destroyed before it
  // is complete, everything the request holds is given back, and the connection is closed.
  const cutStalledBody = (req: IncomingMessage, res: ServerResponse, ctx: RequestContext) => {
    ctx.forwarding?.abort();
    ctx.upstreamFailed = true; // nothing the upstream generated is billed
    settle(ctx);
    // Read nothing more: a body completed after the 408 must not go on to admission.
    req.socket.pause();
    res.shouldKeepAlive = false;
    if (res.headersSent) return void res.destroy();
    sendDenial(req, res, ctx, deny('invalid_request', { variant: 'stalled', params: { ms: deps.bodyIdleTimeoutMs }, status: 408 }), ctx.route?.style ?? 'openai');
    // Half-close so the client reads the answer, then let go of the socket.
    res.once('finish', () => setTimeout(() => req.socket.destroy(), 1000).unref());
  };

  // The body watch's callback, one for every request: the response leads to the rest.
  const cutStalledResponse = (res: ServerResponse) => cutStalledBody(res.req, res, (res as ContextResponse)[CONTEXT]!);

  const answerSelf = (res: ServerResponse, ctx: RequestContext, facts: KeyFacts) => {
    deps.describeKey(facts).then(
      (view) => {
        const body = JSON.stringify(view);
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), 'x-request-id': ctx.reqId, 'cache-control': 'no-store' });
        res.end(body);
      },
      (err: Error) => {
        deps.log.error({ req_id: ctx.reqId, err: err.message }, 'key view failed');
        sendDenial(res.req, res, ctx, deny('internal_error'), 'openai');
      },
    );
  };

  const apply = (req: IncomingMessage, res: ServerResponse, ctx: RequestContext, decision: Decision, expectContinue: boolean) => {
    const { seen } = decision;
    ctx.route = seen.route;
    ctx.facts = seen.facts;
    ctx.upstream = seen.upstream;
    ctx.model = seen.model;
    deps.metrics.decision(decision.allow ? 'allow' : 'deny', (performance.now() - ctx.start) / 1000);
    if (!decision.allow) return sendDenial(req, res, ctx, decision.denial, decision.style);
    ctx.lease = decision.lease;
    ctx.metered = decision.metered;
    ctx.estimate = decision.estimate;
    ctx.quota = decision.quota;
    ctx.hold = decision.hold;
    ctx.price = decision.price;
    // The client went away while the checks ran: its response has closed already.
    if (res.destroyed) return settle(ctx);
    if (decision.seen.route.class === 'self') return answerSelf(res, ctx, decision.seen.facts);
    forward(req, res, ctx, decision, expectContinue);
  };

  const run = async (req: IncomingMessage, res: ServerResponse, ctx: RequestContext, input: Arrival) => {
    try {
      const decision = await decide(input, deps.pipeline, ctx.reqId);
      apply(req, res, ctx, decision, input.expectContinue);
    } catch (err) {
      deps.log.error({ req_id: ctx.reqId, err: (err as Error).message }, 'request failed');
      sendDenial(req, res, ctx, deny('internal_error'), ctx.route?.style ?? 'openai');
    }
  };

  return {
    handle(req, res, expectContinue) {
      const clientIp = clientIpOf(req, deps.trustedProxies);
      const ctx = newContext(req, { versionHeader: deps.versionHeader, now: performance.now(), clientIp });
      ctx.openIndex = open.add(res);
      (req.socket as TrackedSocket)[CURRENT] = res;
      // Only a body still to come can stall; watchBodyIdle watches nothing otherwise.
      ctx.bodyWatch = watchBodyIdle(req, { idleMs: deps.bodyIdleTimeoutMs, onIdle: cutStalledResponse, subject: res });
      (res as ContextResponse)[CONTEXT] = ctx;
      res.once('close', onResponseClose);
      // Not a header: headers set ahead would make the forwarder's one-shot head merge into them.
      if (draining) res.shouldKeepAlive = false;
      void run(req, res, ctx, new Arrival({ req, res, expectContinue, clientIp, method: ctx.method }));
    },
    inFlight: () => open.size,
    startDraining(opts = {}) {
      draining = true;
      closeIdle = opts.closeIdle ?? null;
      // Node answers `Connection: close` and closes after the response; the forwarder follows it too.
      open.forEach((res) => {
        if (!res.headersSent) res.shouldKeepAlive = false;
      });
    },
    async drained(graceMs) {
      if (open.size === 0) return;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, graceMs);
        onIdle = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    },
  };
}

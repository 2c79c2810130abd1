/**
 * One request's life: the pipeline decides, then this module either answers the denial
 * or forwards, taps the response for usage, and when the response has ended (or either
 * side went away) settles every limit, reports usage, counts the request and writes its
 * access line. Denials are written by denial.ts, the settlement by settle.ts.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { performance } from 'node:perf_hooks';
import { newKeyMemo, type KeyMemo } from '../auth/hash.js';
import { deny } from '../errors.js';
import { watchBodyIdle } from './body/idle.js';
import { Arrival, clientIpOf } from './arrival.js';
import { answerConnect } from './upstream/framing.js';
import { ANSWERED_AT, CURRENT, refuseUnparsed, type MarkedSocket, type RefusalDeps } from './refusals.js';
import { refusedBeforeDecision } from './preflight.js';
import { accessLine, adoptSeen, newContext, producedNoOutput, spanFacts, unparsedLine, type RequestContext } from './context.js';
import { traceHeaders } from './key-in-fields.js';
import type { ForwardFailure, ForwardHooks } from './upstream/forward.js';
import { markCutByUpstream, wasCutByUpstream, type BodyWatcher, type ResponseHead } from './upstream/relay.js';
import { loggedStatus } from './logged-status.js';
import { addQuotaHeaders } from './quota-headers.js';
import { cutStalledBody, failureDenial, sendDenial, SHADOW_HEADER } from './denial.js';
import { settle, usageEvent } from './settle.js';
import { answerSelf } from './self.js';
import { decide, newSeen, type Allow, type Decision } from './pipeline.js';
import { createUsageTap } from './usage/tap.js';
import { DenseSet } from '../dense-set.js';
import { UnderWay } from './under-way.js';
import { closedBefore, closesAfter, placeOnSocket } from './last-response.js';
import { answered, mayStart } from './in-flight.js';
import type { ExchangeDeps, Exchanges, Expectation } from './exchange-api.js';
import type { SpanFacts } from '../obs/tracing/span.js';

export type { ExchangeDeps, Exchanges, Expectation };

/** The connection's last key and its hash (auth/hash.ts). */
const KEY_MEMO = Symbol('keyward.keyMemo');
type TrackedSocket = MarkedSocket & { [KEY_MEMO]?: KeyMemo };

/** The request's context on its response, for the shared 'close' listener. */
const CONTEXT = Symbol('keyward.context');
type ContextResponse = ServerResponse & { [CONTEXT]?: RequestContext };

/** The context a response carries, set when its request arrived. */
const contextOf = (res: ServerResponse): RequestContext => (res as ContextResponse)[CONTEXT]!;

/**
 * Every request in flight on one server. Built once: its methods and the few callbacks it
 * hands out (the response 'close' listener, the body watch's callback, the forwarding
 * hooks, which are this object) are shared by every request, which finds its own state
 * in the context on its response.
 */
class ExchangeTable implements Exchanges, ForwardHooks {
  private draining = false;
  /** the sidecar itself is cutting what is in flight (shutdown grace over) */
  private cutting = false;
  private closeIdle: (() => void) | null = null;
  private onIdle: (() => void) | null = null;
  /** requests whose decision is under way */
  private readonly deciding = new UnderWay();
  /** responses not yet closed: what is in flight (not a Set: src/dense-set.ts says why) */
  private readonly open = new DenseSet<ServerResponse>();
  /** the 'close' listener of every response; `this` is the response */
  private readonly onResponseClose: (this: ServerResponse) => void;
  private readonly refusalDeps: RefusalDeps = {
    contextOf,
    unparsed: (line) => {
      this.deps.metrics.request('none', line.status, line.code);
      this.deps.access(unparsedLine(line));
    },
  };
  /** the body watch's callback, one for every request: the response leads to the rest */
  private readonly cutStalledResponse = (res: ServerResponse): void => cutStalledBody(res.req, res, contextOf(res));

  constructor(private readonly deps: ExchangeDeps) {
    // Node calls a 'close' listener with the response as `this`; the table comes with it.
    this.onResponseClose = ((table: ExchangeTable) => function (this: ServerResponse) { table.closed(this); })(this);
  }

  handle(req: IncomingMessage, res: ServerResponse, expect: Expectation): void {
    const snapshot = this.deps.snapshots.take();
    const clientIp = clientIpOf(req, snapshot.trustedProxies);
    const ctx = newContext(req, { snapshot, now: performance.now(), clientIp });
    ctx.span = this.deps.traces.start(traceHeaders(req.headers, ctx.keyPrefixes));
    ctx.openIndex = this.open.add(res);
    (req.socket as TrackedSocket)[CURRENT] = res;
    // Only a body still to come can stall; watchBodyIdle watches nothing otherwise.
    ctx.bodyWatch = watchBodyIdle(req, { idleMs: snapshot.config.server.bodyIdleTimeoutMs, onIdle: this.cutStalledResponse, subject: res });
    (res as ContextResponse)[CONTEXT] = ctx;
    res.on('close', this.onResponseClose); // once: a plain listener, without `once`'s wrapper
    // The answer closes the connection: to an HTTP/1.0 client, while draining, after an
    // unmet expectation (the client may be holding its body back, or sending it anyway), and
    // to an upgrade request, whose following bytes Node takes for the new protocol's and drops.
    const last = this.draining || expect === 'unmet' || req.httpVersion === '1.0' || asksUpgrade(req);
    placeOnSocket(res, { last });
    const keyMemo = ((req.socket as TrackedSocket)[KEY_MEMO] ??= newKeyMemo());
    ctx.arrival = new Arrival({ req, res, expectContinue: expect === 'continue', clientIp, method: ctx.method, keyMemo });
    if (mayStart(req, res, expect)) this.start(res, ctx, expect);
  }

  private start(res: ServerResponse, ctx: RequestContext, expect: Expectation): void {
    ctx.arrival!.holdIfStillPending();
    void this.run(res, ctx, expect);
  }

  refuseConnect(req: IncomingMessage, socket: Duplex): void {
    const snapshot = this.deps.snapshots.take();
    const ctx = newContext(req, { snapshot, now: performance.now(), clientIp: clientIpOf(req, snapshot.trustedProxies) });
    ctx.span = this.deps.traces.start(traceHeaders(req.headers, ctx.keyPrefixes));
    ctx.code = 'invalid_path';
    answerConnect(socket, ctx.reqId);
    this.record(ctx, 400);
  }

  refuseUnparsed(err: NodeJS.ErrnoException, socket: Duplex): void {
    refuseUnparsed(err, socket, this.refusalDeps);
  }

  inFlight = (): number => this.open.size;

  startDraining(opts: { closeIdle?: () => void } = {}): void {
    this.draining = true;
    this.closeIdle = opts.closeIdle ?? null;
    // Node answers `Connection: close` and closes after the response; the forwarder follows it too.
    this.open.forEach((res) => !res.headersSent && closesAfter(res));
  }

  async drained(graceMs: number): Promise<void> {
    if (this.open.size === 0) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, graceMs);
      this.onIdle = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  cutAtShutdown(): number {
    this.cutting = true;
    return this.open.size;
  }

  private async run(res: ServerResponse, ctx: RequestContext, expect: Expectation): Promise<void> {
    const req = res.req;
    const input = ctx.arrival!;
    this.deciding.start();
    try {
      const head = { method: ctx.method, url: input.url, rawHeaders: input.rawHeaders, http10: req.httpVersion === '1.0', unmetExpectation: expect === 'unmet', transferEncoding: req.headers['transfer-encoding'] };
      const refused = refusedBeforeDecision(head, ctx.snapshot.rules);
      const seen = newSeen();
      ctx.seen = seen;
      const decision = refused ?? (await decide(input, this.deps.pipeline, ctx.snapshot, { seen }));
      this.apply(res, ctx, decision);
    } catch (err) {
      // Whatever was held is given back, and nothing is billed for a call that never got an answer.
      if (ctx.upstreamStatus === null) ctx.upstreamFailed = true;
      adoptSeen(ctx);
      // A client gone mid-body is no failure of keyward's: its access line says 499.
      if (!req.destroyed) this.deps.log.error({ req_id: ctx.reqId, err: (err as Error).message }, 'request failed');
      sendDenial(res, ctx, deny('internal_error'));
    } finally {
      this.deciding.end();
    }
  }

  decided = (timeoutMs: number): Promise<void> => this.deciding.none(timeoutMs);

  private apply(res: ServerResponse, ctx: RequestContext, decision: Decision): void {
    ctx.seen = decision.seen;
    adoptSeen(ctx);
    ctx.decisionMs = performance.now() - ctx.start;
    this.deps.metrics.decision(decision.allow ? 'allow' : 'deny', ctx.decisionMs / 1000);
    if (!decision.allow) return sendDenial(res, ctx, decision.denial, { style: decision.style, quota: decision.quota });
    ctx.lease = decision.lease;
    ctx.metered = decision.metered;
    ctx.estimate = decision.estimate;
    ctx.quota = decision.quota;
    ctx.hold = decision.hold;
    ctx.price = decision.price;
    // The client went away while the checks ran: its response has closed already.
    if (res.destroyed) return settle(ctx);
    // Pipelined behind an answer that closes the connection: never delivered, so not forwarded or
    // billed; closed here, since Node 22 emits no 'close' for a response it never gave a socket.
    if (closedBefore(res)) return this.closed(res.destroy());
    if (decision.seen.route.class === 'self') return answerSelf(res, ctx, { facts: decision.seen.facts, describeKey: this.deps.describeKey, log: this.deps.log });
    // Held while a round trip decided: a client that left meanwhile is not forwarded (its response closes: 499, nothing billed).
    if (ctx.arrival?.heldReading) return ctx.arrival.letGoThen((gone) => (gone || res.destroyed ? void res.destroy() : this.forward(res, ctx, decision)));
    this.forward(res, ctx, decision);
  }

  private forward(res: ServerResponse, ctx: RequestContext, allow: Allow): void {
    // From here a FIN means the client has gone: its forwarded request is cut, as before.
    ctx.arrival?.letGo();
    if (ctx.arrival?.expectContinue && !allow.bodyRead) res.writeContinue();
    ctx.upstreamStart = performance.now();
    ctx.forwarding = this.deps.forwarder.forward(res.req, res, { targets: ctx.snapshot.targets, upstream: allow.seen.upstream, body: allow.body, hooks: this, traceparent: ctx.span?.traceparent ?? null });
  }

  /** Forwarding hook: the upstream's head is in, the client's is not written yet. */
  onResponse(res: ServerResponse, proxyRes: IncomingMessage, head: ResponseHead): BodyWatcher | null {
    const ctx = contextOf(res);
    ctx.upstreamMs = performance.now() - ctx.upstreamStart!;
    ctx.upstreamStatus = proxyRes.statusCode ?? null;
    ctx.upstreamBody = proxyRes;
    // The client can quote the id its access-log line carries, unless the upstream names its own.
    if (head.get('x-request-id') === undefined) head.add('x-request-id', ctx.reqId);
    if (ctx.quota) addQuotaHeaders(head, ctx.quota);
    if (ctx.shadow.length > 0) head.add(SHADOW_HEADER, ctx.shadow.join(','));
    if (!ctx.metered) return null;
    ctx.tap = createUsageTap({ contentType: head.get('content-type'), contentEncoding: head.get('content-encoding') });
    return ctx.tap;
  }

  /** Forwarding hook: the call failed (see ForwardFailure). */
  onFailure(res: ServerResponse, kind: ForwardFailure, err: Error): void {
    const ctx = contextOf(res);
    // The upstream's response has begun: its close decides whether it came whole (relay.ts
    // cuts it if not; finish() bills it). Node's parser can report bytes past a whole answer
    // before it hands over that answer's body, which cutting here would lose.
    if (ctx.upstreamBody !== null && kind === 'unavailable') {
      ctx.upstreamError = err.message;
      return;
    }
    if (producedNoOutput(ctx)) ctx.upstreamFailed = true;
    // mid-response: the client must see a broken response, not a truncated "success"
    if (res.headersSent) {
      markCutByUpstream(res);
      return void res.destroy();
    }
    if (kind !== 'rejected' && !this.cutting) this.deps.log.warn({ req_id: ctx.reqId, upstream: ctx.upstream, err: err.message }, 'upstream failure');
    sendDenial(res, ctx, failureDenial(kind, err));
  }

  /** A response closed: the request ends (finish), then its body watch stops. */
  private closed(res: ServerResponse): void {
    const ctx = contextOf(res);
    if (ctx.openIndex === -1) return; // closed already (see apply)
    this.finish(res, ctx);
    const next = answered<Expectation>(res);
    if (next) this.start(next.res, contextOf(next.res), next.payload);
    ctx.bodyWatch?.stop();
    // The answer is out (or the client has gone): the next request, or the FIN, may be read.
    ctx.arrival?.letGo();
    // A keep-alive connection would otherwise hold this exchange's whole graph (request,
    // context, body, tap) until its next request, however long that connection idles.
    // Kept while the request's body is still arriving: a parser refusal later in it must
    // know that this answer has begun (refuseUnparsed).
    const socket = res.req.socket as TrackedSocket | null;
    if (socket?.[CURRENT] === res && res.req.complete) {
      socket[CURRENT] = undefined;
      socket[ANSWERED_AT] = socket.bytesRead ?? 0;
    }
  }

  private finish(res: ServerResponse, ctx: RequestContext): void {
    this.open.delete(ctx.openIndex);
    ctx.openIndex = -1;
    // An upstream that died after its head, before any body byte, produced no output (DESIGN section 6), as onFailure says.
    if (ctx.upstreamBody?.readableDidRead === false && wasCutByUpstream(res)) ctx.upstreamFailed = true;
    settle(ctx);
    adoptSeen(ctx);
    const status = loggedStatus(res, ctx, { cutting: this.cutting, log: this.deps.log });
    if (ctx.settled && ctx.facts && this.deps.usageSink) this.deps.usageSink(usageEvent(ctx, ctx.settled, ctx.facts, status));
    this.record(ctx, status, cutOnOurSide(res, this.cutting));
    // A keep-alive connection whose answer began before the drain would otherwise stay
    // open, and in use by its client, until the drain ends and every connection is cut.
    if (this.draining) this.closeIdle?.();
    if (this.open.size === 0) this.onIdle?.();
  }

  /** The request's metrics, access line and span, then its snapshot goes back. */
  private record(ctx: RequestContext, status: number, cut: SpanFacts['cut'] = null): void {
    this.deps.metrics.request(ctx.route?.name ?? 'none', status, ctx.code ?? '');
    // What enforcing would add: a request an enforced check refused anyway is not counted.
    if (ctx.shadow.length > 0 && ctx.upstreamStart !== null) this.deps.metrics.shadowDenials(ctx.shadow);
    this.deps.access(accessLine(ctx, status, performance.now()), ctx.snapshot.accessLines);
    ctx.span?.end(spanFacts(ctx, status, cut));
    this.deps.snapshots.release(ctx.snapshot);
  }
}

/** A response that did not end whole because its upstream stopped short or the shutdown grace ran out (not a client that left). */
function cutOnOurSide(res: ServerResponse, cutting: boolean): SpanFacts['cut'] {
  if (res.writableFinished) return null;
  if (wasCutByUpstream(res)) return 'upstream_cut';
  return cutting ? 'shutdown_cut' : null;
}

/** `Connection: upgrade` with an `Upgrade` line (h2c from curl --http2, a WebSocket handshake). */
function asksUpgrade(req: IncomingMessage): boolean {
  const { upgrade, connection } = req.headers;
  return upgrade !== undefined && connection !== undefined && /(?:^|[\s,])upgrade(?:$|[\s,])/i.test(connection);
}

export function createExchanges(deps: ExchangeDeps): Exchanges {
  return new ExchangeTable(deps);
}

/**
 * Forwarding through http-proxy-3's documented interface (one keep-alive agent per
 * upstream): `web` with per-call options, `selfHandleResponse` with the `proxyRes` event
 * (relay.ts writes the response), the error callback, and one pass of keyward's own
 * before the `stream` pass (which sends a request with repeated Cookie lines itself:
 * line-by-line.ts). Method, path, header lines and body bytes go through unchanged
 * except for hop-by-hop headers, which belong to each connection and are dropped both ways,
 * and a `traceparent` the call names (DESIGN section 13: keyward's span as the parent).
 */
import type { Agent, ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Readable, Stream, Writable } from 'node:stream';
import type { BodySource } from '../body/read.js';
import { createProxyServer } from 'http-proxy-3';
import { noteKeepAlive } from './agent.js';
import { outgoingHeaders } from './header-lines.js';
import { needsLines, sendLineByLine } from './line-by-line.js';
import { failWithoutAnswer, settled } from './no-answer.js';
import { relay, ResponseHead, responseDrops, type BodyWatcher } from './relay.js';
import { TargetSet, type Target, type UpstreamTarget } from './targets.js';

export type { UpstreamTarget } from './targets.js';

/** rejected: the body stream refused its own content midway (see multipart's late-field guard) */
export type ForwardFailure = 'timeout' | 'unavailable' | 'rejected';

export interface ForwarderOptions {
  /** response headers the sidecar always writes itself: the upstream's are dropped (the key's rate-limit figures) */
  replacedResponseHeaders?: readonly string[];
}

/**
 * What a forwarded call wants to hear about its own response. Called with the client's
 * response, so one hooks object can serve every call.
 */
export interface ForwardHooks {
  /**
   * Once, before the response's head is written to the client: reads and adds to `head`,
   * and returns what should see the body as it passes (null: nothing).
   */
  onResponse(res: ServerResponse, proxyRes: IncomingMessage, head: ResponseHead): BodyWatcher | null;
  /** the upstream could not be reached, went quiet for longer than its timeout, or the body refused itself */
  onFailure(res: ServerResponse, kind: ForwardFailure, err: Error): void;
}

export interface ForwardCall {
  /** the targets of the config the request arrived under */
  targets: TargetSet;
  upstream: string;
  /** what to send instead of `req` (a body read for the checks); null streams `req` itself */
  body: BodySource | null;
  hooks: ForwardHooks;
  /** sent instead of the received traceparent line(s); null: the headers pass unchanged */
  traceparent?: string | null;
}

/** One forwarded call. */
export interface Forwarding {
  /** destroys its upstream request, if one was made; no failure is reported (the client was answered already) */
  abort(): void;
}

export interface Forwarder {
  /**
   * The targets of a config's `upstreams`, keeping those of `previous` (the set in force
   * until now) whose URL and timeout are unchanged. The caller releases a set once no
   * request uses it.
   */
  targets(upstreams: Record<string, UpstreamTarget>, previous: TargetSet | null): TargetSet;
  forward(req: IncomingMessage, res: ServerResponse, call: ForwardCall): Forwarding;
  /** destroys every agent, of every set not yet released */
  close(): void;
}

/**
 * http-proxy-3 reports responses through one server-wide event; the call's hooks ride on
 * its response object under a private symbol, so the event finds them without a lookup.
 */
const HOOKS = Symbol('keyward.forwardHooks');
/** The call's traceparent rides the same way, to the pass that builds the outgoing header lines. */
const TRACEPARENT = Symbol('keyward.traceparent');
type HookedResponse = ServerResponse & { [HOOKS]?: ForwardHooks; [TRACEPARENT]?: string };

/** Destroys an upstream request without reporting a failure: the client's answer was already given. */
class BodyStalled extends Error {
  readonly code = 'KW_BODY_STALLED';
}

/**
 * What http-proxy-3 pipes into the upstream request, with the request caught at pipe
 * time so it can be destroyed: when a body stream emits 'reject' (it refused its own
 * content midway), or when the client's body stalls. Otherwise the upstream would wait
 * for the rest of a body that never comes.
 */
class TrackedSource implements BodySource, Forwarding {
  private dest: Writable | null = null;
  private readonly source: BodySource;

  /** `body`: what was read for the checks, forwarded instead of `req` (null: `req` itself) */
  constructor(
    private readonly req: IncomingMessage,
    private readonly res: ServerResponse,
    body: BodySource | null,
  ) {
    this.source = body ?? req;
    if (body && typeof (body as Partial<Readable>).once === 'function') {
      (body as Readable).once('reject', (err: Error) => this.dest?.destroy(err));
    }
  }

  pipe<T extends NodeJS.WritableStream>(d: T): T {
    this.dest = d as unknown as Writable;
    // Every upstream request is piped its body (http-proxy-3 pipes even an empty one), with
    // or without an Expect line: the one place each can be watched for closing unanswered.
    failWithoutAnswer(d as unknown as ClientRequest, this.res, (err) => onNoAnswer(err, this.req, this.res));
    return this.source.pipe(d);
  }

  abort(): void {
    this.dest?.destroy(new BodyStalled('the request body stalled'));
  }
}

/** An upstream request that closed unanswered: a failure unless the client's side ended first (it left). */
export function onNoAnswer(err: Error, req: IncomingMessage, res: ServerResponse): void {
  if (res.destroyed || res.writableEnded || req.socket.destroyed) return;
  onProxyError(err, req, res);
}

/** http-proxy-3's error callback: one function for every call, the hooks ride on the response. */
function onProxyError(err: Error & { code?: string }, _req: IncomingMessage, res: ServerResponse | Socket): void {
  settled(res as ServerResponse);
  if (err.code === 'KW_BODY_STALLED') return;
  const kind = err.code === 'UPSTREAM_TIMEOUT' ? 'timeout' : err.code === 'KW_BODY_REJECTED' ? 'rejected' : 'unavailable';
  (res as HookedResponse)[HOOKS]?.onFailure(res as ServerResponse, kind, err);
}

/**
 * keyward's pass, run by http-proxy-3 just before its `stream` pass opens the upstream
 * request: the header object it copies is rebuilt from the request's raw lines. So a
 * repeated header goes out as separate lines in their order (Node's header object joins
 * or drops repeats), and the framing is the received one again (the `deleteLength` pass
 * before it turns a chunked DELETE or OPTIONS into `content-length: 0` and still pipes the
 * body, which the upstream would read as a second request that no one authenticated).
 * A traceparent the call names takes the received one's place. Node's client joins a
 * list of Cookie values into one line, so the pass then sends such a request itself.
 */
function receivedHeaderLines(req: IncomingMessage, res: ServerResponse): void {
  req.headers = outgoingHeaders(req.rawHeaders, { traceparent: (res as HookedResponse)[TRACEPARENT] ?? null, known: Object.keys(req.headers) });
}

export function createForwarder(opts: ForwarderOptions): Forwarder {
  const proxy = createProxyServer({ xfwd: false, changeOrigin: false, ws: false, selfHandleResponse: true });
  /** every target whose agent is not destroyed yet, for close */
  const live = new Set<Target>();
  const drops = responseDrops(opts.replacedResponseHeaders ?? []);
  const onProxyRes = (proxyRes: IncomingMessage, req: IncomingMessage, server: ServerResponse): void => {
    settled(server);
    const head = new ResponseHead(proxyRes, drops);
    if (head.foreignCoding) {
      proxyRes.destroy();
      return onProxyError(new Error('the upstream response has a transfer coding other than chunked'), req, server);
    }
    noteKeepAlive(proxyRes.socket, head.keepAlive);
    if (req.method === 'OPTIONS' && req.headers['access-control-request-method'] !== undefined) head.dropCorsGrants();
    // The client's own connection decides keep-alive (the upstream's Connection is its
    // own); an HTTP/1.0 client is answered `close`, as http-proxy-3 answers it.
    head.add('connection', req.httpVersion === '1.0' || !server.shouldKeepAlive ? 'close' : 'keep-alive');
    const watcher = (server as HookedResponse)[HOOKS]?.onResponse(server, proxyRes, head) ?? null;
    relay(proxyRes, server, { head, watcher });
  };
  proxy.on('proxyRes', (proxyRes, req, res) => onProxyRes(proxyRes, req, res as ServerResponse));
  proxy.before('web', 'stream', (req, res, options) => {
    receivedHeaderLines(req, res);
    if (!needsLines(req.headers)) return false;
    // A pass that returns true ends http-proxy-3's pass chain: its `stream` pass does not run.
    const call = { req, res, target: options.target as URL, prependPath: options.prependPath !== false, agent: options.agent as Agent };
    sendLineByLine({ ...call, body: options.buffer as unknown as BodySource, onResponse: onProxyRes, onError: onProxyError, onNoAnswer });
    return true;
  });
  // A client that went away mid-request: http-proxy-3 already destroyed the upstream request.
  proxy.on('econnreset', () => {});

  return {
    targets(upstreams, previous) {
      return TargetSet.build({ upstreams, previous, created: (t) => live.add(t), destroyed: (t) => live.delete(t) });
    },
    forward(req, res, { targets, upstream, body, hooks, traceparent }) {
      const target = targets.get(upstream);
      (res as HookedResponse)[HOOKS] = hooks;
      if (traceparent) (res as HookedResponse)[TRACEPARENT] = traceparent;
      const tracked = new TrackedSource(req, res, body);
      proxy.web(req, res, { target: target.url, agent: target.agent, prependPath: target.prependPath, buffer: tracked as unknown as Stream }, onProxyError);
      return tracked;
    },
    close() {
      for (const t of live) t.agent.destroy();
      live.clear();
      proxy.close();
    },
  };
}

/**
 * Forwarding with http-proxy-3 (one keep-alive agent per upstream). Method, path,
 * headers and body bytes go through unchanged except for hop-by-hop headers, which
 * belong to each connection and are dropped both ways.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { Readable, Writable } from 'node:stream';
import type { BodySource } from './body.js';
import { createProxyServer, type ProxyServer } from 'http-proxy-3';
import { leanAgent } from './agent.js';
import { framingProblem } from './framing.js';
import { connectionTokens, HOP_BY_HOP, relay, ResponseHead, type BodyWatcher } from './relay.js';

export interface UpstreamTarget {
  url: string;
  timeoutMs: number;
}

/** rejected: the body stream refused its own content midway (see multipart's late-field guard) */
export type ForwardFailure = 'timeout' | 'unavailable' | 'rejected';

export interface ForwarderOptions {
  upstreams: Record<string, UpstreamTarget>;
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
  upstream: string;
  /** what to send instead of `req` (a body read for the checks); null streams `req` itself */
  body: BodySource | null;
  hooks: ForwardHooks;
}

/** One forwarded call. */
export interface Forwarding {
  /** destroys its upstream request, if one was made; no failure is reported (the client was answered already) */
  abort(): void;
}

export interface Forwarder {
  forward(req: IncomingMessage, res: ServerResponse, call: ForwardCall): Forwarding;
  close(): void;
}

/**
 * http-proxy-3 reports responses through one server-wide event; the call's hooks ride on
 * its response object under a private symbol, so the event finds them without a lookup.
 */
const HOOKS = Symbol('keyward.forwardHooks');
type HookedResponse = ServerResponse & { [HOOKS]?: ForwardHooks };

/**
 * The header object without its hop-by-hop headers, including any named in Connection.
 * Returns the same object when there is none (the common case apart from `connection`);
 * otherwise a copy in the same order: a `delete` would turn the object into a slow
 * dictionary, and http-proxy-3 and Node copy and walk these objects again per request.
 */
export function withoutHopByHop<T extends Record<string, unknown>>(headers: T): T {
  const connection = headers.connection;
  if (connection === undefined && headers['keep-alive'] === undefined && headers.te === undefined && headers.trailer === undefined
    && headers.upgrade === undefined && headers['proxy-authorization'] === undefined && headers['proxy-connection'] === undefined) {
    return headers;
  }
  // Connection may not remove the framing of this request.
  const named = typeof connection === 'string' ? connectionTokens(connection) : [];
  const out: Record<string, unknown> = {};
  for (const name in headers) {
    if (HOP_BY_HOP.includes(name) || named.includes(name)) continue;
    out[name] = headers[name];
  }
  return out as T;
}

class UpstreamTimeout extends Error {
  readonly code = 'UPSTREAM_TIMEOUT';
}

/**
 * The idle timeout lives on each upstream socket, set once when the agent creates it (its
 * `timeout` option) rather than per request: a per-request timeout re-arms the socket's
 * timer and adds and removes listeners on every call. It also reaches
 * requests that carry `Expect`, for which http-proxy-3 skips its proxyReq hook. The agent
 * destroys a socket that times out while idle in its pool; one that times out while a
 * request is on it is destroyed here with UpstreamTimeout, which the request reports as
 * its error. One listener for every socket, with the socket as `this`.
 */
function timeoutAgent<A extends http.Agent>(agent: A, timeoutMs: number): A {
  if (timeoutMs <= 0) return agent;
  const a = agent as A & { createConnection(...args: unknown[]): Socket };
  const create = a.createConnection.bind(a);
  const message = `no answer from upstream within ${timeoutMs} ms`;
  function onSocketTimeout(this: Socket & { _httpMessage?: unknown }) {
    // _httpMessage: the request the socket is serving (Node's own field; null while pooled)
    if (this._httpMessage) this.destroy(new UpstreamTimeout(message));
  }
  a.createConnection = (...args: unknown[]) => {
    const socket = create(...args);
    socket.on('timeout', onSocketTimeout);
    return socket;
  };
  return a;
}

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
  constructor(req: IncomingMessage, body: BodySource | null) {
    this.source = body ?? req;
    if (body && typeof (body as Partial<Readable>).once === 'function') {
      (body as Readable).once('reject', (err: Error) => this.dest?.destroy(err));
    }
  }

  pipe<T extends NodeJS.WritableStream>(d: T): T {
    this.dest = d as unknown as Writable;
    return this.source.pipe(d);
  }

  abort(): void {
    this.dest?.destroy(new BodyStalled('the request body stalled'));
  }
}

/** Bytes on an idle pooled socket: one listener for every socket, with the socket as `this`. */
function destroyOnStrayBytes(this: Socket): void {
  this.destroy();
}

/**
 * Keep-alive hygiene: an idle pooled socket that receives anything has answered a request
 * it was not sent (the upstream read a second request somewhere, or doubled a response).
 * Handed to the next request, those bytes would become that request's response, so the
 * socket is destroyed instead; a socket with unread bytes is never reused either.
 */
function guardIdleSockets(agent: http.Agent): void {
  agent.on('free', (socket: Socket) => {
    if (socket.destroyed) return;
    socket.once('data', destroyOnStrayBytes);
  });
  const a = agent as http.Agent & { reuseSocket(socket: Socket, req: http.ClientRequest): void };
  const reuse = a.reuseSocket.bind(a);
  a.reuseSocket = (socket: Socket, req) => {
    socket.off('data', destroyOnStrayBytes);
    if (socket.readableLength > 0) socket.destroy();
    reuse(socket, req);
  };
}

/** What a call gives http-proxy-3's passes: its target and agent, and what to pipe. */
interface CallOptions {
  target: URL;
  agent: http.Agent;
  prependPath: boolean;
  buffer: Readable;
  xfwd: false;
  changeOrigin: false;
  /** the response is written here (relay.ts), not by http-proxy-3's response passes and pipe */
  selfHandleResponse: true;
}

/** One of http-proxy-3's web passes (`webPasses`): a truthy return ends the request's passes. */
type WebPass = ((req: IncomingMessage, res: ServerResponse, options: CallOptions, head: undefined, server: ProxyServer, cb: typeof onProxyError) => unknown) & { name: string };

/** http-proxy-3's error callback: one function for every call, the hooks ride on the response. */
function onProxyError(err: Error & { code?: string }, _req: IncomingMessage, res: ServerResponse | Socket): void {
  if (err.code === 'KW_BODY_STALLED') return;
  const kind = err.code === 'UPSTREAM_TIMEOUT' ? 'timeout' : err.code === 'KW_BODY_REJECTED' ? 'rejected' : 'unavailable';
  (res as HookedResponse)[HOOKS]?.onFailure(res as ServerResponse, kind, err);
}

export function createForwarder(opts: ForwarderOptions): Forwarder {
  const proxy = createProxyServer({ xfwd: false, changeOrigin: false, ws: false });
  // http-proxy-3's deleteLength pass turns a chunked DELETE/OPTIONS into `content-length: 0`
  // and still pipes the body after it: the upstream would read that body as a second,
  // unauthenticated request. Framing is the received framing, so the pass goes.
  const passes = (proxy as unknown as { webPasses: WebPass[] }).webPasses.filter((p) => p.name !== 'deleteLength');
  // http-proxy-3 joins the target's path to each request's by parsing it as a URL again
  // per request; for a target at the root that join is the request's path alone, which
  // prependPath: false gives without the parse.
  const targets = new Map<string, { url: URL; agent: http.Agent; prependPath: boolean }>();
  for (const [name, up] of Object.entries(opts.upstreams)) {
    const url = new URL(up.url);
    const agentOpts = { keepAlive: true, keepAliveMsecs: 1000, maxSockets: Infinity, maxFreeSockets: 256, scheduling: 'lifo' as const, ...(up.timeoutMs > 0 ? { timeout: up.timeoutMs } : {}) };
    const tls = url.protocol === 'https:';
    const agent = leanAgent(tls ? new https.Agent(agentOpts) : new http.Agent(agentOpts), { tls });
    guardIdleSockets(agent);
    targets.set(name, { url, agent: timeoutAgent(agent, up.timeoutMs), prependPath: !(url.pathname === '/' && url.search === '') });
  }
  const replaced = new Set(opts.replacedResponseHeaders ?? []);
  proxy.on('proxyRes', (proxyRes, req, res) => {
    const server = res as ServerResponse;
    const head = new ResponseHead(proxyRes, replaced);
    // The client's own connection decides keep-alive (the upstream's Connection is its
    // own); an HTTP/1.0 client is answered `close`, as http-proxy-3 answers it.
    head.add('connection', req.httpVersion === '1.0' || !server.shouldKeepAlive ? 'close' : 'keep-alive');
    const watcher = (res as HookedResponse)[HOOKS]?.onResponse(server, proxyRes, head) ?? null;
    relay(proxyRes, server, { head, watcher });
  });
  // A client that went away mid-request: http-proxy-3 already destroyed the upstream request.
  proxy.on('econnreset', () => {});

  return {
    forward(req, res, { upstream, body, hooks }) {
      const target = targets.get(upstream) ?? targets.get('default')!;
      const framing = framingProblem(req);
      if (framing) {
        hooks.onFailure(res, 'rejected', Object.assign(new Error(framing), { code: 'KW_BODY_REJECTED' }));
        return { abort() {} };
      }
      (res as HookedResponse)[HOOKS] = hooks;
      req.headers = withoutHopByHop(req.headers);
      const tracked = new TrackedSource(req, body);
      // The same passes proxy.web runs, run here with one options object of a fixed shape:
      // proxy.web merges the proxy's options and the call's with `{ ...a, ...b }`, which on
      // Node 20's V8 builds a new hidden class per call (about 4 µs, and garbage for the
      // old generation), and every property read after it goes megamorphic.
      const options: CallOptions = { target: target.url, agent: target.agent, prependPath: target.prependPath, buffer: tracked as unknown as Readable, xfwd: false, changeOrigin: false, selfHandleResponse: true };
      for (const pass of passes) if (pass(req, res, options, undefined, proxy, onProxyError)) break;
      return tracked;
    },
    close() {
      for (const t of targets.values()) t.agent.destroy();
      proxy.close();
    },
  };
}

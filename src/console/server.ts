/**
 * The reference console's HTTP server: /admin/v1/* under admin and user tokens,
 * /sync/v1/* under sync tokens, the web page and the probes without; every request
 * answered and logged, 503 while it closes.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { withoutKeys } from '../auth/keyformat.js';
import type { LogSink } from '../log.js';
import { handleAdmin } from './admin-api.js';
import type { ConsoleConfig } from './config.js';
import { ApiError } from './errors.js';
import { forbidden, principalName, sendError, sendJson, unauthorized, type Principal } from './http.js';
import type { Pricer } from './pricing.js';
import type { ConsoleStore } from './store.js';
import { handleSync } from './sync-api.js';
import { makeWebHandler } from './web.js';

export type Route = (req: IncomingMessage, res: ServerResponse, path: string, query: URLSearchParams) => Promise<void>;

/** Sends each request where its path and token say: probes and the web page, the sync API, the admin API. */
export function router(o: { config: ConsoleConfig; store: ConsoleStore; pricer: Pricer; log: LogSink; authenticate: (req: IncomingMessage) => Principal | null }): Route {
  const { config, store, pricer, log } = o;
  const serveWeb = makeWebHandler();
  return async (req, res, path, query) => {
    const who = o.authenticate(req);
    const isSync = path.startsWith('/sync/');
    if (!isSync && !path.startsWith('/admin/')) {
      if (path === '/healthz') return sendJson(res, 200, { status: 'ok' }); // probes: no token, no store
      if (serveWeb(req, res, path)) return; // the web page at `/`: public files, its data needs a token
      throw new ApiError(404, 'not_found', 'no such endpoint');
    }
    if (!who) throw unauthorized();
    if (isSync) {
      if (who.role !== 'sync') throw forbidden('this needs a sync token');
      return handleSync({ req, res, path, query, store, pricer, maxUsageBytes: config.sync.maxUsageBytes, log });
    }
    if (who.role === 'sync') throw forbidden('sync tokens may not use the admin API');
    return handleAdmin({ req, res, path, query, who, store, log });
  };
}

/** How long a refused request's unread body may keep coming once the answer has gone (nginx's lingering close). */
export const LINGER_MS = 2_000;

/** A failed request's answer: the ApiError it threw, else a logged 500. */
function answerFailure(res: ServerResponse, err: unknown, o: { path: string; log: LogSink }): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (!res.req.complete) closeAfter(res);
  if (err instanceof ApiError) return sendError(res, err);
  o.log.error({ err: err instanceof Error ? err.message : String(err), path: o.path }, 'console request failed');
  sendError(res, new ApiError(500, 'internal_error', 'internal error'));
}

/**
 * A refusal before its body was read (no token, too large): the connection ends with the
 * answer, and the rest of the body gets LINGER_MS to arrive and be thrown away, so the
 * client reads the answer rather than a reset, and a client that never stops sending (or
 * trickles) holds no connection past it.
 */
function closeAfter(res: ServerResponse): void {
  const socket = res.req.socket;
  res.setHeader('connection', 'close');
  res.req.resume();
  res.on('finish', () => setTimeout(() => socket.destroy(), LINGER_MS).unref());
}

/** The console's HTTP server: every request routed, answered and logged; 503 once `closing()`. */
export function consoleServer(o: { route: Route; log: LogSink; authenticate: (req: IncomingMessage) => Principal | null; closing: () => boolean }): Server {
  const server = createServer((req, res) => {
    const started = performance.now();
    const url = new URL(req.url ?? '/', 'http://console');
    const path = url.pathname;
    // A key pasted where an id belongs (`keys show <the key>`) stays out of the log.
    const logged = withoutKeys(path);
    // Read now: a body refused while it arrives (413) destroys the request, and Node then drops its socket.
    const remote = req.socket.remoteAddress ?? null;
    res.on('finish', () => {
      // While shutting down, a connection whose answer went out is not kept alive for another request.
      if (o.closing()) server.closeIdleConnections();
      // Path only: the query string is never logged.
      const line = { method: req.method, path: logged, status: res.statusCode, ms: Math.round(performance.now() - started), by: principalName(o.authenticate(req)), remote_addr: remote };
      if (path.startsWith('/sync/') || path === '/healthz') o.log.debug(line, 'request');
      else o.log.info(line, 'request');
    });
    const work = o.closing() ? Promise.reject(new ApiError(503, 'shutting_down', 'the console is shutting down')) : o.route(req, res, path, url.searchParams);
    work.catch((err: unknown) => answerFailure(res, err, { path: logged, log: o.log }));
  });
  // The time to receive a whole request (not to answer it: a long poll waits in its answer).
  server.requestTimeout = 120_000;
  server.headersTimeout = 30_000;
  return server;
}

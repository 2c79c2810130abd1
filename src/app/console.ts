/**
 * The reference console's HTTP server: /admin/v1/* under admin and user tokens,
 * /sync/v1/* under sync tokens. Start-up fails clearly on a missing, malformed or wrong
 * master key before anything listens.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { makeKeyHasher } from '../auth/hash.js';
import { handleAdmin } from '../console/admin-api.js';
import type { ConsoleConfig } from '../console/config.js';
import { readMasterKey } from '../console/crypto.js';
import { openConsoleDb, type DB } from '../console/db.js';
import { ApiError } from '../console/errors.js';
import { ChangeFeed } from '../console/feed.js';
import { makeAuthenticator, principalName, sendError, sendJson, unauthorized, forbidden, type Principal } from '../console/http.js';
import { quiet, type LogSink } from '../log.js';
import { makePricer, priceTable, publishPrices, type Pricer } from '../console/pricing.js';
import { rollPeriods } from '../console/budgets.js';
import { ConsoleStore } from '../console/store.js';
import { handleSync } from '../console/sync-api.js';
import { makeWebHandler } from '../console/web.js';
import { httpUrl, listen } from './listen.js';

export interface StartConsoleOptions {
  config: ConsoleConfig;
  /** where the master key is read from; defaults to process.env */
  env?: NodeJS.ProcessEnv;
  log?: LogSink;
  now?: () => number;
  /** how often budgets with a period are checked for a boundary passed (default 1000 ms) */
  periodCheckMs?: number;
}

export interface RunningConsole {
  url: string;
  port: number;
  /** the state behind the API, for embedding and tests */
  store: ConsoleStore;
  close(): Promise<void>;
}

/** The store over its database; the database is closed again when the store cannot be made (a wrong master key). */
function openStore(opts: StartConsoleOptions): { db: DB; store: ConsoleStore } {
  const { config } = opts;
  const masterKey = readMasterKey({ env: opts.env ?? process.env, name: config.masterKeyEnv });
  const hasher = makeKeyHasher({ hash: config.keys.hash, pepper: config.keys.pepper });
  const db = openConsoleDb(config.store.path);
  try {
    const feed = new ChangeFeed({ db, retain: config.sync.retainChanges, maxBatch: config.sync.maxBatch });
    return { db, store: new ConsoleStore({ db, masterKey, hasher, feed, ...(opts.now ? { now: opts.now } : {}) }) };
  } catch (err) {
    db.close();
    throw err;
  }
}

/** Restarts the budgets whose period has ended now and every `everyMs` after; returns the timer. */
function rollPeriodsEvery(store: ConsoleStore, everyMs: number, log: LogSink): NodeJS.Timeout {
  rollPeriods(store);
  const timer = setInterval(() => {
    try {
      rollPeriods(store);
    } catch (err) {
      log.error({ err: err instanceof Error ? err.message : String(err) }, 'budget period restart failed');
    }
  }, everyMs);
  timer.unref();
  return timer;
}

type Route = (req: IncomingMessage, res: ServerResponse, path: string, query: URLSearchParams) => Promise<void>;

/** Sends each request where its path and token say: probes and the web page, the sync API, the admin API. */
function router(o: { config: ConsoleConfig; store: ConsoleStore; pricer: Pricer; log: LogSink; authenticate: (req: IncomingMessage) => Principal | null }): Route {
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

/** A failed request's answer: the ApiError it threw, else a logged 500. */
function answerFailure(res: ServerResponse, err: unknown, o: { path: string; log: LogSink }): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (err instanceof ApiError) return sendError(res, err);
  o.log.error({ err: err instanceof Error ? err.message : String(err), path: o.path }, 'console request failed');
  sendError(res, new ApiError(500, 'internal_error', 'internal error'));
}

/** The console's HTTP server: every request routed, answered and logged; 503 once `closing()`. */
function consoleServer(o: { route: Route; log: LogSink; authenticate: (req: IncomingMessage) => Principal | null; closing: () => boolean }): Server {
  const server = createServer((req, res) => {
    const started = performance.now();
    const url = new URL(req.url ?? '/', 'http://console');
    const path = url.pathname;
    res.on('finish', () => {
      // While shutting down, a connection whose answer went out is not kept alive for another request.
      if (o.closing()) server.closeIdleConnections();
      // Path only: ids are not secrets, and the query string is never logged.
      const line = { method: req.method, path, status: res.statusCode, ms: Math.round(performance.now() - started), by: principalName(o.authenticate(req)) };
      if (path.startsWith('/sync/') || path === '/healthz') o.log.debug(line, 'request');
      else o.log.info(line, 'request');
    });
    const work = o.closing() ? Promise.reject(new ApiError(503, 'shutting_down', 'the console is shutting down')) : o.route(req, res, path, url.searchParams);
    work.catch((err: unknown) => answerFailure(res, err, { path, log: o.log }));
  });
  server.requestTimeout = 0; // long polls may last up to a minute
  server.headersTimeout = 30_000;
  return server;
}

export async function startConsole(opts: StartConsoleOptions): Promise<RunningConsole> {
  const { config } = opts;
  const log = opts.log ?? quiet;
  const { db, store } = openStore(opts);
  const pricer = makePricer(config.pricing);
  // Sidecars hold with the prices this console charges: publish the table when it changed.
  publishPrices(store, priceTable(config.pricing));
  const periodTimer = rollPeriodsEvery(store, opts.periodCheckMs ?? 1000, log);
  const authenticate = makeAuthenticator(config.auth);
  let closing: Promise<void> | null = null;
  const route = router({ config, store, pricer, log, authenticate });
  const server = consoleServer({ route, log, authenticate, closing: () => closing !== null });
  const port = await listen(server, config.listen.port, config.listen.host);
  return {
    url: httpUrl(config.listen.host, port),
    port,
    store,
    close() {
      closing ??= (async () => {
        clearInterval(periodTimer);
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        store.feed.release(); // answer waiting long polls now rather than after waitMs
        server.closeIdleConnections();
        // A snapshot still streaming gets a moment, then its connection is cut.
        const timer = setTimeout(() => server.closeAllConnections(), 2000);
        await closed;
        clearTimeout(timer);
        db.close();
      })();
      return closing;
    },
  };
}

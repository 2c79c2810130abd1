/**
 * The reference console's HTTP server: /admin/v1/* under admin and user tokens,
 * /sync/v1/* under sync tokens. Start-up fails clearly on a missing, malformed or wrong
 * master key before anything listens.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { makeKeyHasher } from '../auth/hash.js';
import { handleAdmin } from '../console/admin-api.js';
import type { ConsoleConfig } from '../console/config.js';
import { readMasterKey } from '../console/crypto.js';
import { openConsoleDb } from '../console/db.js';
import { ApiError } from '../console/errors.js';
import { ChangeFeed } from '../console/feed.js';
import { makeAuthenticator, principalName, sendError, sendJson, unauthorized, forbidden } from '../console/http.js';
import { quiet, type LogSink } from '../log.js';
import { makePricer, priceTable, publishPrices } from '../console/pricing.js';
import { rollPeriods } from '../console/budgets.js';
import { ConsoleStore } from '../console/store.js';
import { handleSync } from '../console/sync-api.js';
import { makeWebHandler } from '../console/web.js';

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

export async function startConsole(opts: StartConsoleOptions): Promise<RunningConsole> {
  const { config } = opts;
  const log = opts.log ?? quiet;
  const masterKey = readMasterKey({ env: opts.env ?? process.env, name: config.masterKeyEnv });
  const hasher = makeKeyHasher({ hash: config.keys.hash, pepper: config.keys.pepper });
  const db = openConsoleDb(config.store.path);
  let store: ConsoleStore;
  try {
    const feed = new ChangeFeed({ db, retain: config.sync.retainChanges, maxBatch: config.sync.maxBatch });
    store = new ConsoleStore({ db, masterKey, hasher, feed, ...(opts.now ? { now: opts.now } : {}) });
  } catch (err) {
    db.close();
    throw err;
  }
  const pricer = makePricer(config.pricing);
  // Sidecars hold with the prices this console charges: publish the table when it changed.
  publishPrices(store, priceTable(config.pricing));
  rollPeriods(store);
  const periodTimer = setInterval(() => {
    try {
      rollPeriods(store);
    } catch (err) {
      log.error({ err: err instanceof Error ? err.message : String(err) }, 'budget period restart failed');
    }
  }, opts.periodCheckMs ?? 1000);
  periodTimer.unref();
  const authenticate = makeAuthenticator(config.auth);
  const serveWeb = makeWebHandler();

  const handle = async (req: IncomingMessage, res: ServerResponse, path: string, query: URLSearchParams) => {
    const who = authenticate(req);
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

  let closing: Promise<void> | null = null;
  const server = createServer((req, res) => {
    const started = performance.now();
    const url = new URL(req.url ?? '/', 'http://console');
    const path = url.pathname;
    res.on('finish', () => {
      // While shutting down, a connection whose answer went out is not kept alive for another request.
      if (closing) server.closeIdleConnections();
      // Path only: ids are not secrets, and the query string is never logged.
      const line = { method: req.method, path, status: res.statusCode, ms: Math.round(performance.now() - started), by: principalName(authenticate(req)) };
      if (path.startsWith('/sync/') || path === '/healthz') log.debug(line, 'request');
      else log.info(line, 'request');
    });
    const work = closing ? Promise.reject(new ApiError(503, 'shutting_down', 'the console is shutting down')) : handle(req, res, path, url.searchParams);
    work.catch((err: unknown) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (err instanceof ApiError) return sendError(res, err);
      log.error({ err: err instanceof Error ? err.message : String(err), path }, 'console request failed');
      sendError(res, new ApiError(500, 'internal_error', 'internal error'));
    });
  });
  server.requestTimeout = 0; // long polls may last up to a minute
  server.headersTimeout = 30_000;

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.listen.port, config.listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const host = config.listen.host.includes(':') ? `[${config.listen.host}]` : config.listen.host;
  return {
    url: `http://${host}:${port}`,
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

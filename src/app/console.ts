/**
 * The reference console, composed: its store over its database, the budget periods' timer
 * and its HTTP server (console/server.ts). Start-up fails clearly on a missing, malformed
 * or wrong master key before anything listens.
 */
import { makeKeyHasher } from '../auth/hash.js';
import type { ConsoleConfig } from '../console/config.js';
import { readMasterKey } from '../console/crypto.js';
import { openConsoleDb, type DB } from '../console/db.js';
import { ChangeFeed } from '../console/feed.js';
import { makeAuthenticator } from '../console/http.js';
import { quiet, type LogSink } from '../log.js';
import { makePricer, priceTable, publishPrices } from '../console/pricing.js';
import { ROLL_BATCH, rollPeriods } from '../console/budgets.js';
import { ConsoleStore } from '../console/store.js';
import { consoleServer, router } from '../console/server.js';
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

/**
 * Restarts the budgets whose period has ended now and every `everyMs` after, a batch a
 * transaction with a turn of the loop between batches (a boundary that restarts many
 * budgets leaves the console answering); returns the timer.
 */
function rollPeriodsEvery(store: ConsoleStore, everyMs: number, log: LogSink): NodeJS.Timeout {
  let rolling = false;
  const roll = async () => {
    if (rolling) return;
    rolling = true;
    try {
      while (rollPeriods(store) >= ROLL_BATCH) await new Promise<void>((resolve) => setImmediate(resolve));
    } catch (err) {
      log.error({ err: err instanceof Error ? err.message : String(err) }, 'budget period restart failed');
    } finally {
      rolling = false;
    }
  };
  void roll();
  const timer = setInterval(() => void roll(), everyMs);
  timer.unref();
  return timer;
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

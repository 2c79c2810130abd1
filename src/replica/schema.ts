/**
 * Replica tables. One row per key, project and wallet as the console last described
 * them, plus the sync version. Keys are found by their hash; the plain key is never here.
 */
import type Database from 'better-sqlite3';
import { addMissingColumns, V1_RECORD_COLUMNS, type AddedColumns } from '../sqlite-file.js';

/**
 * 2: v1 protocol additions (epochs, key network policy and per-model limits, periods, prices); 3: key shadow checks;
 * 4: the console history tag beside the version
 */
export const SCHEMA_VERSION = 4;

const DDL = `
CREATE TABLE IF NOT EXISTS meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL,
  applied_at INTEGER NOT NULL,
  source TEXT NOT NULL,
  tag TEXT
);
CREATE TABLE IF NOT EXISTS keys (
  id TEXT PRIMARY KEY,
  hash TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  user_id TEXT,
  project_id TEXT,
  status TEXT NOT NULL,
  budget REAL,
  spent REAL NOT NULL,
  models TEXT,
  routing TEXT,
  rpm INTEGER,
  tpm INTEGER,
  concurrency INTEGER,
  epoch INTEGER NOT NULL DEFAULT 0,
  ips TEXT,
  allow_browser INTEGER NOT NULL DEFAULT 0,
  model_limits TEXT,
  period TEXT,
  shadow TEXT
);
CREATE TABLE IF NOT EXISTS projects (
  id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  budget REAL,
  spent REAL NOT NULL,
  epoch INTEGER NOT NULL DEFAULT 0,
  period TEXT
);
CREATE TABLE IF NOT EXISTS wallets (
  user_id TEXT PRIMARY KEY,
  balance REAL NOT NULL,
  epoch INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS prices (
  model TEXT PRIMARY KEY,
  input REAL NOT NULL,
  output REAL NOT NULL,
  per REAL NOT NULL
);
`;

/**
 * Columns added after schema 1, as ALTER TABLE clauses. A replica file written by an
 * older sidecar keeps its rows (and stays ready to serve); they read with the defaults
 * until the next snapshot or change brings the real values.
 */
const ADDED_COLUMNS: AddedColumns = {
  // the console history the version belongs to; null until a console that names one syncs
  meta: { tag: 'tag TEXT' },
  keys: { ...V1_RECORD_COLUMNS.keys, period: 'period TEXT' },
  projects: { ...V1_RECORD_COLUMNS.projects, period: 'period TEXT' },
  wallets: V1_RECORD_COLUMNS.wallets,
};

function migrate(db: Database.Database): void {
  // Another connection (the snapshot worker, a second process) may open the same file at
  // once: the check and the ALTERs run in one write transaction, so only one of them adds.
  db.transaction(() => {
    addMissingColumns(db, ADDED_COLUMNS);
    db.pragma(`user_version = ${SCHEMA_VERSION}`);
  }).immediate();
}

/** How long a connection waits for another one's write lock (a worker thread's; busy_timeout). */
export const BUSY_TIMEOUT_MS = 5000;

/** Opens pragmas and tables; safe to call on every open. */
export function prepareDatabase(db: Database.Database): void {
  db.pragma('journal_mode = WAL');
  // NORMAL is durable across process crashes in WAL mode; the console is the source of truth anyway.
  db.pragma('synchronous = NORMAL');
  db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
  db.exec(DDL);
  if ((db.pragma('user_version', { simple: true }) as number) < SCHEMA_VERSION) migrate(db);
}

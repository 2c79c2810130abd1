/**
 * Replica tables. One row per key, project and wallet as the console last described
 * them, plus the sync version. Keys are found by their hash; the plain key is never here.
 */
import type Database from 'better-sqlite3';

export const SCHEMA_VERSION = 1;

const DDL = `
CREATE TABLE IF NOT EXISTS meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL,
  applied_at INTEGER NOT NULL,
  source TEXT NOT NULL
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
  concurrency INTEGER
);
CREATE TABLE IF NOT EXISTS projects (
  id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  budget REAL,
  spent REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS wallets (
  user_id TEXT PRIMARY KEY,
  balance REAL NOT NULL
);
`;

/** Opens pragmas and tables; safe to call on every open. */
export function prepareDatabase(db: Database.Database): void {
  db.pragma('journal_mode = WAL');
  // NORMAL is durable across process crashes in WAL mode; the console is the source of truth anyway.
  db.pragma('synchronous = NORMAL');
  db.pragma('busy_timeout = 5000');
  db.exec(DDL);
  db.pragma(`user_version = ${SCHEMA_VERSION}`);
}

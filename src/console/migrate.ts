/**
 * Console store additions for sync protocol v1 (DESIGN sections 6-8): holder epochs, key
 * network policy and per-model limits, budget periods, the published price table,
 * estimated usage, and the store's histories behind the sync tag (histories.ts). Added
 * with ALTER TABLE and CREATE IF NOT EXISTS so a store created by an earlier version opens
 * with its data and takes the defaults (epoch 0, no period, no network policy).
 */
import type Database from 'better-sqlite3';
import { addMissingColumns, V1_RECORD_COLUMNS, type AddedColumns } from '../sqlite-file.js';

type DB = Database.Database;

const ADDED_COLUMNS: AddedColumns = {
  keys: {
    ...V1_RECORD_COLUMNS.keys,
    period: `period TEXT CHECK (period IN ('day', 'week', 'month'))`,
    // start of the budget period `spent` counts from; null without a period
    period_start: 'period_start INTEGER',
  },
  projects: {
    ...V1_RECORD_COLUMNS.projects,
    period: `period TEXT CHECK (period IN ('day', 'week', 'month'))`,
    period_start: 'period_start INTEGER',
  },
  wallets: V1_RECORD_COLUMNS.wallets,
  usage: { estimated: 'estimated INTEGER NOT NULL DEFAULT 0' },
};

const DDL = `
CREATE TABLE IF NOT EXISTS prices (
  model TEXT PRIMARY KEY,
  input REAL NOT NULL,
  output REAL NOT NULL,
  per REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS keys_period ON keys(period, period_start) WHERE period IS NOT NULL;
CREATE INDEX IF NOT EXISTS projects_period ON projects(period, period_start) WHERE period IS NOT NULL;
-- The admin API's key listing pages in creation order (key-list.ts).
CREATE INDEX IF NOT EXISTS keys_created ON keys(created_at, id);
-- One row per start of the store (histories.ts). seq orders them: an INTEGER PRIMARY KEY
-- keeps its values through VACUUM, which may renumber a plain rowid.
CREATE TABLE IF NOT EXISTS histories (
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  from_version INTEGER NOT NULL,
  started_at INTEGER NOT NULL
);
`;

export function migrateConsoleDb(db: DB): void {
  db.transaction(() => {
    addMissingColumns(db, ADDED_COLUMNS);
    db.exec(DDL);
  }).immediate();
}

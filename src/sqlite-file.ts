/**
 * SQLite file handling shared by the two stores that keep one: the console's store and the
 * sidecar's replica. They are adapters that import nothing of each other, so what they
 * both need of a database file lives here: opening it private to its owner, and adding
 * the columns an older file lacks (those of sync protocol v1 are alike in both).
 */
import Database from 'better-sqlite3';
import { chmodSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { dirname } from 'node:path';

/**
 * The file holds key hashes and balances: readable by its owner only. SQLite gives the
 * -wal and -shm files the database file's mode, so the database is created 0600 before
 * SQLite opens it; files left wider by an earlier run are narrowed.
 */
function makePrivate(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  closeSync(openSync(path, 'a', 0o600));
  for (const p of [path, `${path}-wal`, `${path}-shm`]) {
    try {
      chmodSync(p, 0o600);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
}

/**
 * Opens (or creates) the database at `path` readable by its owner only; `prepare` sets up
 * pragmas, tables and migrations. The files are narrowed again afterwards, since preparing
 * may have created the -wal and -shm files. `:memory:` and `''` touch no file.
 */
export function openPrivateDatabase(path: string, prepare: (db: Database.Database) => void): Database.Database {
  const onDisk = path !== ':memory:' && path !== '';
  if (onDisk) makePrivate(path);
  const db = new Database(path);
  prepare(db);
  if (onDisk) makePrivate(path);
  return db;
}

/** Columns added to a schema after its first release: table -> column -> ALTER TABLE clause. */
export type AddedColumns = Record<string, Record<string, string>>;

/**
 * The columns sync protocol v1 added to the key, project and wallet tables, alike in both
 * stores. Each store lists its own besides (the console checks `period` and keeps where a
 * budget period started).
 */
export const V1_RECORD_COLUMNS = {
  keys: {
    epoch: 'epoch INTEGER NOT NULL DEFAULT 0',
    ips: 'ips TEXT',
    allow_browser: 'allow_browser INTEGER NOT NULL DEFAULT 0',
    model_limits: 'model_limits TEXT',
    // the key's shadowed checks as a JSON list; null: none
    shadow: 'shadow TEXT',
  },
  projects: { epoch: 'epoch INTEGER NOT NULL DEFAULT 0' },
  wallets: { epoch: 'epoch INTEGER NOT NULL DEFAULT 0' },
} satisfies AddedColumns;

/**
 * Adds each listed column its table lacks. Call it inside a write transaction: another
 * connection may open the same file at once, and only one of them must add a column.
 */
export function addMissingColumns(db: Database.Database, added: AddedColumns): void {
  for (const [table, columns] of Object.entries(added)) {
    const have = new Set((db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name));
    for (const [name, clause] of Object.entries(columns)) if (!have.has(name)) db.exec(`ALTER TABLE ${table} ADD COLUMN ${clause}`);
  }
}

/**
 * Opening the replica's file: the connection and the statements the store reads with, the
 * path's claim for the process that owns it, and the error that says what to do with a
 * file that cannot be used.
 */
import type Database from 'better-sqlite3';
import { prepareDatabase } from './schema.js';
import { holderLookup } from './holders.js';
import { openPrivateDatabase } from '../sqlite-file.js';
import { claimPath } from './replica-file.js';
import type { Holder } from '../policy/holders.js';

/**
 * An error naming the file and what to do: the replica only caches the console's data, so
 * a file that is not one (another program's, damaged, of an unknown schema) can go. A file
 * another process holds locked (SQLITE_BUSY) is in use, not broken: that process is named
 * as the thing to look for.
 */
function unusableReplica(path: string, err: unknown): Error {
  const why = err instanceof Error ? err.message : String(err);
  const busy = (err instanceof Error && (err as { code?: unknown }).code === 'SQLITE_BUSY') || /database is locked/.test(why);
  const todo = busy
    ? 'another process holds it locked (a second keyward on the same file, a backup, a sqlite3 shell): stop that process, or give this one its own replica.path'
    : 'it only caches the console\'s data: fix its permissions, or move it away and the next sync or import rebuilds it';
  return new Error(`replica.path ${path} cannot be used as the replica (${why}); ${todo}`);
}

/** The path's claim for a process that owns an on-disk replica (ReplicaOptions.owner in store.ts). */
export function claimOwned(o: { owner?: boolean | undefined; path: string }): Database.Database | null {
  if (!o.owner || o.path === ':memory:' || o.path === '') return null;
  try {
    return claimPath(o.path);
  } catch (err) {
    if ((err as { code?: unknown }).code !== 'SQLITE_BUSY') throw unusableReplica(`${o.path}.owner`, err);
    throw new Error(`replica.path ${o.path} is synced by another keyward (it holds ${o.path}.owner locked): give this one its own replica.path, or stop that one`, { cause: err });
  }
}

export function openDatabase(path: string): Database.Database {
  return openPrivateDatabase(path, prepareDatabase);
}

/** The statements the store reads with, prepared on one connection. */
export interface Reads {
  byHash: Database.Statement;
  holder: (id: string) => Holder | null;
  allPrices: Database.Statement;
  meta: Database.Statement;
  dataVersion: Database.Statement;
}

export function openReplica(path: string): { db: Database.Database; reads: Reads } {
  let db: Database.Database;
  try {
    db = openDatabase(path);
    // Checkpoints run on a worker (snapshot-apply.ts, foldSoon): inside a commit here they stall the event loop.
    if (!db.memory) db.pragma('wal_autocheckpoint = 0');
  } catch (err) {
    throw unusableReplica(path, err);
  }
  try {
    const byHash = db.prepare(`SELECT k.*, p.id AS p_id, p.status AS p_status, p.budget AS p_budget, p.spent AS p_spent,
        p.epoch AS p_epoch, p.period AS p_period, w.balance AS w_balance, w.epoch AS w_epoch
      FROM keys k LEFT JOIN projects p ON p.id = k.project_id LEFT JOIN wallets w ON w.user_id = k.user_id
      WHERE k.hash = ?`);
    return {
      db,
      reads: {
        byHash,
        holder: holderLookup(db),
        allPrices: db.prepare('SELECT model, input, output, per FROM prices'),
        meta: db.prepare('SELECT version, tag, applied_at, source FROM meta WHERE id = 1'),
        dataVersion: db.prepare('PRAGMA data_version').pluck(),
      },
    };
  } catch (err) {
    db.close();
    throw unusableReplica(path, err);
  }
}

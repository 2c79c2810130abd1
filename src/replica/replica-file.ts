/**
 * The replica's file as a path names it. An open SQLite connection keeps the file it
 * opened even after that file is deleted or replaced, while the worker threads that apply
 * large batches and snapshots open the path: the two would then write different files,
 * and the one served would stop receiving what they write. Telling the two apart is a
 * comparison of device and inode.
 */
import type Database from 'better-sqlite3';
import { renameSync, statSync } from 'node:fs';
import { openPrivateDatabase } from '../sqlite-file.js';

export interface FileIdentity {
  dev: number;
  ino: number;
}

/** The file at `path` now, or null when there is none. */
export function fileAt(path: string): FileIdentity | null {
  const s = statSync(path, { throwIfNoEntry: false });
  return s ? { dev: s.dev, ino: s.ino } : null;
}

export const sameFile = (a: FileIdentity, b: FileIdentity | null): boolean => b !== null && a.dev === b.dev && a.ino === b.ino;

/** SQLite's answers for a file whose pages are damaged or that is not a database at all. */
export function isDamage(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (code === 'SQLITE_CORRUPT' || code === 'SQLITE_NOTADB') return true;
  return err instanceof Error && /database disk image is malformed|file is not a database/.test(err.message);
}

/**
 * Another connection holds the file's write lock (a `keyward import`, a sqlite3 shell, a
 * backup tool): a passing state, not bad data, and nothing to wait for on the event loop.
 */
export function isBusy(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED'));
}

/** Moves a damaged replica's files (and its -wal and -shm) aside; returns where the database went. */
export function moveAside(path: string, at: number): string {
  const to = `${path}.damaged-${at}`;
  for (const ext of ['', '-wal', '-shm']) {
    try {
      renameSync(path + ext, to + ext);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
  return to;
}

/**
 * Holds the replica's path for the process that syncs it, until the connection returned is
 * closed: a second syncing process on the same path (a volume two pods share) would stall
 * this one's event loop for seconds on SQLite's write lock whenever either applied a
 * snapshot. It is SQLite's own file lock on `<path>.owner`, which goes with the process
 * however it ends. Throws SQLite's SQLITE_BUSY when another process holds it.
 */
export function claimPath(path: string): Database.Database {
  const lock = openPrivateDatabase(`${path}.owner`, (db) => {
    db.pragma('busy_timeout = 0');
    db.pragma('locking_mode = EXCLUSIVE');
  });
  try {
    // The first write takes the lock, and exclusive mode keeps it until the connection closes.
    lock.exec(`CREATE TABLE IF NOT EXISTS owner (pid INTEGER); DELETE FROM owner; INSERT INTO owner VALUES (${process.pid})`);
    return lock;
  } catch (err) {
    lock.close();
    throw err;
  }
}

/**
 * GET /sync/v1/snapshot: the whole state as NDJSON, streamed row by row from a read
 * transaction on a connection of its own. WAL gives that transaction a fixed view, so the
 * meta version matches every line even while writes go on, and the writer connection is
 * never held up. Output is written in bounded chunks with backpressure, and the stream
 * yields to the event loop between chunks so a million-key snapshot never stalls the console.
 */
import Database from 'better-sqlite3';
import type { ServerResponse } from 'node:http';
import { setImmediate as yieldNow } from 'node:timers/promises';
import { keyRecordOf, projectRecordOf, walletRecordOf, KEY_COLUMNS, type DB, type KeyRow, type ProjectRow, type WalletRow } from './db.js';
import { tagAt } from './histories.js';

const CHUNK_CHARS = 256 * 1024;

function drainedOrClosed(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** Streams the snapshot into `res` (headers already sent). Returns the version and the number of records. */
export async function streamSnapshot(opts: { db: DB; res: ServerResponse }): Promise<{ version: number; records: number }> {
  const { res } = opts;
  // An in-memory store cannot be opened twice; it is only for demos, so it is read in one go.
  const own = opts.db.memory ? null : new Database(opts.db.name, { readonly: true, fileMustExist: true });
  const conn = own ?? opts.db;
  let records = 0;
  try {
    // With its own connection the read transaction pins one view across the awaits below.
    if (own) conn.exec('BEGIN');
    const version = conn.prepare('SELECT COALESCE(MAX(version), 0) FROM changes').pluck().get() as number;
    // The tag names the history this version belongs to, read in the same view as the version.
    const tag = tagAt(conn, version);
    let buf = JSON.stringify({ type: 'meta', version, ...(tag === null ? {} : { tag }) }) + '\n';
    const flush = async () => {
      const ok = res.write(buf);
      buf = '';
      if (!ok) await drainedOrClosed(res);
      else await yieldNow();
    };
    const sources = [
      { stmt: conn.prepare('SELECT * FROM projects ORDER BY id'), line: (r: unknown) => projectRecordOf(r as ProjectRow) },
      { stmt: conn.prepare('SELECT * FROM wallets ORDER BY user_id'), line: (r: unknown) => walletRecordOf(r as WalletRow) },
      { stmt: conn.prepare(`SELECT ${KEY_COLUMNS} FROM keys ORDER BY rowid`), line: (r: unknown) => keyRecordOf(r as KeyRow) },
      { stmt: conn.prepare('SELECT model, input, output, per FROM prices ORDER BY model'), line: (r: unknown) => ({ type: 'price', ...(r as object) }) },
    ];
    // Without one, everything is read now, before the first await, so no write can interleave.
    const preread = own ? null : sources.map((s) => s.stmt.all());
    for (const [i, src] of sources.entries()) {
      const rows = preread ? preread[i]![Symbol.iterator]() : (src.stmt.iterate() as IterableIterator<unknown>);
      for (const row of rows) {
        buf += JSON.stringify(src.line(row)) + '\n';
        records++;
        if (buf.length >= CHUNK_CHARS) {
          await flush();
          if (res.destroyed) {
            rows.return?.();
            return { version, records };
          }
        }
      }
    }
    if (buf.length > 0) res.write(buf);
    res.end();
    return { version, records };
  } finally {
    if (conn.inTransaction) conn.exec('COMMIT');
    own?.close();
  }
}

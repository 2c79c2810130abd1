/**
 * Histories of the console store, behind the `tag` of sync protocol v1 (an addition). A
 * version number alone cannot tell this store's version 8 from the version 8 of a history
 * it lost: a store restored from a backup numbers its new changes from the backup's
 * version on, so a sidecar's cursor from the lost history becomes a valid number again
 * once the store has taken enough writes, and the changes in between would be skipped.
 *
 * Each start of the store begins a history, recording the version it starts at. A history
 * covers the versions from its start up to the next history's start (inclusive), the
 * newest one up to the current version; the tag of a version is the newest history that
 * covers it. A sidecar's (version, tag) is good when that history covers that version: a
 * plain restart keeps it good (the old history still reaches the version the restart began
 * at), while a restore does not (the history is not in the backup, or ends at the
 * backup's version).
 */
import { randomBytes } from 'node:crypto';
import type { DB } from './db.js';

/** Same width as a key id's random part: unique across every start of every store. */
const TAG_BYTES = 8;

/** Where each history's cover ends: the next history's start, or null for the newest. */
const UNTIL = `(SELECT n.from_version FROM histories n WHERE n.seq > h.seq ORDER BY n.seq LIMIT 1)`;

const TAG_OF = `SELECT h.id FROM histories h
  WHERE h.from_version <= @version AND @version <= COALESCE(${UNTIL}, @version)
  ORDER BY h.seq DESC LIMIT 1`;

const CONTAINS = `SELECT 1 FROM histories h
  WHERE h.id = @tag AND h.from_version <= @version AND @version <= COALESCE(${UNTIL}, @version)`;

/**
 * Begins a new history at the store's current version, in one write transaction so the
 * version it records is the one no write has passed yet. Returns its tag.
 */
export function beginHistory(db: DB, opts: { now: number }): string {
  const id = randomBytes(TAG_BYTES).toString('hex');
  db.transaction(() => {
    const version = db.prepare('SELECT COALESCE(MAX(version), 0) FROM changes').pluck().get() as number;
    db.prepare('INSERT INTO histories (id, from_version, started_at) VALUES (?, ?, ?)').run(id, version, opts.now);
  }).immediate();
  return id;
}

/**
 * The tag of a version at most the store's current one: null only for a store no console
 * has started (one opened by a tool). `conn` may be a read connection of its own, so a
 * snapshot reads the tag in the transaction it reads the version in.
 */
export function tagAt(conn: DB, version: number): string | null {
  return (conn.prepare(TAG_OF).pluck().get({ version }) as string | undefined) ?? null;
}

/** Tag lookups on the feed's connection, prepared once: every changes answer asks. */
export class Histories {
  private readonly tagOf;
  private readonly contains;

  constructor(db: DB) {
    this.tagOf = db.prepare(TAG_OF).pluck();
    this.contains = db.prepare(CONTAINS).pluck();
  }

  /** The tag of `version` (at most the current version). */
  tag(version: number): string | null {
    return (this.tagOf.get({ version }) as string | undefined) ?? null;
  }

  /** Whether the history named `tag` is in this store and covers `version`. */
  covers(tag: string, version: number): boolean {
    return this.contains.get({ tag, version }) !== undefined;
  }
}

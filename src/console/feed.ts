/**
 * The change log behind GET /sync/v1/changes. Every write appends full records for the
 * entities it touched, in the same transaction, so a version always names a consistent
 * state. Long polls wait on an in-process signal raised after each commit: no polling loop.
 * Answers name the history of their version (histories.ts), and a cursor that names one is
 * held only while that history covers it.
 */
import type { DB } from './db.js';
import { beginHistory, Histories } from './histories.js';
import { recordIdentity, type DeleteChange, type SyncRecord } from '../protocol/records.js';

/** `tag`: the history `version` belongs to (histories.ts); null only for a store no feed began one in */
export type FeedAnswer =
  | { kind: 'changes'; version: number; tag: string | null; body: string }
  | { kind: 'empty'; version: number; tag: string | null }
  /** the cursor is older than the retained history, or from another history (newer than ours, or a tag this store does not cover it with) */
  | { kind: 'gone'; version: number };

/** A sidecar's place: the version it holds and, when it has one, the tag of the history that version was read in. */
export interface FeedCursor {
  after: number;
  tag?: string | null;
}

export interface FeedOptions {
  db: DB;
  /** how many changes to keep; older cursors get 410 */
  retain: number;
  /** most changes per answer */
  maxBatch: number;
  /** clock for when the history this feed begins started */
  now?: () => number;
}

export class ChangeFeed {
  private readonly db: DB;
  private readonly retain: number;
  private readonly maxBatch: number;
  private readonly waiters = new Set<{ wake: () => void; end: () => void }>();
  private readonly insert;
  private readonly latest;
  private readonly after;
  private readonly getPruned;
  private readonly setPruned;
  private readonly prune;
  private readonly histories: Histories;
  private pending = false;

  constructor(opts: FeedOptions) {
    this.db = opts.db;
    this.retain = opts.retain;
    this.maxBatch = opts.maxBatch;
    this.insert = this.db.prepare('INSERT INTO changes (entity, body) VALUES (?, ?)');
    this.latest = this.db.prepare('SELECT COALESCE(MAX(version), 0) FROM changes').pluck();
    this.after = this.db.prepare('SELECT version, entity, body FROM changes WHERE version > ? ORDER BY version LIMIT ?');
    this.getPruned = this.db.prepare(`SELECT value FROM meta WHERE name = 'pruned_through'`).pluck();
    this.setPruned = this.db.prepare(`INSERT INTO meta (name, value) VALUES ('pruned_through', ?)
      ON CONFLICT(name) DO UPDATE SET value = excluded.value`);
    this.prune = this.db.prepare('DELETE FROM changes WHERE version <= ?');
    this.histories = new Histories(this.db);
    // A feed is made once per start of the store, and each start begins a history.
    beginHistory(this.db, { now: (opts.now ?? Date.now)() });
  }

  /** Current version: that of the newest change, 0 for a new store. */
  version(): number {
    return this.latest.get() as number;
  }

  /** Versions up to this one are no longer held. */
  prunedThrough(): number {
    return Number(this.getPruned.get() ?? 0);
  }

  /**
   * Records an upsert per record and the deletes (prices are the only records the console
   * removes; keys stay as tombstones). Call inside the writer's transaction, then
   * `committed()` after it.
   */
  append(records: SyncRecord[], deletes: DeleteChange[] = []): void {
    for (const r of records) this.insert.run(recordIdentity(r), JSON.stringify({ op: 'upsert', ...r }));
    for (const d of deletes) this.insert.run(recordIdentity(d), JSON.stringify(d));
    if (records.length + deletes.length > 0) this.pending = true;
    this.trim();
  }

  /** Wakes long polls once the transaction that appended has committed. */
  committed(): void {
    if (!this.pending) return;
    this.pending = false;
    for (const w of [...this.waiters]) w.wake();
  }

  /** Drops what the writer appended when its transaction rolled back. */
  rolledBack(): void {
    this.pending = false;
  }

  read(cursor: FeedCursor): FeedAnswer {
    const { after } = cursor;
    const version = this.version();
    if (after < this.prunedThrough() || after > version) return { kind: 'gone', version };
    // A cursor from a history this store does not cover it with (a restore lost that history).
    if (cursor.tag != null && !this.histories.covers(cursor.tag, after)) return { kind: 'gone', version };
    const rows = this.after.all(after, this.maxBatch) as { version: number; entity: string; body: string }[];
    if (rows.length === 0) return { kind: 'empty', version, tag: this.histories.tag(version) };
    // Each upsert carries the whole record, so only the newest per entity matters.
    const last = new Map<string, string>();
    for (const r of rows) {
      last.delete(r.entity);
      last.set(r.entity, r.body);
    }
    const top = rows[rows.length - 1]!.version;
    const tag = this.histories.tag(top);
    const tagged = tag === null ? '' : `"tag":${JSON.stringify(tag)},`;
    return { kind: 'changes', version: top, tag, body: `{"version":${top},${tagged}"changes":[${[...last.values()].join(',')}]}` };
  }

  /** Answers at once when there is something newer than `after`, else when a write commits or `waitMs` ends. */
  next(opts: FeedCursor & { waitMs: number; signal?: AbortSignal }): Promise<FeedAnswer> {
    const first = this.read(opts);
    if (first.kind !== 'empty' || opts.waitMs <= 0) return Promise.resolve(first);
    return new Promise((resolve) => {
      const done = (answer: FeedAnswer) => {
        clearTimeout(timer);
        this.waiters.delete(waiter);
        opts.signal?.removeEventListener('abort', onAbort);
        resolve(answer);
      };
      const wake = () => {
        const answer = this.read(opts);
        if (answer.kind !== 'empty') done(answer);
      };
      // nobody reads this answer: the client has gone
      const onAbort = () => done({ kind: 'empty', version: opts.after, tag: null });
      const end = () => done(this.read(opts));
      const waiter = { wake, end };
      const timer = setTimeout(end, opts.waitMs);
      this.waiters.add(waiter);
      opts.signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Number of long polls waiting (for tests and the shutdown path). */
  waiting(): number {
    return this.waiters.size;
  }

  /** Answers every long poll now, e.g. on shutdown. */
  release(): void {
    for (const w of [...this.waiters]) w.end();
  }

  private trim(): void {
    const pruned = this.prunedThrough();
    const keepFrom = this.version() - this.retain;
    // Delete in steps of a tenth of the retention, not on every append.
    if (keepFrom - pruned < Math.max(1, Math.ceil(this.retain / 10))) return;
    this.prune.run(keepFrom);
    this.setPruned.run(keepFrom);
  }
}

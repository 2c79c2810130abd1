/**
 * Writers: a whole snapshot or one change batch, each in a single transaction, so a
 * reader sees either the old replica or the new one, never a mix. Used by
 * `keyward import`, by the sync client, and by the snapshot worker (off the event loop).
 */
import type Database from 'better-sqlite3';
import { shadowColumn } from '../policy/shadow.js';
import { recordIdentity, type Change, type ChangeBatch, type SyncRecord } from '../protocol/records.js';

export class ApplyError extends Error {
  constructor(
    message: string,
    /** 1-based NDJSON line (snapshot) or 0-based change index, when known */
    readonly position?: number,
  ) {
    super(message);
    this.name = 'ApplyError';
  }
}

interface Statements {
  upsertKey: Database.Statement;
  upsertProject: Database.Statement;
  upsertWallet: Database.Statement;
  upsertPrice: Database.Statement;
  deletePrice: Database.Statement;
  tombstoneKey: Database.Statement;
  deleteProject: Database.Statement;
  deleteWallet: Database.Statement;
  setMeta: Database.Statement;
}

const cache = new WeakMap<Database.Database, Statements>();

function statements(db: Database.Database): Statements {
  let s = cache.get(db);
  if (!s) {
    s = {
      upsertKey: db.prepare(`INSERT INTO keys (id, hash, kind, user_id, project_id, status, budget, spent, models, routing, rpm, tpm,
          concurrency, epoch, ips, allow_browser, model_limits, period, shadow)
        VALUES (@id, @hash, @kind, @user, @project, @status, @budget, @spent, @models, @routing, @rpm, @tpm, @concurrency,
          @epoch, @ips, @allowBrowser, @modelLimits, @period, @shadow)
        ON CONFLICT(id) DO UPDATE SET hash = excluded.hash, kind = excluded.kind, user_id = excluded.user_id,
          project_id = excluded.project_id, status = excluded.status, budget = excluded.budget, spent = excluded.spent,
          models = excluded.models, routing = excluded.routing, rpm = excluded.rpm, tpm = excluded.tpm,
          concurrency = excluded.concurrency, epoch = excluded.epoch, ips = excluded.ips, allow_browser = excluded.allow_browser,
          model_limits = excluded.model_limits, period = excluded.period, shadow = excluded.shadow`),
      upsertProject: db.prepare(`INSERT INTO projects (id, status, budget, spent, epoch, period) VALUES (@id, @status, @budget, @spent, @epoch, @period)
        ON CONFLICT(id) DO UPDATE SET status = excluded.status, budget = excluded.budget, spent = excluded.spent,
          epoch = excluded.epoch, period = excluded.period`),
      upsertWallet: db.prepare(`INSERT INTO wallets (user_id, balance, epoch) VALUES (@user, @balance, @epoch)
        ON CONFLICT(user_id) DO UPDATE SET balance = excluded.balance, epoch = excluded.epoch`),
      upsertPrice: db.prepare(`INSERT INTO prices (model, input, output, per) VALUES (@model, @input, @output, @per)
        ON CONFLICT(model) DO UPDATE SET input = excluded.input, output = excluded.output, per = excluded.per`),
      deletePrice: db.prepare(`DELETE FROM prices WHERE model = ?`),
      // A deleted key keeps its row as a tombstone so it answers api_key_deleted, not invalid_api_key.
      tombstoneKey: db.prepare(`UPDATE keys SET status = 'deleted' WHERE id = ?`),
      deleteProject: db.prepare(`DELETE FROM projects WHERE id = ?`),
      deleteWallet: db.prepare(`DELETE FROM wallets WHERE user_id = ?`),
      // The tag is written with every version, null included: a tag left from an earlier
      // version would name a history the new version may not belong to.
      setMeta: db.prepare(`INSERT INTO meta (id, version, applied_at, source, tag) VALUES (1, ?, ?, ?, ?)
        ON CONFLICT(id) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at, source = excluded.source,
          tag = excluded.tag`),
    };
    cache.set(db, s);
  }
  return s;
}

const json = (v: unknown[] | null | undefined) => (v == null ? null : JSON.stringify(v));

/**
 * Parsed records always carry the v1 fields; records handed over directly (tests, tools)
 * may predate them, so the defaults are applied here too. Only known fields are bound:
 * better-sqlite3 refuses named parameters a statement does not use.
 */
export function writeRecord(db: Database.Database, rec: SyncRecord): void {
  const s = statements(db);
  if (rec.type === 'key') {
    s.upsertKey.run({
      id: rec.id, hash: rec.hash, kind: rec.kind, user: rec.user, project: rec.project, status: rec.status,
      budget: rec.budget, spent: rec.spent, models: json(rec.models), routing: rec.routing, rpm: rec.rpm, tpm: rec.tpm,
      concurrency: rec.concurrency, epoch: rec.epoch ?? 0, ips: json(rec.ips), allowBrowser: rec.allowBrowser ? 1 : 0,
      modelLimits: rec.modelLimits == null ? null : JSON.stringify(rec.modelLimits.map((m) => ({ models: m.models, rpm: m.rpm ?? null, tpm: m.tpm ?? null }))),
      period: rec.period ?? null, shadow: shadowColumn(rec.shadow),
    });
  } else if (rec.type === 'project') {
    s.upsertProject.run({ id: rec.id, status: rec.status, budget: rec.budget, spent: rec.spent, epoch: rec.epoch ?? 0, period: rec.period ?? null });
  } else if (rec.type === 'wallet') {
    s.upsertWallet.run({ user: rec.user, balance: rec.balance, epoch: rec.epoch ?? 0 });
  } else {
    s.upsertPrice.run({ model: rec.model, input: rec.input, output: rec.output, per: rec.per });
  }
}

function writeChange(db: Database.Database, c: Change): void {
  if (c.op === 'upsert') return writeRecord(db, c);
  const s = statements(db);
  if (c.type === 'price') s.deletePrice.run(c.model);
  else if (c.type === 'key') s.tombstoneKey.run(c.id);
  else if (c.type === 'project') s.deleteProject.run(c.id);
  else s.deleteWallet.run(c.id);
}

function describe(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  return msg.includes('UNIQUE constraint failed: keys.hash') ? 'two keys share one hash' : msg;
}

export interface SnapshotSource {
  version: number;
  /** the console history `version` belongs to (the meta line's tag); null or absent for none */
  tag?: string | null;
  /** records with the 1-based line each came from */
  records: Iterable<{ line: number; record: SyncRecord }>;
  source: string;
  now?: number;
}

/** Replaces the whole replica with the snapshot, atomically; throws ApplyError and changes nothing on failure. */
export interface SnapshotCounts {
  keys: number;
  projects: number;
  wallets: number;
  prices: number;
}

export function applySnapshot(db: Database.Database, snap: SnapshotSource): SnapshotCounts {
  const counts: SnapshotCounts = { keys: 0, projects: 0, wallets: 0, prices: 0 };
  const run = db.transaction(() => {
    db.exec('DELETE FROM keys; DELETE FROM projects; DELETE FROM wallets; DELETE FROM prices;');
    const seen = new Set<string>();
    for (const { line, record } of snap.records) {
      const identity = recordIdentity(record);
      if (seen.has(identity)) throw new ApplyError(`line ${line}: duplicate ${record.type} ${identity.slice(record.type.length + 1)}`, line);
      seen.add(identity);
      try {
        writeRecord(db, record);
      } catch (err) {
        throw new ApplyError(`line ${line}: ${describe(err)}`, line);
      }
      counts[record.type === 'price' ? 'prices' : (`${record.type}s` as 'keys' | 'projects' | 'wallets')]++;
    }
    statements(db).setMeta.run(snap.version, snap.now ?? Date.now(), snap.source, snap.tag ?? null);
  });
  run.immediate();
  return counts;
}

/**
 * Applies one change batch atomically. A batch not newer than the replica is skipped
 * (returns false), so a repeated long-poll answer is harmless.
 */
export function applyChanges(db: Database.Database, batch: ChangeBatch, opts: { source: string; now?: number }): boolean {
  const run = db.transaction(() => {
    const row = db.prepare('SELECT version FROM meta WHERE id = 1').get() as { version: number } | undefined;
    // Changes apply on top of a snapshot: a replica without one (a new file) takes none.
    if (!row || batch.version <= row.version) return false;
    batch.changes.forEach((c, i) => {
      try {
        writeChange(db, c);
      } catch (err) {
        throw new ApplyError(`changes[${i}]: ${describe(err)}`, i);
      }
    });
    statements(db).setMeta.run(batch.version, opts.now ?? Date.now(), opts.source, batch.tag ?? null);
    return true;
  });
  return run.immediate();
}

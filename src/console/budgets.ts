/**
 * Budget figures that move for another reason than usage (DESIGN sections 6 and 8): a new
 * limit, a reset, the start of a new UTC period. Each bumps the holder's `epoch`, which
 * tells sidecars to restart their live ledger from the figures this console sends, rather
 * than keep adding what they settled against the old ones.
 */
import type { SyncRecord } from '../protocol/records.js';
import { periodStart, type BudgetPeriod } from '../policy/period.js';
import { keyRecordOf, money, projectRecordOf, KEY_COLUMNS, type DB, type KeyRow, type KeyView, type ProjectRow, type ProjectView } from './db.js';
import { ApiError, invalid } from './errors.js';

/**
 * What the budget operations use of the console store, stated here rather than imported:
 * the store imports this module's rules, and the two would otherwise import each other.
 */
export interface BudgetStore {
  readonly db: DB;
  now(): number;
  write<T>(fn: () => { result: T; records: SyncRecord[] }): T;
  keyRow(id: string): KeyRow;
  projectRow(id: string): ProjectRow;
  getKey(id: string): KeyView;
  getProject(id: string): ProjectView;
}

export const jsonOrNull = (v: unknown[] | null | undefined) => (v == null ? null : JSON.stringify(v));

export function personalBudgetCheck(s: { budget?: number | null; period?: BudgetPeriod | null }): void {
  if (s.budget != null) throw invalid('personal keys spend from their user\'s wallet; budget applies to team keys');
  if (s.period != null) throw invalid('personal keys spend from their user\'s wallet; a budget period applies to team keys');
}

/**
 * Columns for a budget or period change of a key or project. A new limit bumps the epoch. A
 * new period counts from the start of the current one, and `spent` becomes what the usage
 * ledger holds since that start (`spentSince`): the spend of the period it is now in, not
 * what the old period (or no period) had gathered. That bumps the epoch too. Dropping the
 * period keeps `spent`.
 */
export function budgetChange(opts: {
  row: { budget: number | null; period: BudgetPeriod | null; epoch: number };
  budget: number | null | undefined;
  period: BudgetPeriod | null | undefined;
  now: number;
  /** the holder's usage cost recorded at or after `start` (ms) */
  spentSince: (start: number) => number;
}): Record<string, unknown> {
  const cols: Record<string, unknown> = {};
  if (opts.budget !== undefined && opts.budget !== opts.row.budget) {
    cols.budget = opts.budget;
    cols.epoch = opts.row.epoch + 1;
  }
  if (opts.period !== undefined && opts.period !== opts.row.period) {
    cols.period = opts.period;
    cols.period_start = opts.period === null ? null : periodStart(opts.period, opts.now);
    if (opts.period !== null) {
      cols.spent = money(opts.spentSince(cols.period_start as number));
      cols.epoch = opts.row.epoch + 1;
    }
  }
  return cols;
}

/** What a key's usage cost since `start` comes to, from the usage ledger. */
export const keySpentSince = (db: DB, keyId: string) => (start: number): number =>
  db.prepare('SELECT COALESCE(SUM(cost), 0) FROM usage WHERE key_id = ? AND at >= ?').pluck().get(keyId, start) as number;

/** What a project's team keys' usage cost since `start` comes to, from the usage ledger. */
export const projectSpentSince = (db: DB, projectId: string) => (start: number): number =>
  db.prepare(`SELECT COALESCE(SUM(u.cost), 0) FROM usage u JOIN keys k ON k.id = u.key_id
    WHERE k.project_id = ? AND k.kind = 'team' AND u.at >= ?`).pluck().get(projectId, start) as number;

/** Sets a key's or project's `spent` back to 0 now (an operator's reset), bumping its epoch. */
export function resetSpent(store: BudgetStore, target: { type: 'key' | 'project'; id: string }): { key?: KeyView; project?: ProjectView } {
  return store.write((): { result: { key?: KeyView; project?: ProjectView }; records: SyncRecord[] } => {
    if (target.type === 'key') {
      const row = store.keyRow(target.id);
      if (row.status === 'deleted') throw new ApiError(410, 'key_deleted', `key ${target.id} is deleted`);
      if (row.kind === 'personal') throw invalid('personal keys spend from their user\'s wallet; set the wallet instead');
      store.db.prepare('UPDATE keys SET spent = 0, epoch = epoch + 1 WHERE id = ?').run(target.id);
      const next = store.keyRow(target.id);
      return { result: { key: store.getKey(target.id) }, records: [keyRecordOf(next)] };
    }
    store.projectRow(target.id);
    store.db.prepare('UPDATE projects SET spent = 0, epoch = epoch + 1 WHERE id = ?').run(target.id);
    return { result: { project: store.getProject(target.id) }, records: [projectRecordOf(store.projectRow(target.id))] };
  });
}

/**
 * Restarts budgets whose UTC period has ended: `spent` back to 0, epoch bumped, the period
 * start moved to the current period's. Runs inside the caller's transaction. `only` limits
 * it to some keys and their projects (usage ingestion restarts what it charges first, so
 * usage after a boundary counts toward the new period); `limit` caps the rows of each table
 * (the background restart works through many budgets a transaction at a time, so one
 * boundary never holds the console's loop for seconds). Returns the records it changed.
 */
const DUE = `period IS NOT NULL AND ((period = 'day' AND period_start < @day) OR (period = 'week' AND period_start < @week) OR (period = 'month' AND period_start < @month))`;
const NEW_START = `CASE period WHEN 'day' THEN @day WHEN 'week' THEN @week ELSE @month END`;
const ONLY_KEYS = 'id IN (SELECT value FROM json_each(@keys))';
const ONLY_PROJECTS = 'id IN (SELECT project_id FROM keys WHERE id IN (SELECT value FROM json_each(@keys)))';

const currentStarts = (now: number) => ({ day: periodStart('day', now), week: periodStart('week', now), month: periodStart('month', now) });

export function rollDuePeriods(store: BudgetStore, o: { only?: readonly string[]; limit?: number } = {}): SyncRecord[] {
  const args = { ...currentStarts(store.now()), keys: JSON.stringify(o.only ?? []), limit: o.limit ?? -1 };
  const pick = (table: string, extra: string, only: string) =>
    `id IN (SELECT id FROM ${table} WHERE ${DUE}${extra}${o.only ? ` AND ${only}` : ''} LIMIT @limit)`;
  const keys = store.db.prepare(`UPDATE keys SET spent = 0, epoch = epoch + 1, period_start = ${NEW_START}
    WHERE ${pick('keys', " AND status = 'active'", ONLY_KEYS)} RETURNING ${KEY_COLUMNS}`).all(args) as KeyRow[];
  const projects = store.db.prepare(`UPDATE projects SET spent = 0, epoch = epoch + 1, period_start = ${NEW_START}
    WHERE ${pick('projects', '', ONLY_PROJECTS)} RETURNING *`).all(args) as ProjectRow[];
  return [...keys.map(keyRecordOf), ...projects.map(projectRecordOf)];
}

/**
 * Restarts at most `limit` keys and `limit` projects whose period has ended, in a write of
 * its own; returns how many restarted (the caller goes on while a batch comes back full).
 */
export function rollPeriods(store: BudgetStore, limit = ROLL_BATCH): number {
  // Checked every second: a read on the partial indexes first, the write lock only when due.
  const starts = currentStarts(store.now());
  const any = store.db.prepare(`SELECT EXISTS (SELECT 1 FROM keys WHERE status = 'active' AND ${DUE})
    OR EXISTS (SELECT 1 FROM projects WHERE ${DUE})`).pluck().get(starts);
  if (!any) return 0;
  return store.write(() => {
    const records = rollDuePeriods(store, { limit });
    return { result: records.length, records };
  });
}

/** Budgets of each table restarted a transaction: a short turn of the console's loop, however many are due. */
export const ROLL_BATCH = 2000;

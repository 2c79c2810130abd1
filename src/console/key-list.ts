/**
 * The key listing of the admin API, a page at a time: a console with many keys answers
 * each page in milliseconds, and other calls (a deletion, a long poll's wake-up) run
 * between pages rather than after one answer built from every key.
 */
import { KEY_COLUMNS, keyViewOf, type DB, type KeyRow, type KeyView } from './db.js';
import { invalid } from './errors.js';

export interface KeyListFilter {
  user?: string;
  project?: string;
  includeDeleted?: boolean;
  visibleTo?: { user: string };
  /** the `next` of the page before */
  after?: string;
  limit: number;
}

/** The most keys a page holds, and the default. */
export const KEY_PAGE_MAX = 1000;

/** Keys in creation order, and the cursor of the next page (null on the last). */
export function listKeys(db: DB, filter: KeyListFilter): { keys: KeyView[]; next: string | null } {
  const where: string[] = [];
  const args: unknown[] = [];
  const add = (clause: string, ...values: unknown[]) => {
    where.push(clause);
    args.push(...values);
  };
  if (filter.user !== undefined) add('user_id = ?', filter.user);
  if (filter.project !== undefined) add('project_id = ?', filter.project);
  if (!filter.includeDeleted) add(`status = 'active'`);
  if (filter.visibleTo) add('(user_id = ? OR project_id IN (SELECT project_id FROM members WHERE user_id = ?))', filter.visibleTo.user, filter.visibleTo.user);
  if (filter.after !== undefined) add('(created_at, id) > (?, ?)', ...cursorParts(filter.after));
  const sql = `SELECT ${KEY_COLUMNS} FROM keys ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY created_at, id LIMIT ?`;
  // One row past the page says whether another follows.
  const rows = db.prepare(sql).all(...args, filter.limit + 1) as KeyRow[];
  const more = rows.length > filter.limit;
  if (more) rows.length = filter.limit;
  const last = rows[rows.length - 1];
  return { keys: rows.map(keyViewOf), next: more && last ? `${last.created_at}.${last.id}` : null };
}

function cursorParts(cursor: string): [number, string] {
  const m = /^(\d{1,16})\.(.{1,200})$/s.exec(cursor);
  if (!m) throw invalid('after must be the next cursor of a key listing');
  return [Number(m[1]), m[2]!];
}

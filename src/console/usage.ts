/**
 * Usage ingestion (POST /sync/v1/usage): price each event, move the key's `spent` and
 * either its project's `spent` (team keys) or its user's wallet `balance` (personal keys),
 * and record when the key was last used. One batch is one transaction; each touched record
 * is appended to the feed once. The ledger is keyed by a digest of the whole event, so a
 * retried batch is harmless, yet requests that share a client-chosen request id are not
 * mistaken for repeats.
 */
import { createHash } from 'node:crypto';
import { recordIdentity, type SyncRecord } from '../protocol/records.js';
import { rollDuePeriods } from './budgets.js';
import type { UsageEvent } from '../protocol/usage.js';
import { keyRecordOf, money, projectRecordOf, walletRecordOf, type KeyRow, type ProjectRow } from './db.js';
import type { Pricer } from './pricing.js';
import type { ConsoleStore } from './store.js';

export interface IngestResult {
  accepted: number;
  /** events seen before (a retried batch): not charged again */
  duplicates: number;
  /** events for a key id this console does not know: not charged */
  unknownKeys: number;
  cost: number;
}

function statements(db: ConsoleStore['db']) {
  return {
    keyById: db.prepare('SELECT * FROM keys WHERE id = ?'),
    projectById: db.prepare('SELECT * FROM projects WHERE id = ?'),
    projectSpent: db.prepare('SELECT spent, period_start FROM projects WHERE id = ?'),
    ledger: db.prepare(`INSERT INTO usage (event_id, request_id, key_id, model, input_tokens, output_tokens, status, cost, at,
        received_at, estimated)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(event_id) DO NOTHING`),
    chargeKey: db.prepare(`UPDATE keys SET spent = ?, last_used_at = MAX(COALESCE(last_used_at, 0), ?) WHERE id = ?`),
    chargeProject: db.prepare('UPDATE projects SET spent = ? WHERE id = ?'),
    chargeWallet: db.prepare('UPDATE wallets SET balance = ?, updated_at = ? WHERE user_id = ?'),
  };
}

/** One batch's ingestion: the statements, when it was received, what it charged and what it touched. */
interface Batch {
  store: ConsoleStore;
  pricer: Pricer;
  sql: ReturnType<typeof statements>;
  received: number;
  /** added to each event's `at`: how far the sending sidecar's clock is behind this one's (clockSkew) */
  skewMs: number;
  result: IngestResult;
  touched: { keys: Set<string>; projects: Set<string>; wallets: Set<string> };
}

/** The ledger's id of an event: its sidecar's event_id, or, from a sidecar without one, a digest of the whole event. */
function eventId(ev: UsageEvent): string {
  if (ev.event_id !== undefined) return createHash('sha256').update(JSON.stringify(['event_id', ev.event_id])).digest('hex');
  // `estimated` joins the digest only when set, so ids of events without it stay what they were.
  const fields: unknown[] = [ev.request_id, ev.key_id, ev.model, ev.input_tokens, ev.output_tokens, ev.status, ev.at];
  if (ev.estimated) fields.push(true);
  return createHash('sha256').update(JSON.stringify(fields)).digest('hex');
}

/** Records one event in the ledger and charges it, unless its key is unknown or it was seen before. */
function ingestEvent(b: Batch, ev: UsageEvent): void {
  const { sql, result, received } = b;
  const key = sql.keyById.get(ev.key_id) as KeyRow | undefined;
  if (!key) {
    result.unknownKeys++;
    return;
  }
  // Estimated usage (a response without usage, section 6) is priced like any other.
  const cost = b.pricer({ model: ev.model, inputTokens: ev.input_tokens, outputTokens: ev.output_tokens });
  const parsed = Date.parse(ev.at) + b.skewMs;
  // A sidecar clock far ahead must not make a key look used in the future.
  const at = Number.isFinite(parsed) ? Math.min(parsed, received) : received;
  const inserted = sql.ledger.run(eventId(ev), ev.request_id, ev.key_id, ev.model, ev.input_tokens, ev.output_tokens, ev.status, cost, at, received, ev.estimated ? 1 : 0);
  if (inserted.changes === 0) {
    result.duplicates++;
    return;
  }
  result.accepted++;
  result.cost = money(result.cost + cost);
  charge(b, key, cost, at);
}

/**
 * What a budget counts of usage made at `at`: usage made before its current period began
 * (before a UTC boundary, pushed after it) belongs to a period that has ended, and is
 * recorded without being added to the new period's `spent`.
 */
const inPeriod = (cost: number, at: number, periodStart: number | null): number => (periodStart === null || at >= periodStart ? cost : 0);

/** Moves the key's `spent` and its project's `spent` (team keys) or its user's balance (personal keys). */
function charge(b: Batch, key: KeyRow, cost: number, at: number): void {
  const { sql, touched } = b;
  sql.chargeKey.run(money(key.spent + inPeriod(cost, at, key.period_start)), at, key.id);
  touched.keys.add(key.id);
  if (key.kind === 'team' && key.project_id !== null) {
    const p = sql.projectSpent.get(key.project_id) as { spent: number; period_start: number | null } | undefined;
    if (p) {
      sql.chargeProject.run(money(p.spent + inPeriod(cost, at, p.period_start)), key.project_id);
      touched.projects.add(key.project_id);
    }
  } else if (key.user_id !== null) {
    const w = b.store.ensureWallet(key.user_id).row;
    sql.chargeWallet.run(money(w.balance - cost), b.received, key.user_id);
    touched.wallets.add(key.user_id);
  }
}

/**
 * The records for the feed: those a period restart changed (`records`), then those the batch
 * charged. A record restarted and then charged is sent once, in its final state.
 */
function changedRecords(b: Batch, records: SyncRecord[]): SyncRecord[] {
  const { sql, touched } = b;
  const charged = new Set([...[...touched.keys].map((id) => `key:${id}`), ...[...touched.projects].map((id) => `project:${id}`)]);
  for (let i = records.length - 1; i >= 0; i--) if (charged.has(recordIdentity(records[i]!))) records.splice(i, 1);
  for (const id of touched.keys) records.push(keyRecordOf(sql.keyById.get(id) as KeyRow));
  for (const id of touched.projects) records.push(projectRecordOf(sql.projectById.get(id) as ProjectRow));
  for (const user of touched.wallets) records.push(walletRecordOf(b.store.ensureWallet(user).row));
  return records;
}

/**
 * How far a sidecar's clock is behind this console's, from the `Date` its push was sent
 * with: usage made after a budget period's UTC boundary by this console's clock counts
 * toward the new period, whatever the sidecar's clock says. `Date` has whole seconds, so
 * less than 2 s apart is taken as none.
 */
export function clockSkew(dateHeader: string | undefined, received: number): number {
  const sent = dateHeader === undefined ? NaN : Date.parse(dateHeader);
  if (!Number.isFinite(sent)) return 0;
  const skew = received - sent;
  return Math.abs(skew) < 2_000 ? 0 : skew;
}

/** A push's `Date` and when this console had its head. */
export interface PushSent {
  date: string;
  arrived: number;
}

export function ingestUsage(opts: { store: ConsoleStore; pricer: Pricer; events: UsageEvent[]; sent?: PushSent }): IngestResult {
  const { store } = opts;
  const sql = statements(store.db);
  return store.write(() => {
    const received = store.now();
    const b: Batch = {
      store, pricer: opts.pricer, sql, received, skewMs: opts.sent ? clockSkew(opts.sent.date, opts.sent.arrived) : 0,
      result: { accepted: 0, duplicates: 0, unknownKeys: 0, cost: 0 },
      touched: { keys: new Set(), projects: new Set(), wallets: new Set() },
    };
    // A budget this batch charges whose period ended restarts first, so the usage counts toward the new period.
    const restarted: SyncRecord[] = rollDuePeriods(store, { only: opts.events.map((e) => e.key_id) });
    for (const ev of opts.events) ingestEvent(b, ev);
    return { result: b.result, records: changedRecords(b, restarted) };
  });
}

/** One priced usage event as the admin API shows it. */
export interface UsageView {
  requestId: string;
  model: string | null;
  inputTokens: number;
  outputTokens: number;
  status: number;
  cost: number;
  at: string;
}

/** A key's most recent usage events, newest first (the web page's per-key usage). */
export function recentUsage(opts: { store: ConsoleStore; keyId: string; limit: number }): UsageView[] {
  const rows = opts.store.db
    .prepare('SELECT request_id, model, input_tokens, output_tokens, status, cost, at FROM usage WHERE key_id = ? ORDER BY at DESC, received_at DESC LIMIT ?')
    .all(opts.keyId, opts.limit) as { request_id: string; model: string | null; input_tokens: number; output_tokens: number; status: number; cost: number; at: number }[];
  return rows.map((r) => ({
    requestId: r.request_id, model: r.model, inputTokens: r.input_tokens, outputTokens: r.output_tokens,
    status: r.status, cost: r.cost, at: new Date(r.at).toISOString(),
  }));
}

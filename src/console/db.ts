/**
 * The console's own SQLite store: wallets, projects and members, keys (hash plus the
 * encrypted secret, never the plain key), the change log the sync feed serves, and the
 * usage ledger that makes ingestion idempotent per request id.
 */
import type Database from 'better-sqlite3';
import type { ParsedKeyRecord, ParsedRecord } from '../protocol/records.js';
import type { ModelLimit } from '../policy/facts.js';
import { nextPeriodStart, type BudgetPeriod } from '../policy/period.js';
import { knownShadowChecks, type ShadowCheck } from '../protocol/shadow-checks.js';
import { migrateConsoleDb } from './migrate.js';
import { openPrivateDatabase } from '../sqlite-file.js';

const DDL = `
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS wallets (
  user_id TEXT PRIMARY KEY,
  balance REAL NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS projects (
  id TEXT PRIMARY KEY,
  status TEXT NOT NULL CHECK (status IN ('enabled', 'disabled')),
  budget REAL,
  spent REAL NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
  project_id TEXT NOT NULL REFERENCES projects(id),
  user_id TEXT NOT NULL,
  PRIMARY KEY (project_id, user_id)
);
CREATE INDEX IF NOT EXISTS members_user ON members(user_id);
CREATE TABLE IF NOT EXISTS keys (
  id TEXT PRIMARY KEY,
  name TEXT,
  hash TEXT NOT NULL UNIQUE,
  secret_iv BLOB,
  secret_tag BLOB,
  secret_ct BLOB,
  kind TEXT NOT NULL CHECK (kind IN ('personal', 'team')),
  user_id TEXT,
  project_id TEXT REFERENCES projects(id),
  status TEXT NOT NULL CHECK (status IN ('active', 'deleted')),
  budget REAL,
  spent REAL NOT NULL DEFAULT 0,
  models TEXT,
  routing TEXT,
  rpm INTEGER,
  tpm INTEGER,
  concurrency INTEGER,
  created_at INTEGER NOT NULL,
  last_used_at INTEGER,
  deleted_at INTEGER
);
CREATE INDEX IF NOT EXISTS keys_user ON keys(user_id);
CREATE INDEX IF NOT EXISTS keys_project ON keys(project_id);
CREATE TABLE IF NOT EXISTS changes (
  version INTEGER PRIMARY KEY AUTOINCREMENT,
  entity TEXT NOT NULL,
  body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
  -- sha256 of the whole event: a retried batch repeats events byte for byte, while a client
  -- that reuses one x-request-id for many requests still gets each of them charged
  event_id TEXT PRIMARY KEY,
  request_id TEXT NOT NULL,
  key_id TEXT NOT NULL,
  model TEXT,
  input_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL,
  status INTEGER NOT NULL,
  cost REAL NOT NULL,
  at INTEGER NOT NULL,
  received_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_key_at ON usage(key_id, at);
`;

export type DB = Database.Database;

/** How long a statement waits for another connection's lock (a snapshot stream's reader). */
export const BUSY_TIMEOUT_MS = 5000;

/** Opens (or creates) the console's store, readable by its owner only, at the current schema. */
export function openConsoleDb(path: string): DB {
  return openPrivateDatabase(path, (db) => {
    // WAL lets a snapshot stream read a consistent view on its own connection while writes go on.
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = NORMAL');
    db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    db.pragma('foreign_keys = ON');
    // A deleted key's sealed secret is overwritten, not left in a free page (see ConsoleStore.deleteKey).
    db.pragma('secure_delete = ON');
    db.exec(DDL);
    migrateConsoleDb(db);
  });
}

/** Amounts are decimals; rounding every stored sum to 1e-9 keeps float drift from accumulating. */
export function money(x: number): number {
  return Math.round(x * 1e9) / 1e9;
}

export interface KeyRow {
  id: string; name: string | null; hash: string; kind: 'personal' | 'team';
  user_id: string | null; project_id: string | null; status: 'active' | 'deleted';
  budget: number | null; spent: number; models: string | null; routing: string | null;
  rpm: number | null; tpm: number | null; concurrency: number | null;
  created_at: number; last_used_at: number | null; deleted_at: number | null;
  secret_iv: Buffer | null; secret_tag: Buffer | null; secret_ct: Buffer | null;
  epoch: number; ips: string | null; allow_browser: number; model_limits: string | null;
  period: BudgetPeriod | null; period_start: number | null; shadow: string | null;
}
export interface ProjectRow {
  id: string; status: 'enabled' | 'disabled'; budget: number | null; spent: number; created_at: number;
  epoch: number; period: BudgetPeriod | null; period_start: number | null;
}
export interface WalletRow { user_id: string; balance: number; updated_at: number; epoch: number }

/** Column list without the secret, for every query that does not reveal. */
export const KEY_COLUMNS = `id, name, hash, kind, user_id, project_id, status, budget, spent, models, routing, rpm, tpm,
  concurrency, created_at, last_used_at, deleted_at, epoch, ips, allow_browser, model_limits, period, period_start, shadow`;

type Rec<T extends ParsedRecord['type']> = Extract<ParsedRecord, { type: T }>;

// Records carry every v1 field, defaults included: the console is the newest writer.
export function keyRecordOf(r: KeyRow): ParsedKeyRecord {
  return {
    type: 'key', id: r.id, hash: r.hash, kind: r.kind, user: r.user_id, project: r.project_id, status: r.status,
    budget: r.budget, spent: r.spent, models: r.models === null ? null : (JSON.parse(r.models) as string[]),
    routing: r.routing, rpm: r.rpm, tpm: r.tpm, concurrency: r.concurrency,
    epoch: r.epoch, ips: r.ips === null ? null : (JSON.parse(r.ips) as string[]), allowBrowser: r.allow_browser === 1,
    modelLimits: r.model_limits === null ? null : (JSON.parse(r.model_limits) as ModelLimit[]), period: r.period,
    shadow: r.shadow === null ? [] : knownShadowChecks(JSON.parse(r.shadow) as string[]),
  };
}

export function projectRecordOf(r: ProjectRow): Rec<'project'> {
  return { type: 'project', id: r.id, status: r.status, budget: r.budget, spent: r.spent, epoch: r.epoch, period: r.period };
}

export function walletRecordOf(r: WalletRow): Rec<'wallet'> {
  return { type: 'wallet', user: r.user_id, balance: r.balance, epoch: r.epoch };
}

/** When a holder's budget restarts next (ISO time), from the start of its current period. */
function resetsAt(r: { period: BudgetPeriod | null; period_start: number | null }): string | null {
  return r.period === null || r.period_start === null ? null : iso(nextPeriodStart(r.period, r.period_start));
}

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

/** What the admin API shows about a key: settings and usage, never the hash or the secret. */
export interface KeyView {
  id: string; name: string | null; kind: 'personal' | 'team'; user: string | null; project: string | null;
  status: 'active' | 'deleted'; budget: number | null; spent: number; models: string[] | null; routing: string | null;
  rpm: number | null; tpm: number | null; concurrency: number | null;
  epoch: number; ips: string[] | null; allowBrowser: boolean; modelLimits: ModelLimit[] | null; period: BudgetPeriod | null;
  /** checks evaluated but not enforced for this key (DESIGN section 12) */
  shadow: ShadowCheck[];
  /** when the budget period restarts next; null without a period */
  resetsAt: string | null;
  createdAt: string; lastUsedAt: string | null; deletedAt: string | null;
}

export function keyViewOf(r: KeyRow): KeyView {
  const { type: _t, hash: _h, ...rec } = keyRecordOf(r);
  return { ...rec, name: r.name, resetsAt: resetsAt(r), createdAt: iso(r.created_at)!, lastUsedAt: iso(r.last_used_at), deletedAt: iso(r.deleted_at) };
}

export interface ProjectView {
  id: string; status: 'enabled' | 'disabled'; budget: number | null; spent: number; epoch: number;
  period: BudgetPeriod | null; resetsAt: string | null; members: string[]; createdAt: string;
}
export interface WalletView { user: string; balance: number; epoch: number; updatedAt: string }

export function walletViewOf(r: WalletRow): WalletView {
  return { user: r.user_id, balance: r.balance, epoch: r.epoch, updatedAt: iso(r.updated_at)! };
}

export function projectViewOf(r: ProjectRow, members: string[]): ProjectView {
  return {
    id: r.id, status: r.status, budget: r.budget, spent: r.spent, epoch: r.epoch, period: r.period, resetsAt: resetsAt(r),
    members, createdAt: iso(r.created_at)!,
  };
}

/** A key's settings as the admin API gives them (create and update). */
export interface KeySettings {
  name?: string | null;
  models?: string[] | null;
  routing?: string | null;
  rpm?: number | null;
  tpm?: number | null;
  concurrency?: number | null;
  budget?: number | null;
  ips?: string[] | null;
  allowBrowser?: boolean;
  modelLimits?: ModelLimit[] | null;
  period?: BudgetPeriod | null;
  /** checks evaluated but not enforced for this key (DESIGN section 12); [] for none */
  shadow?: ShadowCheck[];
}

export type NewKey = KeySettings & ({ kind: 'personal'; user: string } | { kind: 'team'; project: string });

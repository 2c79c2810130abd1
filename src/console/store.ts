/**
 * The console's state and every write to it. Each write runs in one transaction that also
 * appends the changed records to the feed, so sidecars see exactly what was committed.
 * Keys: the hash (what sidecars match) and the secret sealed under the master key; the
 * plain key exists only in the create/rotate/reveal answer.
 */
import { randomBytes } from 'node:crypto';
import { generateKey } from '../auth/keyformat.js';
import type { KeyHasher } from '../auth/hash.js';
import type { DeleteChange, SyncRecord } from '../protocol/records.js';
import { periodStart, type BudgetPeriod } from '../policy/period.js';
import { shadowColumn } from '../policy/shadow.js';
import { budgetChange, jsonOrNull, keySpentSince, personalBudgetCheck, projectSpentSince } from './budgets.js';
import { open, seal, verifyKeyHashing, verifyMasterKey } from './crypto.js';
import {
  BUSY_TIMEOUT_MS, keyRecordOf, keyViewOf, money, projectRecordOf, projectViewOf, walletRecordOf, walletViewOf,
  type DB, type KeyRow, type KeyView, type NewKey, type KeySettings, type ProjectRow, type ProjectView, type WalletRow, type WalletView,
} from './db.js';
import { ApiError, conflict, notFound } from './errors.js';
import { ChangeFeed } from './feed.js';

export interface StoreOptions {
  db: DB;
  masterKey: Buffer;
  hasher: KeyHasher;
  feed: ChangeFeed;
  now?: () => number;
}

export class ConsoleStore {
  readonly db: DB;
  readonly feed: ChangeFeed;
  private readonly masterKey: Buffer;
  private readonly hasher: KeyHasher;
  readonly now: () => number;
  /** prepared once: a budget restart or a usage batch reads rows by id many times */
  private readonly byId: { key: ReturnType<DB['prepare']>; project: ReturnType<DB['prepare']> };

  constructor(opts: StoreOptions) {
    this.db = opts.db;
    this.byId = { key: this.db.prepare('SELECT * FROM keys WHERE id = ?'), project: this.db.prepare('SELECT * FROM projects WHERE id = ?') };
    this.feed = opts.feed;
    this.masterKey = opts.masterKey;
    this.hasher = opts.hasher;
    this.now = opts.now ?? Date.now;
    verifyMasterKey({ db: this.db, masterKey: this.masterKey });
    verifyKeyHashing({ db: this.db, masterKey: this.masterKey, hasher: this.hasher });
  }

  /**
   * Runs `fn` in one write transaction and wakes long polls after the commit. `fn` returns
   * its result and the records it changed (and removed).
   */
  write<T>(fn: () => { result: T; records: SyncRecord[]; deletes?: DeleteChange[] }): T {
    try {
      const out = this.db.transaction(() => {
        const r = fn();
        this.feed.append(r.records, r.deletes);
        return r.result;
      }).immediate();
      this.feed.committed();
      return out;
    } catch (err) {
      this.feed.rolledBack();
      throw err;
    }
  }

  // ---- keys ----

  keyRow(id: string): KeyRow {
    const row = this.byId.key.get(id) as KeyRow | undefined;
    if (!row) throw notFound('key', id);
    return row;
  }

  getKey(id: string): KeyView {
    return keyViewOf(this.keyRow(id));
  }

  /** True when `user` may see the key: their own personal key, or a key of a project they belong to. */
  canSee(user: string, key: KeyRow): boolean {
    if (key.kind === 'personal') return key.user_id === user;
    return this.db.prepare('SELECT 1 FROM members WHERE project_id = ? AND user_id = ?').get(key.project_id, user) !== undefined;
  }

  /** `carry`: what a rotated key's replacement takes over of its budget (rotateKey). */
  createKey(input: NewKey, carry: { spent: number; periodStart: number | null } | null = null): { key: KeyView; secret: string } {
    return this.write(() => {
      const records: SyncRecord[] = [];
      if (input.kind === 'personal') {
        personalBudgetCheck(input);
        const w = this.ensureWallet(input.user);
        if (w.created) records.push(walletRecordOf(w.row));
      } else {
        this.projectRow(input.project);
      }
      const id = `k_${randomBytes(8).toString('hex')}`;
      const secret = generateKey();
      const sealed = seal({ masterKey: this.masterKey, plaintext: secret, aad: id });
      const period = input.period ?? null;
      this.db.prepare(`INSERT INTO keys (id, name, hash, secret_iv, secret_tag, secret_ct, kind, user_id, project_id, status,
          budget, spent, models, routing, rpm, tpm, concurrency, created_at, ips, allow_browser, model_limits, period, period_start, shadow)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`).run(
        id, input.name ?? null, this.hasher(secret), sealed.iv, sealed.tag, sealed.ciphertext, input.kind,
        input.kind === 'personal' ? input.user : null, input.kind === 'team' ? input.project : null,
        input.budget ?? null, carry?.spent ?? 0, input.models == null ? null : JSON.stringify(input.models), input.routing ?? null,
        input.rpm ?? null, input.tpm ?? null, input.concurrency ?? null, this.now(),
        jsonOrNull(input.ips), input.allowBrowser ? 1 : 0, jsonOrNull(input.modelLimits), period,
        period === null ? null : (carry?.periodStart ?? periodStart(period, this.now())), shadowColumn(input.shadow),
      );
      const row = this.keyRow(id);
      records.push(keyRecordOf(row));
      return { result: { key: keyViewOf(row), secret }, records };
    });
  }

  reveal(id: string): string {
    const row = this.keyRow(id);
    if (row.status === 'deleted' || !row.secret_ct || !row.secret_iv || !row.secret_tag) {
      throw new ApiError(410, 'key_deleted', `key ${id} is deleted; its secret was destroyed`);
    }
    return open({ masterKey: this.masterKey, sealed: { iv: row.secret_iv, tag: row.secret_tag, ciphertext: row.secret_ct }, aad: id });
  }

  updateKey(id: string, patch: KeySettings): KeyView {
    return this.write(() => {
      const row = this.keyRow(id);
      if (row.status === 'deleted') throw new ApiError(410, 'key_deleted', `key ${id} is deleted`);
      if (row.kind === 'personal') personalBudgetCheck(patch);
      const cols: Record<string, unknown> = {};
      for (const f of ['name', 'routing', 'rpm', 'tpm', 'concurrency', 'budget'] as const) if (patch[f] !== undefined) cols[f] = patch[f];
      if (patch.models !== undefined) cols.models = jsonOrNull(patch.models);
      if (patch.ips !== undefined) cols.ips = jsonOrNull(patch.ips);
      if (patch.modelLimits !== undefined) cols.model_limits = jsonOrNull(patch.modelLimits);
      if (patch.allowBrowser !== undefined) cols.allow_browser = patch.allowBrowser ? 1 : 0;
      if (patch.shadow !== undefined) cols.shadow = shadowColumn(patch.shadow);
      Object.assign(cols, budgetChange({ row, budget: patch.budget, period: patch.period, now: this.now(), spentSince: keySpentSince(this.db, id) }));
      const names = Object.keys(cols);
      if (names.length > 0) {
        this.db.prepare(`UPDATE keys SET ${names.map((n) => `${n} = @${n}`).join(', ')} WHERE id = @id`).run({ ...cols, id });
      }
      const next = this.keyRow(id);
      return { result: keyViewOf(next), records: names.length > 0 ? [keyRecordOf(next)] : [] };
    });
  }

  /**
   * Immediate and final: the row stays as a tombstone (sidecars answer api_key_deleted) and
   * the secret is wiped: overwritten in its page (secure_delete), and the write-ahead log,
   * whose earlier frames still hold it, is checkpointed and truncated (a reader in the
   * middle of a snapshot can keep it from being truncated; the next deletion tries again).
   */
  deleteKey(id: string): KeyView {
    const view = this.write(() => {
      const row = this.keyRow(id);
      if (row.status === 'deleted') return { result: keyViewOf(row), records: [] };
      this.db.prepare(`UPDATE keys SET status = 'deleted', deleted_at = ?, secret_iv = NULL, secret_tag = NULL, secret_ct = NULL
        WHERE id = ?`).run(this.now(), id);
      const next = this.keyRow(id);
      return { result: keyViewOf(next), records: [keyRecordOf(next)] };
    });
    // Without waiting: a checkpoint that waits for readers would hold the event loop.
    this.db.pragma('busy_timeout = 0');
    this.db.pragma('wal_checkpoint(TRUNCATE)');
    this.db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    return view;
  }

  /** A new key with the old one's settings; the old key stays active until deleted. */
  rotateKey(id: string): { key: KeyView; secret: string; replaces: KeyView } {
    const old = this.keyRow(id);
    if (old.status === 'deleted') throw new ApiError(410, 'key_deleted', `key ${id} is deleted`);
    const v = keyViewOf(old);
    const settings: KeySettings = {
      name: v.name, models: v.models, routing: v.routing, rpm: v.rpm, tpm: v.tpm, concurrency: v.concurrency,
      ips: v.ips, allowBrowser: v.allowBrowser, modelLimits: v.modelLimits, shadow: v.shadow,
    };
    const created = old.kind === 'personal'
      ? this.createKey({ kind: 'personal', user: old.user_id!, ...settings })
      // a new credential, not a new budget: the replacement goes on from what the old key spent this period
      : this.createKey({ kind: 'team', project: old.project_id!, ...settings, budget: v.budget, period: v.period }, { spent: old.spent, periodStart: old.period_start });
    return { ...created, replaces: v };
  }

  // ---- projects ----

  projectRow(id: string): ProjectRow {
    const row = this.byId.project.get(id) as ProjectRow | undefined;
    if (!row) throw notFound('project', id);
    return row;
  }

  private projectView(row: ProjectRow): ProjectView {
    const members = this.db.prepare('SELECT user_id FROM members WHERE project_id = ? ORDER BY user_id').pluck().all(row.id) as string[];
    return projectViewOf(row, members);
  }

  getProject(id: string): ProjectView {
    return this.projectView(this.projectRow(id));
  }

  listProjects(filter: { member?: string } = {}): ProjectView[] {
    const rows = filter.member === undefined
      ? (this.db.prepare('SELECT * FROM projects ORDER BY id').all() as ProjectRow[])
      : (this.db.prepare('SELECT p.* FROM projects p JOIN members m ON m.project_id = p.id WHERE m.user_id = ? ORDER BY p.id').all(filter.member) as ProjectRow[]);
    return rows.map((r) => this.projectView(r));
  }

  isMember(project: string, user: string): boolean {
    return this.db.prepare('SELECT 1 FROM members WHERE project_id = ? AND user_id = ?').get(project, user) !== undefined;
  }

  createProject(input: { id: string; budget?: number | null; members?: string[]; period?: BudgetPeriod | null }): ProjectView {
    return this.write(() => {
      if (this.db.prepare('SELECT 1 FROM projects WHERE id = ?').get(input.id)) throw conflict(`project ${input.id} already exists`);
      const period = input.period ?? null;
      this.db.prepare(`INSERT INTO projects (id, status, budget, spent, created_at, period, period_start) VALUES (?, 'enabled', ?, 0, ?, ?, ?)`)
        .run(input.id, input.budget ?? null, this.now(), period, period === null ? null : periodStart(period, this.now()));
      const add = this.db.prepare('INSERT OR IGNORE INTO members (project_id, user_id) VALUES (?, ?)');
      for (const m of input.members ?? []) add.run(input.id, m);
      const row = this.projectRow(input.id);
      return { result: this.projectView(row), records: [projectRecordOf(row)] };
    });
  }

  updateProject(id: string, patch: { status?: 'enabled' | 'disabled'; budget?: number | null; period?: BudgetPeriod | null }): ProjectView {
    return this.write(() => {
      const before = this.projectRow(id);
      const cols: Record<string, unknown> = budgetChange({ row: before, budget: patch.budget, period: patch.period, now: this.now(), spentSince: projectSpentSince(this.db, id) });
      if (patch.status !== undefined) cols.status = patch.status;
      const names = Object.keys(cols);
      if (names.length > 0) this.db.prepare(`UPDATE projects SET ${names.map((n) => `${n} = @${n}`).join(', ')} WHERE id = @id`).run({ ...cols, id });
      const row = this.projectRow(id);
      return { result: this.projectView(row), records: names.length > 0 ? [projectRecordOf(row)] : [] };
    });
  }

  /** Membership only decides who may see a project's keys; sidecars never need it. */
  setMember(opts: { project: string; user: string; member: boolean }): ProjectView {
    return this.write(() => {
      const row = this.projectRow(opts.project);
      if (opts.member) this.db.prepare('INSERT OR IGNORE INTO members (project_id, user_id) VALUES (?, ?)').run(opts.project, opts.user);
      else this.db.prepare('DELETE FROM members WHERE project_id = ? AND user_id = ?').run(opts.project, opts.user);
      return { result: this.projectView(row), records: [] };
    });
  }

  // ---- wallets ----

  /** Returns the user's wallet, creating an empty one inside the caller's transaction when missing. */
  ensureWallet(user: string): { row: WalletRow; created: boolean } {
    const row = this.db.prepare('SELECT * FROM wallets WHERE user_id = ?').get(user) as WalletRow | undefined;
    if (row) return { row, created: false };
    this.db.prepare('INSERT INTO wallets (user_id, balance, updated_at) VALUES (?, 0, ?)').run(user, this.now());
    return { row: this.db.prepare('SELECT * FROM wallets WHERE user_id = ?').get(user) as WalletRow, created: true };
  }

  getWallet(user: string): WalletView {
    const row = this.db.prepare('SELECT * FROM wallets WHERE user_id = ?').get(user) as WalletRow | undefined;
    if (!row) throw notFound('wallet of user', user);
    return walletViewOf(row);
  }

  listWallets(): WalletView[] {
    return (this.db.prepare('SELECT * FROM wallets ORDER BY user_id').all() as WalletRow[]).map(walletViewOf);
  }

  /**
   * `credit` adds to the balance, `set` replaces it. Either moves the balance for another
   * reason than usage, so the wallet's epoch is bumped: sidecars restart its live ledger
   * from the new figure instead of keeping what they settled against the old one.
   */
  changeWallet(opts: { user: string; credit?: number; set?: number }): WalletView {
    return this.write(() => {
      const { row } = this.ensureWallet(opts.user);
      const balance = opts.set !== undefined ? money(opts.set) : money(row.balance + (opts.credit ?? 0));
      this.db.prepare('UPDATE wallets SET balance = ?, updated_at = ?, epoch = epoch + 1 WHERE user_id = ?').run(balance, this.now(), opts.user);
      const next = this.db.prepare('SELECT * FROM wallets WHERE user_id = ?').get(opts.user) as WalletRow;
      return { result: walletViewOf(next), records: [walletRecordOf(next)] };
    });
  }
}

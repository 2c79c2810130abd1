/**
 * The replica as the request path sees it: lookup by key hash through a bounded
 * in-memory cache. Writes by this process (sync) clear the cache at once; writes by
 * another process (`keyward import`) are noticed through SQLite's data_version.
 */
import type Database from 'better-sqlite3';
import { applyChanges, applySnapshot, type SnapshotSource } from './apply.js';
import { fileAt, isDamage, moveAside, sameFile, type FileIdentity } from './replica-file.js';
import { claimOwned, openReplica, type Reads } from './open.js';
import { BUSY_TIMEOUT_MS } from './schema.js';
import type { ChangeBatch } from '../protocol/records.js';
import type { KeyFacts, ModelLimit } from '../policy/facts.js';
import type { Holder } from '../policy/holders.js';
import { pickPrice, type Price, type PriceEntry } from '../policy/pricing.js';
import { knownShadowChecks, type ShadowCheck } from '../protocol/shadow-checks.js';

export interface ReplicaStatus {
  ready: boolean;
  version: number | null;
  /** the console history that version belongs to; null when the console named none */
  tag: string | null;
  /** ms since epoch of the last applied snapshot or batch */
  appliedAt: number | null;
  source: string | null;
}

export interface ReplicaOptions {
  path: string;
  /** cached lookups (hits and misses); the cache is cleared whenever the replica changes */
  cacheSize?: number;
  /** how often to look for writes by other processes */
  watchMs?: number;
  /**
   * This process syncs the file, and alone writes it: it holds the path (claimPath), and a
   * damaged file a lookup meets is moved aside and replaced (quarantine). Processes that
   * only read it (a `--workers` worker) or fill it by `keyward import` leave both be.
   */
  owner?: boolean;
  /** told where a damaged replica's files went */
  onDamaged?: (movedTo: string) => void;
  /**
   * In a process that does not own the file: told, once per file, that a lookup met damage
   * in it, with the file's identity, to tell the process that does (quarantine's ifFile).
   */
  onDamageMet?: (file: FileIdentity) => void;
}

interface Row {
  id: string; kind: 'personal' | 'team'; user_id: string | null; project_id: string | null;
  status: 'active' | 'deleted'; budget: number | null; spent: number; models: string | null;
  routing: string | null; rpm: number | null; tpm: number | null; concurrency: number | null;
  epoch: number; ips: string | null; allow_browser: number; model_limits: string | null; period: Period; shadow: string | null;
  p_id: string | null; p_status: 'enabled' | 'disabled' | null; p_budget: number | null; p_spent: number | null;
  p_epoch: number | null; p_period: Period;
  w_balance: number | null; w_epoch: number | null;
}
type Period = 'day' | 'week' | 'month' | null;

/** A key without shadowed checks (most keys; shared: facts are only read). */
const NO_SHADOW_CHECKS: readonly ShadowCheck[] = Object.freeze([]);

function toFacts(r: Row): KeyFacts {
  return {
    key: {
      id: r.id, kind: r.kind, userId: r.user_id, projectId: r.project_id, status: r.status,
      budget: r.budget, spent: r.spent, models: r.models === null ? null : (JSON.parse(r.models) as string[]),
      routing: r.routing, rpm: r.rpm, tpm: r.tpm, concurrency: r.concurrency,
      epoch: r.epoch, ips: r.ips === null ? null : (JSON.parse(r.ips) as string[]), allowBrowser: r.allow_browser === 1,
      modelLimits: r.model_limits === null ? null : (JSON.parse(r.model_limits) as ModelLimit[]), period: r.period,
      shadow: r.shadow === null ? NO_SHADOW_CHECKS : knownShadowChecks(JSON.parse(r.shadow) as string[]),
    },
    project: r.p_id === null ? null : { id: r.p_id, status: r.p_status!, budget: r.p_budget, spent: r.p_spent!, epoch: r.p_epoch!, period: r.p_period },
    walletBalance: r.w_balance,
    walletEpoch: r.w_balance === null ? null : r.w_epoch,
  };
}

export class ReplicaStore {
  /** the connection served from; replaced when the file at the path is taken up again (reattach) */
  db: Database.Database;
  private reads: Reads;
  /** the file `db` opened (null in memory) */
  private file: FileIdentity | null;
  private cache = new Map<string, KeyFacts | null>();
  private oldCache = new Map<string, KeyFacts | null>();
  /** the price table (small: one row per priced glob), read once per replica change */
  private prices: PriceEntry[] | null = null;
  private readonly priceCache = new Map<string, Price | null>();
  /** entries the young generation takes before it becomes the old one: half of cacheSize */
  private readonly youngMax: number;
  private lastDataVersion: number;
  private statusCache: ReplicaStatus;
  private readonly timer: NodeJS.Timeout;
  private readonly listeners = new Set<(s: ReplicaStatus) => void>();
  /** onDamageMet was called for the file open */
  private damageTold = false;
  /** the path's claim while this process owns the file */
  private readonly claim: Database.Database | null;
  /** work on other threads that has this replica's path open (snapshot, change batch, checkpoint) */
  private readonly elsewhere = new Set<Promise<void>>();

  constructor(private readonly opts: ReplicaOptions) {
    this.youngMax = Math.max(1, Math.floor((opts.cacheSize ?? 50_000) / 2));
    this.claim = claimOwned(opts);
    try {
      ({ db: this.db, reads: this.reads } = openReplica(opts.path));
    } catch (err) {
      this.claim?.close();
      throw err;
    }
    this.file = this.db.memory ? null : fileAt(opts.path);
    this.lastDataVersion = this.reads.dataVersion.get() as number;
    this.statusCache = this.readStatus();
    this.timer = setInterval(() => this.checkExternalWrites(), opts.watchMs ?? 200);
    this.timer.unref();
  }

  /** A budget holder by id, as the replica has it now (replica/holders.ts). */
  holder(id: string): Holder | null {
    return this.reads.holder(id);
  }

  /**
   * Whether the file open is no longer the one at the path (deleted, or another moved over
   * it): what worker threads write would not reach it (replica-file.ts).
   */
  detached(): boolean {
    return this.file !== null && !sameFile(this.file, fileAt(this.opts.path));
  }

  /**
   * Serves the file now at the path in place of the one open: after a snapshot was written
   * there while detached, or (in a worker process) once the writer has done so. The open
   * connection stays when the new file cannot be opened.
   */
  reattach(): void {
    const old = this.db;
    ({ db: this.db, reads: this.reads } = openReplica(this.opts.path));
    this.file = this.db.memory ? null : fileAt(this.opts.path);
    this.damageTold = false;
    old.close();
    this.lastDataVersion = this.reads.dataVersion.get() as number;
    this.changed();
  }

  /**
   * A replica whose pages are damaged answers nothing right: its files go aside and an
   * empty one takes its place, so the sidecar is not ready until a snapshot fills it
   * (the replica only caches the console's data). Returns where the damaged file went
   * (null: nothing moved).
   */
  quarantine(o: { ifFile?: FileIdentity } = {}): string | null {
    // Not this process's file to move (a worker, `keyward import`), or the damaged file is
    // no longer the one at the path: the snapshot under way writes a new one there. A
    // worker's report names its file: a late one must not move the new file aside.
    if (!this.opts.owner || this.file === null || this.detached()) return null;
    if (o.ifFile && !sameFile(o.ifFile, this.file)) return null;
    const to = moveAside(this.opts.path, Date.now());
    this.reattach();
    this.opts.onDamaged?.(to);
    return to;
  }

  /**
   * Facts for a key hash, or null when no key has that hash. Cached in two generations
   * rather than a strict LRU: a hit in the young one costs a lookup alone (a strict LRU
   * moves the entry on every hit, a delete and a set per request); a hit in the old one
   * moves it to the young one; when the young one is full it becomes the old one, and the
   * old one is let go. Hot keys stay cached, and at most cacheSize entries are kept.
   */
  lookup(hash: string): KeyFacts | null {
    const young = this.cache.get(hash);
    if (young !== undefined) return young;
    let facts = this.oldCache.get(hash);
    if (facts === undefined) {
      const row = this.readKey(hash);
      facts = row ? toFacts(row) : null;
    }
    if (this.cache.size >= this.youngMax) {
      this.oldCache = this.cache;
      this.cache = new Map();
    }
    this.cache.set(hash, facts);
    return facts;
  }

  private readKey(hash: string): Row | undefined {
    try {
      return this.reads.byHash.get(hash) as Row | undefined;
    } catch (err) {
      if (isDamage(err)) this.damageMet();
      throw err;
    }
  }

  private damageMet(): void {
    if (this.opts.owner) return void this.quarantine();
    if (this.file === null || this.damageTold || this.detached()) return;
    this.damageTold = true;
    this.opts.onDamageMet?.(this.file);
  }

  /**
   * The console's price for a model (the most specific record), or null when unpriced.
   * Cached per model name until the replica changes; the bound keeps clients that send
   * endless made-up model names from growing it.
   */
  priceFor(model: string): Price | null {
    const hit = this.priceCache.get(model);
    if (hit !== undefined) return hit;
    this.prices ??= this.reads.allPrices.all() as PriceEntry[];
    const price = pickPrice(this.prices, model);
    if (this.priceCache.size >= 10_000) this.priceCache.clear();
    this.priceCache.set(model, price);
    return price;
  }

  status(): ReplicaStatus {
    return this.statusCache;
  }

  onChange(listener: (s: ReplicaStatus) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Throws SQLITE_BUSY at once, rather than waiting, when another connection holds the write lock (nowait). */
  applySnapshot(snap: SnapshotSource) {
    const counts = this.nowait(() => applySnapshot(this.db, snap));
    this.changed();
    return counts;
  }

  /** As applySnapshot: never waits on another connection's lock. */
  applyChanges(batch: ChangeBatch, source: string): boolean {
    const applied = this.nowait(() => applyChanges(this.db, batch, { source }));
    if (applied) this.changed();
    return applied;
  }

  /**
   * Runs a write on the connection requests are served from without waiting for another
   * connection's write lock: its busy timeout would stall the event loop for seconds
   * (DESIGN section 7 allows 50 ms). The caller waits on a worker thread instead.
   */
  private nowait<T>(write: () => T): T {
    this.db.pragma('busy_timeout = 0');
    try {
      return write();
    } finally {
      this.db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    }
  }

  /** Called after another connection (a worker, another process) committed. */
  checkExternalWrites(): void {
    const v = this.reads.dataVersion.get() as number;
    if (v !== this.lastDataVersion) {
      this.lastDataVersion = v;
      this.changed();
    }
  }

  /** Tells close() to wait for `work`, a thread that opened this replica's path. */
  track(work: Promise<void>): void {
    this.elsewhere.add(work);
    const done = (): void => void this.elsewhere.delete(work);
    work.then(done, done);
  }

  /**
   * Closes this process's connections at once. Resolves when no thread it started has the
   * path open any longer: a caller that then moves or removes the files does not race one
   * that would reopen them.
   */
  async close(): Promise<void> {
    clearInterval(this.timer);
    this.db.close();
    this.claim?.close();
    await Promise.allSettled([...this.elsewhere]);
  }

  private changed(): void {
    this.cache.clear();
    this.oldCache.clear();
    this.prices = null;
    this.priceCache.clear();
    this.statusCache = this.readStatus();
    for (const l of this.listeners) l(this.statusCache);
  }

  private readStatus(): ReplicaStatus {
    const m = this.reads.meta.get() as { version: number; tag: string | null; applied_at: number; source: string } | undefined;
    return m
      ? { ready: true, version: m.version, tag: m.tag, appliedAt: m.applied_at, source: m.source }
      : { ready: false, version: null, tag: null, appliedAt: null, source: null };
  }
}

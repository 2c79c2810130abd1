/**
 * Shared limiter on Redis (single node or Cluster). Admission is at most one round trip
 * (request-path.ts); settlements leave in one batched call per tick (settle-batch.ts); a key
 * limited by its own RPM/TPM/concurrency alone may be admitted from a slice leased to this
 * instance, with no round trip at all, its concurrency slots taken from a block of slots
 * leased the same way (lease-path.ts, `lease`); with `lease` too, a spend hold on budgets
 * and wallets this instance draws on often is taken from spend slices (spend-slices.ts).
 * Time comes from Redis TIME inside the scripts, so instance clocks never matter.
 *
 * Key layout: everything of one API key under one hash tag, `{<prefix>:k:<keyId>}:rpm|tpm|conc`,
 * its per-model buckets `{<prefix>:k:<keyId>}:m:<pattern>:rpm|tpm`; an upstream's capacity
 * under its own tag, `{<prefix>:r:<route>}:rpm|conc`. Spend holds: see ledger.ts.
 */
import type { Cluster, Redis } from 'ioredis';
import { quotaFromReply } from '../bucket.js';
import { LeaseTerm } from '../lease-term.js';
import { type LeaseKeeper, createLeaseKeeper } from '../leases.js';
import { type AdmitInput, type AdmitResult, type ClaimInput, type ClaimResult, type HoldInput, type HoldResult, type KeyLimits, type LedgerFigure, type LedgerInput, type LimiterStats, NO_QUOTA, type Quota, capacityOf } from '../limiter.js';
import { type RedisLease, type RedisLimiter, type RedisLimiterOptions, errorTags, hashTag } from './api.js';
import { claimOnRedis, claimedByOnRedis } from './claims.js';
import { createRedisClock, type RedisClock } from './clock.js';
import { Deadlines } from './deadlines.js';
import { type LeasePath, createLeasePath } from './lease-path.js';
import { leasable } from './slice-lease.js';
import { SPEND_SLICE_MAX_MS } from './spend-slices.js';
import { type RedisLedger, createRedisLedger } from './ledger.js';
import { type LedgerNews, listenForLedgerNews } from './ledger-news.js';
import { type Part, type RequestPathContext, admitPerRequest } from './request-path.js';
import { type RunScript, atTurnEnd, refreshInChunks, scriptRunner } from './scripts.js';
import { type SettleBatch, settleBatchOf } from './settle-batch.js';

export type { RedisLease, RedisLimiter, RedisLimiterOptions };

/** Settlements of one tick leave together (settle-batch.ts). */
export const DEFAULT_SETTLE_EVERY_MS = 5;

type Op = 'admit' | 'settle' | 'refresh' | 'hold' | 'peek' | 'claim';

export function createRedisLimiter(opts: RedisLimiterOptions): RedisLimiter {
  return new SharedLimiter(opts);
}

/**
 * Asks Redis its time as soon as a connection is ready, so the first limits calls already
 * carry deadlines in Redis time (script replies keep it current afterwards).
 */
function learnOnReady(client: Redis | Cluster, clock: RedisClock): void {
  const ask = (): void => {
    client.time().then(([s, us]) => clock.learn(Number(s) * 1000 + Math.floor(Number(us) / 1000)), () => {});
  };
  client.on('ready', ask);
  if (client.status === 'ready') ask();
}

class SharedLimiter implements RedisLimiter {
  private redisErrors = 0;
  private readonly prefix: string;
  private readonly batch: SettleBatch;
  /** the script runner that flushes the settlement batch first */
  private readonly send: RunScript;
  private readonly keeper: LeaseKeeper;
  /** every lease's lifetime without a refresh (a reload may change it) */
  private readonly term: LeaseTerm;
  private readonly money: RedisLedger;
  private readonly leasePath: LeasePath | null;
  private readonly requestPath: RequestPathContext;
  /** other instances' news of over-committed ledgers (with spend slices only) */
  private readonly news: LedgerNews | null;
  /** Requests admitNow counted and found no slice for; admit goes straight to Redis with them. */
  private readonly triedNow = new WeakSet<AdmitInput>();

  constructor(private readonly opts: RedisLimiterOptions) {
    const client = opts.redis;
    // A late answer's undo that throws is counted as a failed settlement: what it would have given back stays taken until its lease runs out.
    const deadlines = opts.callTimeoutMs ? new Deadlines({ timeoutMs: opts.callTimeoutMs, onLateError: (err) => this.failed('settle', err) }) : undefined;
    const run = scriptRunner(client, deadlines);
    const term = (this.term = new LeaseTerm(opts.leaseMs, opts.refreshEveryMs));
    const clock = createRedisClock(opts.staleAfterMs);
    learnOnReady(client, clock);
    const cluster = client.isCluster;
    const settleFailed = (err: unknown): void => this.failed('settle', err);
    this.prefix = opts.prefix;
    this.batch = settleBatchOf(client, { run, cluster, prefix: opts.prefix, everyMs: opts.settleEveryMs ?? DEFAULT_SETTLE_EVERY_MS });
    // Every call this instance makes is preceded by the settlements it has queued (settle-batch.ts).
    this.send = (name, keys, args, late) => {
      this.batch.flush();
      return run(name, keys, args, late);
    };
    this.keeper = createLeaseKeeper({
      term,
      refresh: (setKey, ids) => refreshInChunks({ run, keys: [setKey], term, ids, refreshed: (chunk, sentAt, missing) => this.leasePath?.refreshed(chunk, sentAt, missing) }),
      onError: (err) => this.failed('refresh', err),
    });
    this.money = createRedisLedger({
      run: this.send,
      batch: this.batch,
      prefix: opts.prefix,
      term,
      onError: (op, err) => this.failed(op, err),
      clock,
      atTurnEnd: (fn) => atTurnEnd(client, fn),
      cluster,
      // A slice is used for at most a second (a new epoch applies within one), so never past its
      // lease, whatever term a reload puts in force (the config allows no term under a second).
      spendSlices: opts.lease ? { windowMs: Math.min(opts.lease.sliceMs, SPEND_SLICE_MAX_MS, opts.leaseMs) } : null,
    });
    this.news = opts.lease
      ? listenForLedgerNews(client, (ledgerKey) => {
          this.money.overCommitted(ledgerKey);
          this.leasePath?.bucketNews(ledgerKey);
          opts.onLedgerNews?.(ledgerKey);
        })
      : null;
    this.leasePath = opts.lease
      ? createLeasePath({ run: this.send, batch: this.batch, owner: settleFailed, clock, sliceMs: opts.lease.sliceMs, keyTag: (id) => hashTag(this.prefix, 'k', id), keeper: this.keeper, term })
      : null;
    this.requestPath = {
      send: this.send,
      clock,
      keeper: this.keeper,
      term,
      prefix: opts.prefix,
      cluster,
      settle: (leaseId: string, parts: Part[]) => {
        for (const p of parts) this.batch.add({ kind: 'buckets', tag: p.tag, leaseId, buckets: p.buckets, sets: p.sets, owner: settleFailed });
      },
      failed: (op, err) => this.failed(op, err),
    };
  }

  admitNow(input: AdmitInput): AdmitResult | null {
    const leased = this.leasePath && leasable(input);
    if (!leased) return null;
    const res = this.leasePath.admitLocal(leased);
    if (!res) this.triedNow.add(input);
    return res;
  }

  async admit(input: AdmitInput): Promise<AdmitResult> {
    const leased = this.leasePath && leasable(input);
    if (!leased) return admitPerRequest(this.requestPath, input);
    const res = this.triedNow.has(input) ? null : this.leasePath.admitLocal(leased);
    if (res) return res;
    try {
      return await this.leasePath.admit(leased);
    } catch (err) {
      if (typeof err === 'object' && err !== null) errorTags.set(err, [hashTag(this.prefix, 'k', input.keyId)]);
      this.failed('admit', err);
      throw err;
    }
  }

  async peek(input: { keyId: string; limits: KeyLimits }): Promise<Quota> {
    const rpm = capacityOf(input.limits.rpm);
    const tpm = capacityOf(input.limits.tpm);
    if (rpm === 0 && tpm === 0) return NO_QUOTA;
    const tag = hashTag(this.prefix, 'k', input.keyId);
    try {
      return quotaFromReply(rpm, tpm, (await this.send('keywardPeek', [`${tag}:rpm`, `${tag}:tpm`], [rpm, tpm])) as number[]);
    } catch (err) {
      this.failed('peek', err);
      throw err;
    }
  }

  hold(input: HoldInput): Promise<HoldResult> {
    return this.money.hold(input);
  }

  holdNow(input: HoldInput): HoldResult | null {
    return this.money.holdNow(input);
  }

  ledger(input: LedgerInput): Promise<LedgerFigure[]> {
    return this.money.ledger(input);
  }

  async claimOnce(input: ClaimInput): Promise<ClaimResult> {
    try {
      return await claimOnRedis(this.send, this.prefix, input);
    } catch (err) {
      this.failed('claim', err);
      throw err;
    }
  }

  async claimedBy(input: ClaimInput): Promise<string | null> {
    try {
      return await claimedByOnRedis(this.send, this.prefix, input);
    } catch (err) {
      this.failed('claim', err);
      throw err;
    }
  }

  setLeaseMs(ms: number): void {
    this.term.set(ms);
  }

  async refreshLeases(): Promise<void> {
    await Promise.all([this.keeper.refreshNow(), this.money.holds.refreshNow()]);
  }

  slicesHeld(): number {
    return this.leasePath?.held() ?? 0;
  }

  slotBlocksHeld(): number {
    return this.leasePath?.blocksHeld() ?? 0;
  }

  spendSlicesHeld(): number {
    return this.money.slicesHeld();
  }

  listening(): Promise<void> {
    return this.news?.listening ?? Promise.resolve();
  }

  stats(): LimiterStats {
    return { redisErrors: this.redisErrors, failOpenAdmissions: 0, slotsHeld: this.slotsHeld(), failOpenHolds: 0, holdsHeld: this.money.holdsInFlight() };
  }

  async close(): Promise<void> {
    this.keeper.stop();
    this.news?.close();
    // Give slices back and let every settlement go, so a graceful stop frees what it held.
    this.money.close();
    this.leasePath?.close();
    await this.batch.close();
  }

  /** Slots of requests in flight: their own leases and slots of blocks (a block's lease is not a request's). */
  private slotsHeld(): number {
    return this.keeper.count() - (this.leasePath ? this.leasePath.blocksHeld() - this.leasePath.onBlocks() : 0);
  }

  /** Counts a Redis failure in stats().redisErrors and tells opts.onError. */
  private failed(op: Op, err: unknown): void {
    this.redisErrors++;
    this.opts.onError?.(op, err);
  }
}

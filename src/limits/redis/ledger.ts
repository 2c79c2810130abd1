/**
 * Spend holds on Redis (single node or Cluster): the rules of src/limits/ledger.ts in Lua
 * (lua/hold.lua, lua/ledger.lua, lua/settle.lua).
 *
 * Key layout: every holder of one request under the request's hash tag (team key: its
 * project, personal key: its user), so the hold is one atomic script in a Cluster too:
 *   `{<prefix>:t:<tag>}:l:<holder>`   ledger hash (epoch, base0, settled, held, each hold's amount)
 *   `{<prefix>:t:<tag>}:lh:<holder>`  hold set (ZSET, score = expiry)
 * Both expire a day after their last use (LEDGER_TTL_MS).
 *
 * Round trips: with spend slices (`spendSlices`, spend-slices.ts), a hold on holders this
 * instance holds slices of is taken from them with no round trip. Otherwise the holds
 * requested in one event-loop turn leave together at its end, one hold.lua call per hash
 * slot (hold-queue.ts), each hold exact and taken in order, as if each were a call of its
 * own. A hold's settlement is queued in the limiter's settlement batch (settle-batch.ts:
 * one settle.lua call per tick and hash slot for all of them). Until it leaves, the hold
 * still counts in full, which only ever refuses more, and this instance flushes the batch
 * before its next call, so a cost it settled counts in the very next hold it takes. Holds
 * and slices are leases: live ones are pushed forward every refresh period of the lease
 * term (one call per hold set for all of this instance's), so a crashed instance's come
 * back after one term.
 * Time is Redis TIME in every script.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { LeaseTerm } from '../lease-term.js';
import { type KeptHolds, type LeaseKeeper, createLeaseKeeper, newLeaseId } from '../leases.js';
import { LEDGER_TTL_MS, epochArg, fromNano, holdNano, toNano } from '../ledger.js';
import type { Holder } from '../../policy/holders.js';
import type { Hold, HoldInput, HoldResult, LedgerFigure, LedgerInput } from '../limiter.js';
import type { RedisClock } from './clock.js';
import { type HoldReply, HoldQueue } from './hold-queue.js';
import { UnknownScriptReplyError } from './replies.js';
import { type RunScript, refreshInChunks } from './scripts.js';
import type { SettleBatch } from './settle-batch.js';
import { SpendSliceTable, type SpendWant } from './spend-slices.js';
import { RedisHold, SliceHold } from './ledger-holds.js';
import { SLICE_RETRY_MS } from './ledger-news.js';

export interface RedisLedgerOptions {
  /** the limiter's script runner (it flushes the settlement batch before each call) */
  run: RunScript;
  batch: SettleBatch;
  prefix: string;
  /** a hold's lifetime without a refresh (a spend slice's too), and the refresh period of live ones (0: no timer) */
  term: LeaseTerm;
  onError: (op: 'hold' | 'settle' | 'refresh', err: unknown) => void;
  /**
   * Redis time, shared with admissions (limiter.ts): replies teach it, and a hold Redis runs
   * after `deadline()` (0 = none) changes nothing, since the caller has given up on it.
   */
  clock?: RedisClock;
  /** Runs a function at the end of this event-loop turn, before the turn's calls are written (scripts.ts). */
  atTurnEnd: (fn: () => void) => void;
  /** Cluster: holds are grouped by hash slot, one call each. */
  cluster: boolean;
  /** Spend slices (spend-slices.ts) and their time; off when absent. */
  spendSlices?: { windowMs: number } | null;
}

export class StaleHoldError extends Error {}

export interface RedisLedger {
  /** Rejects when Redis fails; createLimiter applies onError. */
  hold(input: HoldInput): Promise<HoldResult>;
  /**
   * Takes the hold from this instance's spend slices, with no I/O; null when they do not
   * cover it (then call hold, which does not count the request twice).
   */
  holdNow(input: HoldInput): HoldResult | null;
  ledger(input: LedgerInput): Promise<LedgerFigure[]>;
  /** Holds in flight on this instance (exact ones and those taken from slices). */
  holdsInFlight(): number;
  /** Spend slices held now. */
  slicesHeld(): number;
  /**
   * Another instance over-committed this ledger hash, or found this instance's slice in the
   * way of its hold: the slice ends, and what is left of it goes back at once (ledger-news.ts).
   */
  overCommitted(ledgerKey: string): void;
  /** Gives every spend slice back (queued in the batch) and stops the keeper and the sweep. */
  close(): void;
  /** the live holds and slices, kept alive until settled or given back */
  readonly holds: KeptHolds;
}

const NOOP_HOLD: Hold = { settle: () => undefined };

/** Held, or refused by one of the hold's `holders` holders: anything else is an answer this build does not know. */
const knownHoldReply = (r: HoldReply, holders: number): boolean =>
  r.outcome === 1 || ((r.outcome === 0 || r.outcome === SLICES_IN_THE_WAY) && Number.isInteger(r.refusedBy) && r.refusedBy >= 1 && r.refusedBy <= holders);

/** hold.lua's answer for a hold refused only for other instances' spend slices, which it told to give them back. */
const SLICES_IN_THE_WAY = 2;

/** The Cluster hash tag all ledgers of one request share. */
export const ledgerHashTag = (prefix: string, tag: string): string => `{${prefix}:t:${encodeURIComponent(tag)}}`;

/** Each holder's ledger hash and hold set under hash tag `hashTag`, two keys a holder (hold.lua's KEYS). */
function ledgerKeysOf(hashTag: string, holders: readonly Holder[]): string[] {
  // A plain loop: no intermediate array per holder, as flatMap would build.
  const keys: string[] = [];
  for (const h of holders) {
    const id = encodeURIComponent(h.id);
    keys.push(`${hashTag}:l:${id}`, `${hashTag}:lh:${id}`);
  }
  return keys;
}

export function createRedisLedger(opts: RedisLedgerOptions): RedisLedger {
  return new SharedLedger(opts);
}

/** A request's holders in Redis terms. */
interface Keys {
  tag: string;
  hashTag: string;
  /** two per holder: ledger hash, hold set */
  keys: string[];
  /** one per holder: settle.lua judges an over-committed ledger by its kind */
  kinds: Holder['kind'][];
}

class SharedLedger implements RedisLedger {
  /** keeps the live holds and slices alive until settled or given back */
  readonly holds: LeaseKeeper;
  readonly settleFailed = (err: unknown): void => this.opts.onError('settle', err);
  readonly slices: SpendSliceTable | null;
  private readonly queue: HoldQueue;
  /**
   * The hash tag and ledger keys of a holder list, built once per list: the pipeline passes
   * the same list for every request of a key (holdersOf keeps one per facts object).
   */
  private readonly keyMemo = new WeakMap<readonly Holder[], Keys>();
  /** Requests holdNow counted and found no slice for; hold goes straight to Redis with them. */
  private readonly triedNow = new WeakSet<HoldInput>();

  constructor(readonly opts: RedisLedgerOptions) {
    this.holds = createLeaseKeeper({
      term: opts.term,
      refresh: (setKey, ids) => refreshInChunks({ run: opts.run, keys: [setKey], term: opts.term, ids }),
      onError: (err) => opts.onError('refresh', err),
    });
    this.queue = new HoldQueue(opts);
    this.slices = opts.spendSlices
      ? new SpendSliceTable({ windowMs: opts.spendSlices.windowMs, batch: opts.batch, keeper: this.holds, ledgerTtlMs: LEDGER_TTL_MS, owner: this.settleFailed })
      : null;
  }

  holdNow(input: HoldInput): HoldResult | null {
    if (!this.slices || input.holders.length === 0) return null;
    const res = this.fromSlices(this.ledgerKeys(input.tag, input.holders), input.holders, holdNano(input.amount), true);
    if (!res) this.triedNow.add(input);
    return res;
  }

  async hold(input: HoldInput): Promise<HoldResult> {
    // No budget on anything the key draws on: no round trip at all.
    if (input.holders.length === 0) return { ok: true, hold: NOOP_HOLD };
    const m = this.ledgerKeys(input.tag, input.holders);
    const amount = holdNano(input.amount);
    const slices = this.slices;
    if (slices) {
      const local = this.triedNow.has(input) ? null : this.fromSlices(m, input.holders, amount, true);
      if (local) return local;
      // Another request on these holders is asking for slices: they may cover this one too.
      const asking = slices.askingAny(m.keys);
      if (asking) {
        await asking;
        const res = this.fromSlices(m, input.holders, amount, false);
        if (res) return res;
      }
      // The exact path: what is left of this instance's slices of these holders goes back
      // first (the batch leaves before the call), so Redis sees all of it.
      slices.endAll(m.keys);
    }
    return this.exact(input, m, amount);
  }

  async ledger(input: LedgerInput): Promise<LedgerFigure[]> {
    if (input.holders.length === 0) return [];
    const args = input.holders.flatMap((h) => [h.kind, toNano(h.base), epochArg(h.epoch)]);
    const keys = ledgerKeysOf(ledgerHashTag(this.opts.prefix, input.tag), input.holders);
    const v = (await this.opts.run('keywardLedger', keys, args)) as number[];
    // Three figures a holder (ledger.lua): live, the epoch they belong to, the figure at that epoch.
    return input.holders.map((h, i) => {
      // Redis counts each instance's slice as the holds in flight it last reported; this
      // instance's own are known now.
      const over = this.slices?.overCounted(keys[2 * i]!, h) ?? 0;
      const live = Number(v[3 * i] ?? 0) + (h.kind === 'wallet' ? over : -over);
      return { id: h.id, live: fromNano(live), epoch: Number(v[3 * i + 1] ?? h.epoch), start: fromNano(Number(v[3 * i + 2] ?? 0)) };
    });
  }

  holdsInFlight(): number {
    return this.holds.count() - (this.slices?.keptCount() ?? 0) + (this.slices?.holdsInFlight() ?? 0);
  }

  slicesHeld(): number {
    return this.slices?.held() ?? 0;
  }

  overCommitted(ledgerKey: string): void {
    this.slices?.giveBack(ledgerKey);
  }

  close(): void {
    this.holds.stop();
    this.slices?.sweep(true);
    this.slices?.stop();
  }

  /** A hold from this instance's slices of every holder (`note`: count it toward their demand first), or null. */
  private fromSlices(m: Keys, holders: readonly Holder[], amount: number, note: boolean): HoldResult | null {
    const slices = this.slices!;
    if (note) slices.note(m.keys, amount);
    const taken = slices.take(m.keys, holders, amount);
    return taken && { ok: true, hold: new SliceHold(this, taken, amount) };
  }

  /** One hold.lua call for the hold (see its header for ARGV), asking for slices when they are worth it. */
  private async exact(input: HoldInput, m: Keys, amount: number): Promise<HoldResult> {
    const want = this.slices?.want(m.keys, amount) ?? null;
    const id = newLeaseId();
    // hold.lua tells slices from holds by this mark
    const sliceId = want ? `~${newLeaseId()}` : '';
    const args: (string | number)[] = [id, amount, this.opts.clock?.deadline() ?? 0, input.holders.length, sliceId, want?.least ?? 0];
    input.holders.forEach((h, j) => args.push(h.kind, toNano(h.base), h.limit === null ? '' : toNano(h.limit), epochArg(h.epoch), want?.wants[j] ?? 0));
    const sentAt = performance.now();
    // Held in Redis, answered after the call's deadline: nobody will settle the hold or use
    // the slices granted with it, so they go back now.
    const late = (v: HoldReply): void => {
      if (v.outcome !== 1) return;
      if (amount > 0) new RedisHold(this, { hashTag: m.hashTag, id, keys: m.keys, kinds: m.kinds, amount, kept: -1 }).settle(0);
      if (want && v.sliceSizes[0]! > 0) {
        this.granted(input, m, { want, sliceId, sentAt, reply: v });
        this.slices!.endAll(m.keys);
      }
    };
    let reply: HoldReply;
    try {
      const call = this.queue.add(m.hashTag, m.keys, args, late);
      if (want) this.slices!.trackAll(m.keys, call);
      reply = await call;
      for (let i = 0; reply.outcome === SLICES_IN_THE_WAY && i < SLICE_RETRY_MS.length; i++) {
        await sleep(SLICE_RETRY_MS[i]!);
        args[2] = this.opts.clock?.deadline() ?? 0;
        reply = await this.queue.add(m.hashTag, m.keys, args, late);
      }
      if (reply.outcome === -1) throw new StaleHoldError('hold reached Redis after its deadline');
      if (!knownHoldReply(reply, input.holders.length)) throw new UnknownScriptReplyError('hold.lua', reply);
    } catch (err) {
      this.opts.onError('hold', err);
      throw err;
    }
    if (want) this.granted(input, m, { want, sliceId, sentAt, reply });
    if (reply.outcome !== 1) return { ok: false, code: input.holders[reply.refusedBy - 1]!.code };
    // A zero hold (an unpriced model) is not recorded in Redis (hold.lua), so there is
    // nothing to keep alive, and nothing to settle unless the usage comes to a cost.
    const kept = amount > 0 ? this.holds.add(id, m.keys.filter((_, i) => i % 2 === 1)) : -1;
    return { ok: true, hold: new RedisHold(this, { hashTag: m.hashTag, id, keys: m.keys, kinds: m.kinds, amount, kept }) };
  }

  /** Installs the slices a hold.lua call granted; none granted: the holders are near exhaustion, ask again later. */
  private granted(input: HoldInput, m: Keys, o: { want: SpendWant; sliceId: string; sentAt: number; reply: HoldReply }): void {
    const slices = this.slices!;
    if (o.reply.outcome !== 1 || !(o.reply.sliceSizes[0]! > 0)) return slices.refusedAll(m.keys);
    slices.install({ keys: m.keys, tag: m.hashTag, holders: input.holders, id: o.sliceId, sizes: o.reply.sliceSizes, sentAt: o.sentAt });
  }

  private ledgerKeys(tag: string, holders: readonly Holder[]): Keys {
    let m = this.keyMemo.get(holders);
    if (m === undefined || m.tag !== tag) {
      const hashTag = ledgerHashTag(this.opts.prefix, tag);
      this.keyMemo.set(holders, (m = { tag, hashTag, keys: ledgerKeysOf(hashTag, holders), kinds: holders.map((h) => h.kind) }));
    }
    return m;
  }
}

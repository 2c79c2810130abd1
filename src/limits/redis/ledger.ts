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
 * Round trips: the holds requested in one event-loop turn leave together at its end, one
 * hold.lua call per hash slot (one in all on a single node), each hold exact and taken in
 * order, as if each were a call of its own; a hold's settlement is queued in the limiter's
 * settlement batch (settle-batch.ts: one settle.lua call per tick and hash slot for all of
 * them). Until it leaves, the hold still counts in full, which only ever
 * refuses more, and this instance flushes the batch before its next call, so a cost it
 * settled counts in the very next hold it takes. Holds are leases: live ones are pushed
 * forward every refreshEveryMs (one call per hold set for all of this instance's holds), so
 * a crashed instance's holds come back after leaseMs. Time is Redis TIME in every script.
 */
import { type KeptHolds, type LeaseKeeper, type LeaseTicket, createLeaseKeeper, newLeaseId } from '../leases.js';
import { LEDGER_TTL_MS, epochArg, fromNano, holdNano, settledNano, toNano } from '../ledger.js';
import type { Holder } from '../../policy/holders.js';
import type { Hold, HoldInput, HoldResult, LedgerFigure, LedgerInput } from '../limiter.js';
import type { RedisClock } from './clock.js';
import { UnknownScriptReplyError } from './replies.js';
import { callsByHashSlot } from './hash-slot.js';
import { type RunScript, refreshInChunks } from './scripts.js';
import type { SettleBatch } from './settle-batch.js';

export interface RedisLedgerOptions {
  /** the limiter's script runner (it flushes the settlement batch before each call) */
  run: RunScript;
  batch: SettleBatch;
  prefix: string;
  /** Hold lifetime without a refresh. */
  leaseMs: number;
  /** Refresh period of live holds; 0 disables the timer. */
  refreshEveryMs: number;
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
}

export class StaleHoldError extends Error {}

export interface RedisLedger {
  /** Rejects when Redis fails; createLimiter applies onError. */
  hold(input: HoldInput): Promise<HoldResult>;
  ledger(input: LedgerInput): Promise<LedgerFigure[]>;
  /** the live holds, kept alive until settled; stopping stops the refresh (the limiter flushes the batch) */
  readonly holds: KeptHolds;
}

const NOOP_HOLD: Hold = { settle: () => undefined };
/** Holds per call: a bound on the script's run time (Redis serves nothing else meanwhile). */
const MAX_HOLDS = 128;

/** The Cluster hash tag all ledgers of one request share. */
export const ledgerHashTag = (prefix: string, tag: string): string => `{${prefix}:t:${encodeURIComponent(tag)}}`;

/** Each holder's ledger hash and hold set under hash tag `hashTag`, two keys a holder (hold.lua's KEYS). */
function ledgerKeysOf(hashTag: string, holders: Holder[]): string[] {
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

class SharedLedger implements RedisLedger {
  /** keeps the live holds alive until settled */
  readonly holds: LeaseKeeper;
  readonly settleFailed = (err: unknown): void => this.opts.onError('settle', err);
  private readonly queue: HoldQueue;
  /**
   * The hash tag and ledger keys of a holder list, built once per list: the pipeline passes
   * the same list for every request of a key (holdersOf keeps one per facts object).
   */
  private readonly keyMemo = new WeakMap<readonly Holder[], { tag: string; hashTag: string; keys: string[] }>();

  constructor(readonly opts: RedisLedgerOptions) {
    this.holds = createLeaseKeeper({
      everyMs: opts.refreshEveryMs,
      refresh: (setKey, ids) => refreshInChunks({ run: opts.run, keys: [setKey], leaseMs: opts.leaseMs, ids }),
      onError: (err) => opts.onError('refresh', err),
    });
    this.queue = new HoldQueue(opts);
  }

  async hold(input: HoldInput): Promise<HoldResult> {
    // No budget on anything the key draws on: no round trip at all.
    if (input.holders.length === 0) return { ok: true, hold: NOOP_HOLD };
    const { hashTag, keys } = this.ledgerKeys(input.tag, input.holders);
    const amount = holdNano(input.amount);
    const id = newLeaseId();
    const args: (string | number)[] = [id, amount, this.opts.clock?.deadline() ?? 0, input.holders.length];
    for (const h of input.holders) args.push(h.kind, toNano(h.base), h.limit === null ? '' : toNano(h.limit), epochArg(h.epoch));
    let reply: HoldReply;
    try {
      reply = await this.queue.add(hashTag, keys, args);
      if (reply.outcome === -1) throw new StaleHoldError('hold reached Redis after its deadline');
      if (!knownHoldReply(reply, input.holders.length)) throw new UnknownScriptReplyError('hold.lua', reply);
    } catch (err) {
      this.opts.onError('hold', err);
      throw err;
    }
    if (reply.outcome !== 1) return { ok: false, code: input.holders[reply.refusedBy - 1]!.code };
    // A zero hold (an unpriced model) is not recorded in Redis (hold.lua), so there is
    // nothing to keep alive, and nothing to settle unless the usage comes to a cost.
    const kept = amount > 0 ? this.holds.add(id, keys.filter((_, i) => i % 2 === 1)) : -1;
    return { ok: true, hold: new RedisHold(this, { hashTag, id, keys, amount, kept }) };
  }

  async ledger(input: LedgerInput): Promise<LedgerFigure[]> {
    if (input.holders.length === 0) return [];
    const args = input.holders.flatMap((h) => [h.kind, toNano(h.base), epochArg(h.epoch)]);
    const keys = ledgerKeysOf(ledgerHashTag(this.opts.prefix, input.tag), input.holders);
    const v = (await this.opts.run('keywardLedger', keys, args)) as number[];
    // Three figures a holder: live, the epoch they belong to, the figure at that epoch (ledger.lua).
    return input.holders.map((h, i) => ({ id: h.id, live: fromNano(Number(v[3 * i] ?? 0)), epoch: Number(v[3 * i + 1] ?? h.epoch), start: fromNano(Number(v[3 * i + 2] ?? 0)) }));
  }

  private ledgerKeys(tag: string, holders: Holder[]): { hashTag: string; keys: string[] } {
    let m = this.keyMemo.get(holders);
    if (m === undefined || m.tag !== tag) {
      const hashTag = ledgerHashTag(this.opts.prefix, tag);
      this.keyMemo.set(holders, (m = { tag, hashTag, keys: ledgerKeysOf(hashTag, holders) }));
    }
    return m;
  }
}

/**
 * One hold taken in Redis; settling it queues settle.lua's part in the batch. Its state is in
 * ES private fields: a hold may be printed or logged, and shows nothing of its ledger.
 */
class RedisHold implements Hold {
  readonly #ledger: SharedLedger;
  readonly #taken: { hashTag: string; id: string; keys: string[]; amount: number; kept: LeaseTicket };
  #done = false;

  constructor(ledger: SharedLedger, taken: { hashTag: string; id: string; keys: string[]; amount: number; kept: LeaseTicket }) {
    this.#ledger = ledger;
    this.#taken = taken;
  }

  settle(actual: number): void {
    if (this.#done) return;
    this.#done = true;
    const { hashTag, id, keys, amount, kept } = this.#taken;
    const ledger = this.#ledger;
    try {
      ledger.holds.remove(kept);
      const cost = settledNano(actual, amount);
      if (amount === 0 && cost === 0) return;
      ledger.opts.batch.add({ kind: 'hold', tag: hashTag, holdId: id, cost, ttlMs: LEDGER_TTL_MS, keys, owner: ledger.settleFailed });
    } catch (err) {
      ledger.opts.onError('settle', err);
    }
  }
}

/** hold.lua's answer for one hold: 1 held, 0 refused by holder `refusedBy` (1-based), -1 past its deadline. */
interface HoldReply {
  outcome: number;
  refusedBy: number;
}

/** Held, or refused by one of the hold's `holders` holders: anything else is an answer this build does not know. */
const knownHoldReply = (r: HoldReply, holders: number): boolean =>
  r.outcome === 1 || (r.outcome === 0 && Number.isInteger(r.refusedBy) && r.refusedBy >= 1 && r.refusedBy <= holders);

/** A hold waiting for the end of the turn: its keys and its part of hold.lua's ARGV. */
interface Pending {
  /** the request's hash tag */
  hashTag: string;
  keys: string[];
  args: (string | number)[];
  resolve: (v: HoldReply) => void;
  reject: (err: unknown) => void;
}

/** The holds asked for in one event-loop turn, sent at its end: one hold.lua call per hash slot. */
class HoldQueue {
  private pending: Pending[] = [];
  private readonly sendPending = (): void => {
    const all = this.pending;
    this.pending = [];
    for (const group of callsByHashSlot(all, { cluster: this.o.cluster, tagOf: (p) => p.hashTag, max: MAX_HOLDS })) this.send(group);
  };

  constructor(private readonly o: RedisLedgerOptions) {}

  add(hashTag: string, keys: string[], args: (string | number)[]): Promise<HoldReply> {
    return new Promise((resolve, reject) => {
      if (this.pending.length === 0) this.o.atTurnEnd(this.sendPending);
      this.pending.push({ hashTag, keys, args, resolve, reject });
    });
  }

  /** One hold.lua call for holds of one hash slot. */
  private send(group: Pending[]): void {
    const keys: string[] = [];
    const args: (string | number)[] = [LEDGER_TTL_MS, this.o.leaseMs, group.length];
    for (const p of group) {
      keys.push(...p.keys);
      args.push(...p.args);
    }
    const failed = (err: unknown): void => {
      for (const p of group) p.reject(err);
    };
    let reply: Promise<unknown>;
    try {
      reply = this.o.run('keywardHold', keys, args);
    } catch (err) {
      return failed(err);
    }
    reply.then((r) => {
      // Anything but a list is read as no answer for any hold (hold() then names it unknown).
      const v = Array.isArray(r) ? (r as number[]) : [];
      this.o.clock?.learn(Number(v[0]));
      group.forEach((p, i) => p.resolve({ outcome: Number(v[1 + 2 * i]), refusedBy: Number(v[2 + 2 * i]) }));
    }, failed);
  }
}

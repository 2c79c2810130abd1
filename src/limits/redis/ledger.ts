/**
 * Spend holds on Redis (single node or Cluster): the rules of ledger.ts in Lua.
 *
 * Key layout: every holder of one request under the request's hash tag (team key: its
 * project, personal key: its user), so the hold is one atomic script in a Cluster too:
 *   `{<prefix>:t:<tag>}:l:<holder>`   ledger hash (epoch, base0, settled, held, each hold's amount)
 *   `{<prefix>:t:<tag>}:lh:<holder>`  hold set (ZSET, score = expiry)
 * Both expire a day after their last use (LEDGER_TTL_MS).
 *
 * Round trips: the holds requested in one event-loop turn leave together at its end, one
 * hold.lua call per hash slot (one in all on a single node), each hold exact and taken in
 * order, as if each were a call of its own; a hold's settlement is queued
 * in the limiter's settlement batch (settle-batch.ts: one settle.lua call per tick and hash
 * slot for all of them). Until it leaves, the hold still counts in full, which only ever
 * refuses more, and this instance flushes the batch before its next call, so a cost it
 * settled counts in the very next hold it takes. Holds are leases: live ones are pushed
 * forward every refreshEveryMs (one call per hold set for all of this instance's holds), so
 * a crashed instance's holds come back after leaseMs. Time is Redis TIME in every script.
 */
import { createLeaseKeeper, newLeaseId } from '../leases.js';
import { LEDGER_TTL_MS, fromNano, holdNano, toNano } from '../ledger.js';
import type { Hold, HoldInput, HoldResult, LedgerFigure, LedgerHolder, LedgerInput } from '../limiter.js';
import type { RedisClock } from './clock.js';
import type { RunScript } from './scripts.js';
import type { SettleBatch } from './settle-batch.js';
import { callsBySlot } from './hash-slot.js';

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
   * Redis time, shared with admissions (redis.ts): replies teach it, and a hold Redis runs
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
  refresh(): Promise<void>;
  count(): number;
  /** Stops refreshing (the limiter flushes the batch). */
  stop(): void;
}

const NOOP_HOLD: Hold = { settle: () => undefined };
/** Lua's unpack is bounded by the C stack; refresh long lists in chunks. */
const REFRESH_CHUNK = 1000;
/** Holds per call: a bound on the script's run time (Redis serves nothing else meanwhile). */
const MAX_HOLDS = 128;

/** A hold waiting for the end of the turn: its keys and its part of hold.lua's ARGV. */
interface Pending {
  /** the request's hash tag */
  tag: string;
  keys: string[];
  args: (string | number)[];
  resolve: (v: { r: number; j: number }) => void;
  reject: (err: unknown) => void;
}

/** The Cluster hash tag all ledgers of one request share. */
export const ledgerHashTag = (prefix: string, tag: string): string => `{${prefix}:t:${encodeURIComponent(tag)}}`;

export function createRedisLedger(opts: RedisLedgerOptions): RedisLedger {
  const run = opts.run;
  const settleFailed = (err: unknown): void => opts.onError('settle', err);

  const keeper = createLeaseKeeper({
    everyMs: opts.refreshEveryMs,
    refresh: async (setKey, ids) => {
      for (let i = 0; i < ids.length; i += REFRESH_CHUNK) {
        await run('keywardRefresh', [setKey], [opts.leaseMs, ...ids.slice(i, i + REFRESH_CHUNK)]);
      }
    },
    onError: (err) => opts.onError('refresh', err),
  });

  /** `t`: the request's hash tag (ledgerHashTag). A loop: flatMap cost a request 1.6 µs under load. */
  const keysOf = (t: string, holders: LedgerHolder[]): string[] => {
    const keys: string[] = [];
    for (const h of holders) {
      const id = encodeURIComponent(h.id);
      keys.push(`${t}:l:${id}`, `${t}:lh:${id}`);
    }
    return keys;
  };

  /**
   * The hash tag and ledger keys of a holder list, built once per list: the pipeline passes
   * the same list for every request of a key (holdersOf keeps one per facts object).
   */
  const keyMemo = new WeakMap<readonly LedgerHolder[], { tag: string; hashTag: string; keys: string[] }>();
  const ledgerKeys = (tag: string, holders: LedgerHolder[]): { hashTag: string; keys: string[] } => {
    let m = keyMemo.get(holders);
    if (m === undefined || m.tag !== tag) {
      const hashTag = ledgerHashTag(opts.prefix, tag);
      keyMemo.set(holders, (m = { tag, hashTag, keys: keysOf(hashTag, holders) }));
    }
    return m;
  };

  let pending: Pending[] = [];
  /** One hold.lua call for holds of one slot. */
  const sendGroup = (group: Pending[]): void => {
    const keys: string[] = [];
    const args: (string | number)[] = [LEDGER_TTL_MS, opts.leaseMs, group.length];
    for (const p of group) {
      keys.push(...p.keys);
      args.push(...p.args);
    }
    const failed = (err: unknown): void => {
      for (const p of group) p.reject(err);
    };
    let reply: Promise<unknown>;
    try {
      reply = run('keywardHold', keys, args);
    } catch (err) {
      return failed(err);
    }
    reply.then((r) => {
      const v = r as number[];
      opts.clock?.learn(Number(v[0]));
      group.forEach((p, i) => p.resolve({ r: Number(v[1 + 2 * i]), j: Number(v[2 + 2 * i]) }));
    }, failed);
  };
  const sendPending = (): void => {
    const all = pending;
    pending = [];
    for (const call of callsBySlot(all, { cluster: opts.cluster, tagOf: (p) => p.tag, max: MAX_HOLDS })) sendGroup(call);
  };
  /** Queues one hold for the end of the turn. */
  const queue = (tag: string, keys: string[], args: (string | number)[]): Promise<{ r: number; j: number }> =>
    new Promise((resolve, reject) => {
      if (pending.length === 0) opts.atTurnEnd(sendPending);
      pending.push({ tag, keys, args, resolve, reject });
    });

  const hold = async (input: HoldInput): Promise<HoldResult> => {
    // No budget on anything the key draws on: no round trip at all.
    if (input.holders.length === 0) return { ok: true, hold: NOOP_HOLD };
    const { hashTag: tag, keys } = ledgerKeys(input.tag, input.holders);
    const amount = holdNano(input.amount);
    const id = newLeaseId();
    const args: (string | number)[] = [id, amount, opts.clock?.deadline() ?? 0, input.holders.length];
    for (const h of input.holders) {
      args.push(h.kind, toNano(h.base), h.limit === null ? '' : toNano(h.limit), Math.max(0, Math.floor(h.epoch)));
    }
    let v: { r: number; j: number };
    try {
      v = await queue(tag, keys, args);
      if (v.r === -1) throw new StaleHoldError('hold reached Redis after its deadline');
    } catch (err) {
      opts.onError('hold', err);
      throw err;
    }
    if (v.r !== 1) return { ok: false, code: input.holders[(v.j || 1) - 1]!.code };

    // A zero hold (an unpriced model) is not recorded in Redis (hold.lua), so there is
    // nothing to keep alive, and nothing to settle unless the usage comes to a cost.
    const kept = amount > 0 ? keeper.add(id, keys.filter((_, i) => i % 2 === 1)) : -1;
    let done = false;
    return {
      ok: true,
      hold: {
        settle(actual) {
          if (done) return;
          done = true;
          try {
            keeper.remove(kept);
            // An unreadable figure keeps what was held rather than charging nothing.
            const cost = Number.isFinite(actual) ? toNano(Math.max(0, actual)) : amount;
            if (amount === 0 && cost === 0) return;
            opts.batch.add({ kind: 'h', tag, holdId: id, cost, ttlMs: LEDGER_TTL_MS, keys, owner: settleFailed });
          } catch (err) {
            opts.onError('settle', err);
          }
        },
      },
    };
  };

  const ledger = async (input: LedgerInput): Promise<LedgerFigure[]> => {
    if (input.holders.length === 0) return [];
    const args = input.holders.flatMap((h) => [h.kind, toNano(h.base), Math.max(0, Math.floor(h.epoch))]);
    const v = (await run('keywardLedger', keysOf(ledgerHashTag(opts.prefix, input.tag), input.holders), args)) as number[];
    return input.holders.map((h, i) => ({ id: h.id, live: fromNano(Number(v[i] ?? 0)) }));
  };

  return {
    hold,
    ledger,
    refresh: () => keeper.refreshNow(),
    count: () => keeper.count(),
    stop: () => keeper.stop(),
  };
}

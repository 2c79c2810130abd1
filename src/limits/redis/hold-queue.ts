/**
 * The holds asked for in one event-loop turn, sent at its end: one hold.lua call per hash
 * slot (one in all on a single node), each hold exact and taken in order, as if each were a
 * call of its own (see ledger.ts).
 */
import type { LeaseTerm } from '../lease-term.js';
import { LEDGER_TTL_MS } from '../ledger.js';
import type { RedisClock } from './clock.js';
import { callsByHashSlot } from './hash-slot.js';
import type { RunScript } from './scripts.js';
import { SPEND_SLICE_SHARE } from './spend-slices.js';
import { LEDGER_NEWS_CHANNEL } from './ledger-news.js';

/** Holds per call: a bound on the script's run time (Redis serves nothing else meanwhile). */
const MAX_HOLDS = 128;

/**
 * hold.lua's answer for one hold: 1 held, 0 refused by holder `refusedBy` (1-based), 2 refused
 * there only for other instances' slices (told to give them back), -1 past its deadline; the
 * slice granted on each holder.
 */
export interface HoldReply {
  outcome: number;
  refusedBy: number;
  sliceSizes: number[];
}

export interface HoldQueueOptions {
  /** the limiter's script runner (it flushes the settlement batch before each call) */
  run: RunScript;
  /** a hold's lifetime without a refresh (a spend slice's too) */
  term: LeaseTerm;
  clock?: RedisClock;
  atTurnEnd: (fn: () => void) => void;
  cluster: boolean;
}

/** A hold waiting for the end of the turn: its keys and its part of hold.lua's ARGV. */
interface Pending {
  /** the request's hash tag */
  hashTag: string;
  keys: string[];
  args: (string | number)[];
  /** its holders */
  n: number;
  resolve: (v: HoldReply) => void;
  reject: (err: unknown) => void;
  /** the answer, when it came after the call's deadline failed the hold */
  late?: (v: HoldReply) => void;
}

/** Each hold's part of a hold.lua answer (anything but a list: no answer for any hold, which hold() names unknown). */
function eachReply(answer: unknown, group: Pending[], to: (p: Pending, reply: HoldReply) => void): void {
  const v = Array.isArray(answer) ? (answer as number[]) : [];
  let i = 1;
  for (const p of group) {
    to(p, { outcome: Number(v[i]), refusedBy: Number(v[i + 1]), sliceSizes: v.slice(i + 2, i + 2 + p.n).map(Number) });
    i += 2 + p.n;
  }
}

export class HoldQueue {
  private pending: Pending[] = [];
  private readonly sendPending = (): void => {
    const all = this.pending;
    this.pending = [];
    for (const group of callsByHashSlot(all, { cluster: this.o.cluster, tagOf: (p) => p.hashTag, max: MAX_HOLDS })) this.send(group);
  };

  constructor(private readonly o: HoldQueueOptions) {}

  /** Queues one hold: `args` is its part of hold.lua's ARGV, `keys` two per holder; `late` gets an answer that came after the call's deadline. */
  add(hashTag: string, keys: string[], args: (string | number)[], late?: (v: HoldReply) => void): Promise<HoldReply> {
    return new Promise((resolve, reject) => {
      if (this.pending.length === 0) this.o.atTurnEnd(this.sendPending);
      this.pending.push({ hashTag, keys, args, n: keys.length / 2, resolve, reject, late });
    });
  }

  /** One hold.lua call for holds of one hash slot. */
  private send(group: Pending[]): void {
    const keys: string[] = [];
    const args: (string | number)[] = [LEDGER_TTL_MS, this.o.term.ms, SPEND_SLICE_SHARE, group.length];
    for (const p of group) {
      keys.push(...p.keys);
      args.push(...p.args);
    }
    args.push(LEDGER_NEWS_CHANNEL);
    const failed = (err: unknown): void => {
      for (const p of group) p.reject(err);
    };
    let reply: Promise<unknown>;
    try {
      reply = this.o.run('keywardHold', keys, args, (r) => eachReply(r, group, (p, v) => p.late?.(v)));
    } catch (err) {
      return failed(err);
    }
    reply.then((r) => {
      if (Array.isArray(r)) this.o.clock?.learn(Number(r[0]));
      eachReply(r, group, (p, v) => p.resolve(v));
    }, failed);
  }
}

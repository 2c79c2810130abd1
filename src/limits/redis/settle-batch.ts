/**
 * Settlements (TPM refunds and charges, freed slots, returned slices and block slots,
 * spend-hold and spend-slice settlements) are queued and sent once per tick: one settle.lua call per hash
 * slot in a Cluster, one call in all on a single node, instead of one round trip each.
 *
 * What waits is only ever a release or an after-the-fact charge, never a hold or an
 * admission: holds and reservations stay per request and exact. Until the batch leaves,
 * Redis sees a released hold or slot still taken (stricter, never looser). So that this
 * instance never reads its own state stale, every other call it makes flushes the queue
 * first (`flush()`): the queued settlements are written before that call, on the same
 * connection, and Redis runs them in order. Close flushes and waits.
 */
import { callsByHashSlot } from './hash-slot.js';
import { LEDGER_NEWS_CHANNEL } from './ledger-news.js';
import type { RunScript } from './scripts.js';

/** Told when the call that carried the operation failed (the limiter that queued it counts it). */
type Owner = { owner?: (err: unknown) => void };

/** One token bucket's change: `delta` tokens given back (negative: taken), never above `cap`. */
export interface BucketWrite {
  key: string;
  cap: number;
  delta: number;
}

/**
 * What holds taken from one spend slice (spend-slices.ts) settle in Redis: costs added to the
 * holder's settled figure, `take` off the slice, and `end` to remove what is left of it. It
 * gathers the settlements of its slice until the batch sends it (`sent`), so a busy slice
 * costs one operation a tick.
 */
export interface SpendSliceWrite {
  kind: 'spendSlice';
  tag: string;
  sliceId: string;
  /** the holder's ledger hash and hold set */
  keys: [string, string];
  cost: number;
  take: number;
  end: boolean;
  /** given back, with holds still in flight on it: Redis marks it so (settle.lua) */
  givenBack: boolean;
  ttlMs: number;
  holderKind: 'budget' | 'wallet';
  /** set when the batch has written the operation into a call: from then on it is read-only */
  sent: boolean;
  /** the holds in flight on the slice as the call leaves (nano-units), which it reports */
  inFlightNow: () => number;
  owner?: (err: unknown) => void;
  /** Redis answered that the (live) slice is void: gone, or its ledger over-committed. */
  onVoid?: () => void;
}

/** One settlement; settle.lua names the kinds 'b', 'h', 'm' and 'w'. */
export type SettleOp = Owner &
  (
  /** token buckets adjusted and a request's or slice's lease ended */
  | {
      kind: 'buckets';
      /** the hash tag of every key of this operation */
      tag: string;
      leaseId: string;
      /** a slice being returned: its remainder is each bucket's delta */
      sliceId?: string;
      buckets: BucketWrite[];
      sets: string[];
    }
  /** a spend hold replaced by its actual cost */
  | { kind: 'hold'; tag: string; holdId: string; cost: number; ttlMs: number; keys: string[]; kinds: readonly ('budget' | 'wallet')[] }
  /** a block of slots shrunk (0 ends it); see slot-blocks.ts */
  | { kind: 'blockWeight'; tag: string; set: string; blockId: string; weight: number }
  | SpendSliceWrite
  );

export interface SettleBatchOptions {
  run: RunScript;
  cluster: boolean;
  /** Longest a settlement waits for company. */
  everyMs: number;
}

export interface SettleBatch {
  add(op: SettleOp): void;
  /** Sends everything queued now. */
  flush(): void;
  /** Flushes and waits for every call sent. */
  close(): Promise<void>;
}

/** Operations per call: a bound on the script's run time (Redis serves nothing else meanwhile). */
const MAX_OPS = 256;

const shared = new WeakMap<object, SettleBatch>();

/**
 * The batch of one connection: every limiter on a client shares it, since the order that
 * matters is the order on the connection.
 */
export function settleBatchOf(client: object, opts: SettleBatchOptions): SettleBatch {
  let b = shared.get(client);
  if (!b) shared.set(client, (b = createSettleBatch(opts)));
  return b;
}

export function createSettleBatch(opts: SettleBatchOptions): SettleBatch {
  return new Batch(opts);
}

/** settle.lua's KEYS and ARGV for `ops` (see its header). */
function settleCall(ops: SettleOp[]): { keys: string[]; args: (string | number)[] } {
  const keys: string[] = [];
  const args: (string | number)[] = [ops.length];
  for (const op of ops) {
    if (op.kind === 'buckets') {
      args.push('b', op.leaseId, op.sliceId ?? '', op.buckets.length, op.sets.length);
      for (const b of op.buckets) {
        keys.push(b.key);
        args.push(b.cap, b.delta);
      }
      keys.push(...op.sets);
    } else if (op.kind === 'blockWeight') {
      args.push('w', op.blockId, op.weight);
      keys.push(op.set);
    } else if (op.kind === 'spendSlice') {
      op.sent = true;
      args.push('m', op.sliceId, op.cost, op.take, op.end ? 1 : op.givenBack ? 2 : 0, op.ttlMs, op.holderKind, op.inFlightNow());
      keys.push(...op.keys);
    } else {
      args.push('h', op.holdId, op.cost, op.ttlMs, op.keys.length / 2, ...op.kinds);
      keys.push(...op.keys);
    }
  }
  args.push(LEDGER_NEWS_CHANNEL);
  return { keys, args };
}

class Batch implements SettleBatch {
  private queue: SettleOp[] = [];
  private timer: NodeJS.Timeout | null = null;
  // Calls sent and not yet answered, counted rather than kept in a Set: a Set with an add
  // and a delete per batch keeps replacing its hash table, and a replaced table that has
  // been promoted holds on to its successor and its promises (and through them the batch's
  // operations), so each young-generation collection would promote them (see src/dense-set.ts).
  private inFlight = 0;
  private onIdle: (() => void)[] = [];
  private readonly flushNow = (): void => this.flush();

  constructor(private readonly opts: SettleBatchOptions) {}

  add(op: SettleOp): void {
    if (op.kind === 'buckets' && op.buckets.length === 0 && op.sets.length === 0) return;
    this.queue.push(op);
    if (!this.timer) {
      this.timer = setTimeout(this.flushNow, this.opts.everyMs);
      this.timer.unref();
    }
  }

  flush(): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    if (this.queue.length === 0) return;
    const ops = this.queue;
    this.queue = [];
    for (const call of callsByHashSlot(ops, { cluster: this.opts.cluster, tagOf: (op) => op.tag, max: MAX_OPS })) this.send(call);
  }

  async close(): Promise<void> {
    this.flush();
    if (this.inFlight > 0) await new Promise<void>((resolve) => this.onIdle.push(resolve));
  }

  private send(ops: SettleOp[]): void {
    const { keys, args } = settleCall(ops);
    const p = this.opts.run('keywardSettle', keys, args).then(
      (reply) => {
        // settle.lua: {applied, then the 1-based index of each void spend slice's operation}
        const v = reply as number[];
        for (let i = 1; i < v.length; i++) {
          const op = ops[Number(v[i]) - 1];
          if (op?.kind === 'spendSlice') op.onVoid?.();
        }
      },
      (err: unknown) => {
        for (const owner of new Set(ops.map((op) => op.owner))) owner?.(err);
      },
    );
    this.inFlight++;
    void p.finally(() => {
      if (--this.inFlight > 0) return;
      const waiting = this.onIdle;
      this.onIdle = [];
      for (const resolve of waiting) resolve();
    });
  }
}

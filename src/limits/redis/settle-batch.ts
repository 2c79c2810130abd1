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
 *
 * A call that fails for want of Redis (no connection, no answer within its deadline, a
 * Cluster between masters) is sent again, with growing waits, for up to RETRY_WINDOW_MS: a
 * settlement lost in a blip would hold its slot until its lease ran out and drop its cost
 * from the live ledger until the console's figures came back. Each call carries an id, and
 * settle.lua records it in the instance's record of applied calls as it applies the call, so
 * a call that Redis ran after its deadline, or whose answer was lost, is applied once however
 * often it is sent.
 * A resent call may come after calls made since: it only ever releases or charges late.
 */
import { randomBytes } from 'node:crypto';
import { ReplyError } from 'ioredis';
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
  /** the limits' key prefix, under which a single node keeps this instance's record of applied calls */
  prefix: string;
  /** Wait before a failed call's first resend (doubling to RETRY_MAX_MS); RETRY_FIRST_MS by default. */
  retryFirstMs?: number;
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

const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 2_000;
/** How long after its first send a failed call is still sent again. */
export const RETRY_WINDOW_MS = 60_000;
/** How long Redis remembers an applied call: past its last resend, with room for that resend's way there. */
const KEEP_MS = RETRY_WINDOW_MS + 15_000;
/**
 * Operations waiting to be sent again; past it the oldest calls are given up (their owners were
 * told of their failure). Counted in operations, not calls: on a Cluster a tick's settlements
 * are a call per hash slot, so a shard away for a moment leaves as many calls as slots it served.
 */
const MAX_WAITING_OPS = 65_536;

/** Errors after which the call may not have run, and a resend can apply it; a script's own error is not one. */
const TRANSIENT_REPLY = /^(CLUSTERDOWN|TRYAGAIN|LOADING|MASTERDOWN|BUSY|READONLY|MOVED|ASK)\b/;
const transient = (err: unknown): boolean => !(err instanceof ReplyError) || TRANSIENT_REPLY.test((err as Error).message);

/** One settle.lua call, kept until Redis has answered it or it is given up. */
interface Call {
  ops: SettleOp[];
  keys: string[];
  args: (string | number)[];
  firstAt: number;
  tries: number;
  timer: NodeJS.Timeout | null;
}

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

/**
 * settle.lua's KEYS and ARGV for `ops` (see its header), as call `id` recorded in `record`: on a
 * single node one record per instance; a Cluster keeps it in the call's hash slot, under the tag
 * of its first operation.
 */
function settleCall(ops: SettleOp[], id: number, record: string): { keys: string[]; args: (string | number)[] } {
  const keys: string[] = [record];
  const args: (string | number)[] = [id, KEEP_MS, ops.length];
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
  // Calls sent and not yet answered, or waiting to be sent again, counted rather than kept in
  // a Set: a Set with an add and a delete per batch keeps replacing its hash table, and a
  // replaced table that has been promoted holds on to its successor and its promises (and
  // through them the batch's operations), so each young-generation collection would promote
  // them (see src/dense-set.ts).
  private inFlight = 0;
  private onIdle: (() => void)[] = [];
  /** Calls waiting to be sent again, oldest first (rare: only while Redis is away), and their operations. */
  private readonly waiting = new Set<Call>();
  private waitingOps = 0;
  private closing = false;
  /** Names this instance's record of applied calls; the count tells its calls apart. */
  private readonly idBase = randomBytes(9).toString('base64url');
  private calls = 0;
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

  /** Flushes, sends the calls waiting to be sent again one last time, and waits for every answer. */
  async close(): Promise<void> {
    this.closing = true;
    this.flush();
    const last = [...this.waiting];
    this.waiting.clear();
    this.waitingOps = 0;
    for (const call of last) {
      if (call.timer) clearTimeout(call.timer);
      this.attempt(call);
    }
    if (this.inFlight > 0) await new Promise<void>((resolve) => this.onIdle.push(resolve));
  }

  private send(ops: SettleOp[]): void {
    const record = this.opts.cluster ? `${ops[0]!.tag}:settled:${this.idBase}` : `{${this.opts.prefix}:settled}:${this.idBase}`;
    const { keys, args } = settleCall(ops, ++this.calls, record);
    this.inFlight++;
    this.attempt({ ops, keys, args, firstAt: performance.now(), tries: 0, timer: null });
  }

  private attempt(call: Call): void {
    call.tries++;
    this.opts.run('keywardSettle', call.keys, call.args).then(
      (reply) => {
        try {
          // settle.lua: {applied, then the 1-based index of each void spend slice's operation}
          const v = reply as number[];
          for (let i = 1; i < v.length; i++) {
            const op = call.ops[Number(v[i]) - 1];
            if (op?.kind === 'spendSlice') op.onVoid?.();
          }
        } finally {
          this.ended();
        }
      },
      (err: unknown) => {
        for (const owner of new Set(call.ops.map((op) => op.owner))) owner?.(err);
        if (this.resend(call, err)) return;
        this.ended();
      },
    );
  }

  /** Schedules `call` to be sent again when it may not have run and its window is open; says whether it did. */
  private resend(call: Call, err: unknown): boolean {
    const wait = Math.min(RETRY_MAX_MS, (this.opts.retryFirstMs ?? RETRY_FIRST_MS) * 2 ** (call.tries - 1));
    if (this.closing || !transient(err) || performance.now() + wait - call.firstAt > RETRY_WINDOW_MS) return false;
    for (const oldest of this.waiting) {
      if (this.waitingOps + call.ops.length <= MAX_WAITING_OPS) break;
      this.waiting.delete(oldest);
      this.waitingOps -= oldest.ops.length;
      if (oldest.timer) clearTimeout(oldest.timer);
      this.ended();
    }
    this.waiting.add(call);
    this.waitingOps += call.ops.length;
    call.timer = setTimeout(() => {
      call.timer = null;
      if (this.waiting.delete(call)) this.waitingOps -= call.ops.length;
      this.attempt(call);
    }, wait);
    call.timer.unref();
    return true;
  }

  /** A call is over: answered, or given up. */
  private ended(): void {
    if (--this.inFlight > 0) return;
    const waiting = this.onIdle;
    this.onIdle = [];
    for (const resolve of waiting) resolve();
  }
}

/**
 * The two kinds of spend hold the Redis ledger hands out (ledger.ts): one taken in Redis by
 * hold.lua, settled through the batch; one taken from this instance's spend slices, settled
 * into them (spend-slices.ts).
 */
import type { LeaseKeeper, LeaseTicket } from '../leases.js';
import { LEDGER_TTL_MS, settledNano } from '../ledger.js';
import type { Hold } from '../limiter.js';
import type { Holder } from '../../policy/holders.js';
import type { SettleBatch } from './settle-batch.js';
import type { SpendSlice, SpendSliceTable } from './spend-slices.js';

/** What a hold settles through: the ledger's keeper, slices, batch and error report. */
export interface HoldOwner {
  readonly holds: LeaseKeeper;
  readonly slices: SpendSliceTable | null;
  readonly opts: { batch: SettleBatch; onError: (op: 'settle', err: unknown) => void };
  readonly settleFailed: (err: unknown) => void;
}

/**
 * One hold taken in Redis; settling it queues settle.lua's part in the batch. Its state is in
 * ES private fields: a hold may be printed or logged, and shows nothing of its ledger.
 */
/** A hold.lua hold: its hash tag, ledger keys and holder kinds, id, amount, and its ticket with the keeper. */
type Taken = { hashTag: string; keys: string[]; kinds: Holder['kind'][]; id: string; amount: number; kept: LeaseTicket };

export class RedisHold implements Hold {
  readonly #ledger: HoldOwner;
  readonly #taken: Taken;
  #done = false;

  constructor(ledger: HoldOwner, taken: Taken) {
    this.#ledger = ledger;
    this.#taken = taken;
  }

  settle(actual: number): void {
    if (this.#done) return;
    this.#done = true;
    const { hashTag, id, keys, kinds, amount, kept } = this.#taken;
    const ledger = this.#ledger;
    try {
      ledger.holds.remove(kept);
      const cost = settledNano(actual, amount);
      // A cost past the hold adds to the live figure: this instance's next hold on these holders is exact.
      if (cost > amount) ledger.slices?.endAll(keys);
      if (amount === 0 && cost === 0) return;
      ledger.opts.batch.add({ kind: 'hold', tag: hashTag, holdId: id, cost, ttlMs: LEDGER_TTL_MS, keys, kinds, owner: ledger.settleFailed });
      // Past its hold, the cost may spend the budget: other instances learn it from Redis
      // (ledger-news.ts), so it leaves now rather than at the next tick.
      if (cost > amount) ledger.opts.batch.flush();
    } catch (err) {
      ledger.opts.onError('settle', err);
    }
  }
}

/** A hold taken from this instance's spend slices; it settles into them (spend-slices.ts). */
export class SliceHold implements Hold {
  readonly #ledger: HoldOwner;
  readonly #slices: SpendSlice[];
  readonly #amount: number;
  #done = false;

  constructor(ledger: HoldOwner, slices: SpendSlice[], amount: number) {
    this.#ledger = ledger;
    this.#slices = slices;
    this.#amount = amount;
  }

  settle(actual: number): void {
    if (this.#done) return;
    this.#done = true;
    try {
      this.#ledger.slices!.settle(this.#slices, this.#amount, settledNano(actual, this.#amount));
    } catch (err) {
      this.#ledger.opts.onError('settle', err);
    }
  }
}

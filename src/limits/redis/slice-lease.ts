/**
 * Which requests take the lease path (lease-path.ts), and the lease of a request admitted on it.
 */
import { reservedTokens, tokensBack } from '../bucket.js';
import type { LeaseKeeper, LeaseTicket } from '../leases.js';
import { type AdmitInput, capacityOf, isLimited } from '../limiter.js';
import type { RedisLease } from './api.js';
import type { SettleBatch, SettleOp } from './settle-batch.js';
import { BLOCK_SHARE, type Block, type BlockTable } from './slot-blocks.js';
import type { Slice, SliceTable } from './slices.js';

/** A request in lease terms: limited by the key's own RPM, TPM and concurrency alone (`leasable`). */
export interface LeasedAdmission {
  keyId: string;
  rpm: number;
  tpm: number;
  conc: number;
  tokens: number;
}

/** The request in lease terms when it is limited by the key's own RPM/TPM/concurrency alone, else null. */
export function leasable(input: AdmitInput): LeasedAdmission | null {
  const { route, limits } = input;
  if (isLimited(route.concurrency) || isLimited(route.rpm)) return null;
  if (isLimited(input.modelLimit?.rpm) || isLimited(input.modelLimit?.tpm)) return null;
  const rpm = capacityOf(limits.rpm);
  const tpm = capacityOf(limits.tpm);
  const conc = capacityOf(limits.concurrency);
  if (rpm === 0 && tpm === 0 && conc === 0) return null;
  // A limit too small for a block of one slot: admit.lua per request, as without leasing.
  if (conc > 0 && Math.floor(conc * BLOCK_SHARE) < 1) return null;
  return { keyId: input.keyId, rpm, tpm, conc, tokens: reservedTokens(input.tokens) };
}

/** What an admitted request holds: the slice and block it was admitted from, or its own slot. */
export interface Held {
  block?: Block;
  slice?: Slice;
  slotId?: string;
  kept?: LeaseTicket;
}

/** What a lease needs of the lease path that admitted it. */
export interface LeaseOwner {
  blocks: BlockTable;
  slices: SliceTable;
  keeper: LeaseKeeper;
  batch: SettleBatch;
  /** the settlement of `delta` on the key's buckets, and of its own slot (`slotId`) */
  settleOp(keyId: string, delta: { rpm: number; tpm: number }, caps: { rpm: number; tpm: number }, ids: { sliceId?: string; slotId?: string }): SettleOp;
}

/**
 * The lease of an admitted request: settlement and undo go into the slice it was admitted
 * from while that slice is live, else into the batch. Its slot is either one of this
 * instance's block (given back to the block) or its own (slotId). Its state is in ES private
 * fields: a lease may be printed or logged with its admission result, and shows nothing of
 * its limiter.
 */
export class SliceLease implements RedisLease {
  readonly #path: LeaseOwner;
  readonly #leased: LeasedAdmission;
  readonly #held: Held;
  #done = false;

  constructor(path: LeaseOwner, leased: LeasedAdmission, held: Held) {
    this.#path = path;
    this.#leased = leased;
    this.#held = held;
  }

  finish(usage: { tokens: number | null }): void {
    this.#close({ rpm: 0, tpm: tokensBack(this.#leased.tokens, usage) ?? 0 });
  }

  cancel(): void {
    this.#close({ rpm: 1, tpm: this.#leased.tokens });
  }

  #close(delta: { rpm: number; tpm: number }): void {
    if (this.#done) return;
    this.#done = true;
    const leased = this.#leased;
    const held = this.#held;
    const path = this.#path;
    if (leased.conc > 0) path.blocks.ended(leased.keyId, held.block ?? null);
    if (held.slotId) path.keeper.remove(held.kept ?? -1);
    // Nothing to give back or free, or all of it settled in the slice: no operation to build.
    if (!held.slotId && delta.rpm === 0 && delta.tpm === 0) return;
    if (!held.slotId && held.slice && path.slices.settle(leased.keyId, held.slice, delta)) return;
    // Owed past its reservation, in Redis: a slice of the key's bucket goes back with it, so
    // a bucket in debt admits nothing from tokens taken from it before.
    if (delta.tpm < 0) path.slices.retire(leased.keyId);
    path.batch.add(path.settleOp(leased.keyId, delta, leased, { slotId: held.slotId }));
  }
}

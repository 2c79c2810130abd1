/**
 * The admission path of a key limited by its own RPM/TPM/concurrency alone, with bucket
 * slices (slices.ts) and blocks of slots (slot-blocks.ts), lua/lease.lua: a request is
 * admitted with no round trip while this instance's slice covers it and its block has a
 * free slot, else by one lease.lua call that also gives back what is left of the old slice
 * and, far from the limits, leases a new slice and a bigger block. Keys with a per-model
 * limit or a limited route take the per-request path (redis.ts).
 */
import { CODES, WINDOW_MS } from '../bucket.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from '../leases.js';
import { type AdmitInput, type AdmitResult, type QuotaFigures, isLimited } from '../limiter.js';
import type { RedisClock } from './clock.js';
import type { RunScript } from './scripts.js';
import type { SettleBatch, SettleOp } from './settle-batch.js';
import { BLOCK_SHARE, type Block, BlockTable, KEEP_SHARE } from './slot-blocks.js';
import { REDIS_LIFETIME_FACTOR, type Slice, SliceTable } from './slices.js';

export interface LeasePathOptions {
  run: RunScript;
  batch: SettleBatch;
  /** told when a settlement call fails */
  owner: (err: unknown) => void;
  clock: RedisClock;
  sliceMs: number;
  /** the key's hash tag */
  keyTag: (keyId: string) => string;
  /** keeps per-request slots and blocks alive (redis.ts tells the path what it refreshed) */
  keeper: LeaseKeeper;
  leaseMs: number;
}

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
  const rpm = isLimited(limits.rpm) ? limits.rpm : 0;
  const tpm = isLimited(limits.tpm) ? limits.tpm : 0;
  const conc = isLimited(limits.concurrency) ? limits.concurrency : 0;
  if (rpm === 0 && tpm === 0 && conc === 0) return null;
  // A limit too small for a block of one slot: admit.lua per request, as without leasing.
  if (conc > 0 && Math.floor(conc * BLOCK_SHARE) < 1) return null;
  return { keyId: input.keyId, rpm, tpm, conc, tokens: Math.max(0, Math.ceil(input.tokens)) };
}

/** Admission reached Redis after its deadline: it changed nothing. */
export class StaleAdmissionError extends Error {}

export interface LeasePath {
  /** Admits from a live slice, with no I/O; null when no slice covers the request. Call once per request, first. */
  admitLocal(a: LeasedAdmission): AdmitResult | null;
  /** The round trip for a request admitLocal refused. Rejects when Redis fails; the caller applies onError. */
  admit(a: LeasedAdmission): Promise<AdmitResult>;
  /** Slices held now. */
  held(): number;
  /** Blocks of slots held now. */
  blocksHeld(): number;
  /** Requests in flight on slots of blocks. */
  onBlocks(): number;
  /** The keeper refreshed these lease ids (sent at sentAt, this clock); `missing`: those Redis no longer recorded. */
  refreshed(ids: string[], sentAt: number, missing: readonly string[]): void;
  /** Gives every slice and every unused slot of a block back (queued in the batch). */
  close(): void;
}

const figures = (cap: number, remaining: number): QuotaFigures | null =>
  cap > 0
    ? { limit: cap, remaining: Math.max(0, Math.floor(remaining)), resetMs: remaining >= cap ? 0 : Math.ceil(((cap - remaining) * WINDOW_MS) / cap) }
    : null;

export function createLeasePath(o: LeasePathOptions): LeasePath {
  const keysOf = (keyId: string): { tag: string; rpm: string; tpm: string; conc: string; concw: string } => {
    const tag = o.keyTag(keyId);
    return { tag, rpm: `${tag}:rpm`, tpm: `${tag}:tpm`, conc: `${tag}:conc`, concw: `${tag}:concw` };
  };
  /**
   * Adjusts the key's buckets by `rpm` and `tpm` (positive gives back), and frees the
   * request's own slot when it has one, in the next batch.
   */
  const adjust = (keyId: string, a: { rpm: number; tpm: number }, caps: { rpm: number; tpm: number }, sliceId?: string, slotId?: string): SettleOp => {
    const k = keysOf(keyId);
    return {
      kind: 'b',
      tag: k.tag,
      leaseId: slotId ?? sliceId ?? '',
      ...(sliceId ? { sliceId } : {}),
      buckets: [
        ...(caps.rpm > 0 && (sliceId || a.rpm !== 0) ? [{ key: k.rpm, cap: caps.rpm, delta: a.rpm }] : []),
        ...(caps.tpm > 0 && (sliceId || a.tpm !== 0) ? [{ key: k.tpm, cap: caps.tpm, delta: a.tpm }] : []),
      ],
      sets: slotId ? [k.conc] : [],
      owner: o.owner,
    };
  };
  /** the keeper's ticket of each block this instance keeps alive (few: one a key at most) */
  const blockTickets = new Map<string, LeaseTicket>();
  const blocks = new BlockTable({
    sliceMs: o.sliceMs,
    leaseMs: o.leaseMs,
    resize: (keyId, b, weight, dropped) => {
      // A dropped block's slots still in use stay refreshed until the last of them ends
      // (weight 0); otherwise Redis would forget them while their requests run.
      if (dropped && weight === 0) {
        o.keeper.remove(blockTickets.get(b.id) ?? -1);
        blockTickets.delete(b.id);
      }
      const k = keysOf(keyId);
      o.batch.add({ kind: 'w', tag: k.tag, set: k.conc, weights: k.concw, blockId: b.id, weight, owner: o.owner });
    },
  });
  const slices = new SliceTable({
    sliceMs: o.sliceMs,
    giveBack: (keyId, s) => o.batch.add(adjust(keyId, s.left, { rpm: s.rpmCap, tpm: s.tpmCap }, s.id)),
  });

  /**
   * The lease of an admitted request: settlement and undo go into the slice it was admitted
   * from while that slice is live, else into the batch. Its slot is either one of this
   * instance's block (given back to the block) or its own (slotId).
   */
  const leaseOf = (a: LeasedAdmission, held: { block?: Block; slice?: Slice; slotId?: string; kept?: LeaseTicket }): { finish(u: { tokens: number | null }): void; cancel(): void } => {
    let done = false;
    const caps = { rpm: a.rpm, tpm: a.tpm };
    const close = (delta: { rpm: number; tpm: number }): void => {
      if (done) return;
      done = true;
      if (a.conc > 0) blocks.ended(a.keyId, held.block ?? null);
      if (held.slotId) o.keeper.remove(held.kept ?? -1);
      // Nothing to give back or free, or all of it settled in the slice: no operation to build.
      if (!held.slotId && delta.rpm === 0 && delta.tpm === 0) return;
      if (!held.slotId && held.slice && slices.settle(a.keyId, held.slice, delta)) return;
      o.batch.add(adjust(a.keyId, delta, caps, undefined, held.slotId));
    };
    return {
      finish(usage) {
        const real = usage?.tokens;
        const known = typeof real === 'number' && Number.isFinite(real) && real !== a.tokens;
        // Reserved minus real: positive refunds, negative charges the difference.
        close({ rpm: 0, tpm: known ? a.tokens - Math.max(0, Math.ceil(real)) : 0 });
      },
      cancel: () => close({ rpm: 1, tpm: a.tokens }),
    };
  };

  const buckets = (a: LeasedAdmission): boolean => a.rpm > 0 || a.tpm > 0;
  const local = (a: LeasedAdmission, s: Slice | null, block: Block | undefined): AdmitResult => ({
    ok: true,
    lease: leaseOf(a, { block, slice: s ?? undefined }),
    quota: {
      requests: s && figures(a.rpm, s.seen.rpm - (s.granted.rpm - s.left.rpm)),
      tokens: s && figures(a.tpm, s.seen.tpm - (s.granted.tpm - s.left.tpm)),
    },
  });

  /** Admits from this instance's slice and block when both cover the request (all or nothing). */
  const take = (a: LeasedAdmission): AdmitResult | null => {
    const b = a.conc > 0 ? blocks.free(a.keyId, a.conc) : null;
    if (a.conc > 0 && !b) return null;
    const s = buckets(a) ? slices.take(a.keyId, a.rpm, a.tpm, a.tokens) : null;
    if (buckets(a) && !s) return null;
    if (b) blocks.take(a.keyId, b);
    return local(a, s, b ?? undefined);
  };

  /** Counts the request toward the key's demand and admits it locally if it can. */
  const admitLocal = (a: LeasedAdmission): AdmitResult | null => {
    if (buckets(a)) slices.note(a.keyId, a.tokens);
    if (a.conc > 0) blocks.note(a.keyId);
    return take(a);
  };

  /** The round trip, for a request admitLocal did not admit. */
  const admit = async (a: LeasedAdmission): Promise<AdmitResult> => {
    // Another request of this key is asking for a slice or a block: it may cover this one too.
    const askingSlice = buckets(a) ? slices.asking(a.keyId) : null;
    const askingBlock = a.conc > 0 ? blocks.asking(a.keyId) : null;
    if (askingSlice || askingBlock) {
      await Promise.all([askingSlice, askingBlock]);
      const res = take(a);
      if (res) return res;
    }
    const wantBlock = a.conc > 0 && !askingBlock ? blocks.want(a.keyId, a.conc) : 0;
    // A slice serves a concurrency-limited key only together with a block of its slots.
    const sliceOf = a.conc === 0 || wantBlock > 0 || blocks.current(a.keyId) !== null;
    const want = buckets(a) && !askingSlice && sliceOf ? slices.want(a.keyId, a.rpm, a.tpm) : null;
    const old = slices.detach(a.keyId);
    const k = keysOf(a.keyId);
    const id = newLeaseId();
    const slotId = a.conc > 0 ? newLeaseId() : '';
    const had = blocks.current(a.keyId);
    const blockId = had?.id ?? (wantBlock > 0 ? newLeaseId() : '');
    const sentAt = performance.now();
    o.batch.flush();
    const call = o.run('keywardLease', [k.rpm, k.tpm, k.conc, k.concw], [
      a.rpm, a.tpm, a.tokens, o.clock.deadline(),
      old?.id ?? '', old?.left.rpm ?? 0, old?.left.tpm ?? 0,
      id, want?.rpm ?? 0, want?.tpm ?? 0, o.sliceMs * REDIS_LIFETIME_FACTOR, want?.keepRpm ?? 0, want?.keepTpm ?? 0,
      a.conc, slotId, o.leaseMs, blockId, wantBlock, Math.floor(a.conc * KEEP_SHARE),
    ]) as Promise<number[]>;
    if (want) slices.track(a.keyId, call);
    if (wantBlock > 0) blocks.track(a.keyId, call);
    const v = await call;
    o.clock.learn(v[3]);
    if (v[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
    if (want && v[4] !== 1) slices.refused(a.keyId);
    if (wantBlock > 0 && v[9] !== 1) blocks.refused(a.keyId);
    if (v[0] !== 1) return { ok: false, code: CODES[(v[1] ?? 2) - 1] ?? 'rpm_exceeded', retryAfterMs: v[2] ?? 1 };
    const seen = { rpm: Number(v[5] ?? 0), tpm: Number(v[7] ?? 0) };
    if (want && v[4] === 1) {
      slices.install(a.keyId, { id, rpmCap: a.rpm, tpmCap: a.tpm, granted: { rpm: want.rpm, tpm: want.tpm }, seen }, sentAt);
    }
    let kept: LeaseTicket = -1;
    if (a.conc > 0) {
      kept = o.keeper.add(slotId, [k.conc]);
      blocks.started(a.keyId);
      const now = blocks.current(a.keyId);
      if (wantBlock > 0 && v[9] === 1) {
        // A block dropped while the call was out has its resize queued after it: Redis ends
        // up with the smaller weight, so the grant must not be used.
        if (!had || now === had) {
          blocks.granted(a.keyId, blockId, a.conc, wantBlock, sentAt);
          if (!had) blockTickets.set(blockId, o.keeper.add(blockId, [k.conc]));
        }
      } else if (blockId !== '' && Number(v[10] ?? 0) === 0) {
        blocks.lost(a.keyId, blockId);
      }
    }
    return {
      ok: true,
      lease: leaseOf(a, { slotId: slotId || undefined, kept }),
      quota: { requests: a.rpm > 0 ? { limit: a.rpm, remaining: seen.rpm, resetMs: Number(v[6] ?? 0) } : null,
        tokens: a.tpm > 0 ? { limit: a.tpm, remaining: seen.tpm, resetMs: Number(v[8] ?? 0) } : null },
    };
  };

  return {
    admit,
    admitLocal,
    held: () => slices.held(),
    blocksHeld: () => blocks.held(),
    onBlocks: () => blocks.inUse(),
    refreshed: (ids, sentAt, missing) => blocks.refreshed(ids, sentAt, missing),
    close() {
      slices.sweep(true);
      slices.stop();
      blocks.sweep(true);
      blocks.stop();
    },
  };
}

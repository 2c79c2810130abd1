/**
 * The admission path of a key limited by its own RPM/TPM/concurrency alone, with bucket
 * slices (slices.ts) and blocks of slots (slot-blocks.ts), lua/lease.lua: a request is
 * admitted with no round trip while this instance's slice covers it and its block has a
 * free slot, else by one lease.lua call that also gives back what is left of the old slice
 * and, far from the limits, leases a new slice and a bigger block. Keys with a per-model
 * limit or a limited route take the per-request path (request-path.ts).
 */
import { CODES, bucketQuota, quotaFromReply } from '../bucket.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from '../leases.js';
import { type AdmitInput, type AdmitResult, type QuotaFigures, capacityOf, isLimited } from '../limiter.js';
import { StaleAdmissionError } from './api.js';
import type { RedisClock } from './clock.js';
import type { RunScript } from './scripts.js';
import type { SettleBatch, SettleOp } from './settle-batch.js';
import { type LeaseOwner, SliceLease } from './slice-lease.js';
import { BLOCK_KEEP_SHARE, BLOCK_SHARE, type Block, BlockTable } from './slot-blocks.js';
import { REDIS_LIFETIME_FACTOR, type Slice, SliceTable, type Want } from './slices.js';

export interface LeasePathOptions {
  run: RunScript;
  batch: SettleBatch;
  /** told when a settlement call fails */
  owner: (err: unknown) => void;
  clock: RedisClock;
  sliceMs: number;
  /** the key's hash tag */
  keyTag: (keyId: string) => string;
  /** keeps per-request slots and blocks alive (limiter.ts tells the path what it refreshed) */
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
  const rpm = capacityOf(limits.rpm);
  const tpm = capacityOf(limits.tpm);
  const conc = capacityOf(limits.concurrency);
  if (rpm === 0 && tpm === 0 && conc === 0) return null;
  // A limit too small for a block of one slot: admit.lua per request, as without leasing.
  if (conc > 0 && Math.floor(conc * BLOCK_SHARE) < 1) return null;
  return { keyId: input.keyId, rpm, tpm, conc, tokens: Math.max(0, Math.ceil(input.tokens)) };
}

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

/** A bucket's figures from what is left of it; null without a limit. */
const figures = (cap: number, remaining: number): QuotaFigures | null => (cap > 0 ? bucketQuota(remaining, cap) : null);

/** The names of a key's buckets and lease set, under its hash tag. */
interface KeyNames {
  tag: string;
  rpm: string;
  tpm: string;
  conc: string;
  /** the lease set's block weights (slots.lua) */
  concw: string;
}

/** One lease.lua call: what it gives back, what it asks for, and the ids it uses. */
interface LeaseAsk {
  keys: KeyNames;
  /** the key's slice until now, given back in the call */
  old: Slice | null;
  /** the slice asked for */
  want: Want | null;
  /** the block weight asked for, 0 = none */
  wantBlock: number;
  sliceId: string;
  /** this request's own slot ('' without a concurrency limit) */
  slotId: string;
  /** the key's block, held or asked for ('' = none) */
  blockId: string;
  /** the key's block when the call was sent */
  had: Block | null;
  /** performance.now() when the call was sent */
  sentAt: number;
}

export function createLeasePath(o: LeasePathOptions): LeasePath {
  return new SlicedPath(o);
}

class SlicedPath implements LeasePath, LeaseOwner {
  readonly blocks: BlockTable;
  readonly slices: SliceTable;
  readonly keeper: LeaseKeeper;
  readonly batch: SettleBatch;
  /** the keeper's ticket of each block this instance keeps alive (few: one a key at most) */
  private readonly blockTickets = new Map<string, LeaseTicket>();

  constructor(private readonly o: LeasePathOptions) {
    this.keeper = o.keeper;
    this.batch = o.batch;
    this.blocks = new BlockTable({ sliceMs: o.sliceMs, leaseMs: o.leaseMs, resize: (keyId, b, weight, dropped) => this.resized(keyId, b, weight, dropped) });
    this.slices = new SliceTable({
      sliceMs: o.sliceMs,
      giveBack: (keyId, s) => this.batch.add(this.settleOp(keyId, s.left, { rpm: s.rpmCap, tpm: s.tpmCap }, { sliceId: s.id })),
    });
  }

  /** Counts the request toward the key's demand and admits it locally if it can. */
  admitLocal(a: LeasedAdmission): AdmitResult | null {
    if (hasBuckets(a)) this.slices.note(a.keyId, a.tokens);
    if (a.conc > 0) this.blocks.note(a.keyId);
    return this.take(a);
  }

  /** The round trip, for a request admitLocal did not admit. */
  async admit(a: LeasedAdmission): Promise<AdmitResult> {
    // Another request of this key is asking for a slice or a block: it may cover this one too.
    const askingSlice = hasBuckets(a) ? this.slices.asking(a.keyId) : null;
    const askingBlock = a.conc > 0 ? this.blocks.asking(a.keyId) : null;
    if (askingSlice || askingBlock) {
      await Promise.all([askingSlice, askingBlock]);
      const res = this.take(a);
      if (res) return res;
    }
    const ask = this.prepare(a, askingSlice !== null, askingBlock !== null);
    const reply = await this.send(a, ask);
    return this.answer(a, ask, reply);
  }

  held(): number {
    return this.slices.held();
  }

  blocksHeld(): number {
    return this.blocks.held();
  }

  onBlocks(): number {
    return this.blocks.inUse();
  }

  refreshed(ids: string[], sentAt: number, missing: readonly string[]): void {
    this.blocks.refreshed(ids, sentAt, missing);
  }

  close(): void {
    this.slices.sweep(true);
    this.slices.stop();
    this.blocks.sweep(true);
    this.blocks.stop();
  }

  /**
   * The settlement that adjusts the key's buckets by `delta` (positive gives back) and frees
   * the request's own slot when it has one (`slotId`); `sliceId` when a slice is returned.
   */
  settleOp(keyId: string, delta: { rpm: number; tpm: number }, caps: { rpm: number; tpm: number }, ids: { sliceId?: string; slotId?: string }): SettleOp {
    const k = keyNames(this.o.keyTag(keyId));
    const { sliceId, slotId } = ids;
    return {
      kind: 'b',
      tag: k.tag,
      leaseId: slotId ?? sliceId ?? '',
      ...(sliceId ? { sliceId } : {}),
      buckets: [
        ...(caps.rpm > 0 && (sliceId || delta.rpm !== 0) ? [{ key: k.rpm, cap: caps.rpm, delta: delta.rpm }] : []),
        ...(caps.tpm > 0 && (sliceId || delta.tpm !== 0) ? [{ key: k.tpm, cap: caps.tpm, delta: delta.tpm }] : []),
      ],
      sets: slotId ? [k.conc] : [],
      owner: this.o.owner,
    };
  }

  private resized(keyId: string, b: Block, weight: number, dropped: boolean): void {
    // A dropped block's slots still in use stay refreshed until the last of them ends
    // (weight 0); otherwise Redis would forget them while their requests run.
    if (dropped && weight === 0) {
      this.keeper.remove(this.blockTickets.get(b.id) ?? -1);
      this.blockTickets.delete(b.id);
    }
    const k = keyNames(this.o.keyTag(keyId));
    this.batch.add({ kind: 'w', tag: k.tag, set: k.conc, weights: k.concw, blockId: b.id, weight, owner: this.o.owner });
  }

  /** Admits from this instance's slice and block when both cover the request (all or nothing). */
  private take(a: LeasedAdmission): AdmitResult | null {
    const b = a.conc > 0 ? this.blocks.free(a.keyId, a.conc) : null;
    if (a.conc > 0 && !b) return null;
    const s = hasBuckets(a) ? this.slices.take(a.keyId, a.rpm, a.tpm, a.tokens) : null;
    if (hasBuckets(a) && !s) return null;
    if (b) this.blocks.take(a.keyId, b);
    return {
      ok: true,
      lease: new SliceLease(this, a, { block: b ?? undefined, slice: s ?? undefined }),
      quota: {
        requests: s && figures(a.rpm, s.seen.rpm - (s.granted.rpm - s.left.rpm)),
        tokens: s && figures(a.tpm, s.seen.tpm - (s.granted.tpm - s.left.tpm)),
      },
    };
  }

  /** What the lease call gives back and asks for; `askingSlice`/`askingBlock`: another request of the key already asks. */
  private prepare(a: LeasedAdmission, askingSlice: boolean, askingBlock: boolean): LeaseAsk {
    const wantBlock = a.conc > 0 && !askingBlock ? this.blocks.want(a.keyId, a.conc) : 0;
    // A slice serves a concurrency-limited key only together with a block of its slots.
    const sliceOf = a.conc === 0 || wantBlock > 0 || this.blocks.current(a.keyId) !== null;
    const want = hasBuckets(a) && !askingSlice && sliceOf ? this.slices.want(a.keyId, a.rpm, a.tpm) : null;
    const old = this.slices.detach(a.keyId);
    const keys = keyNames(this.o.keyTag(a.keyId));
    const sliceId = newLeaseId();
    const slotId = a.conc > 0 ? newLeaseId() : '';
    const had = this.blocks.current(a.keyId);
    const blockId = had?.id ?? (wantBlock > 0 ? newLeaseId() : '');
    return { keys, old, want, wantBlock, sliceId, slotId, blockId, had, sentAt: performance.now() };
  }

  /** Sends lease.lua (see its header for ARGV), after the queued settlements. */
  private send(a: LeasedAdmission, q: LeaseAsk): Promise<number[]> {
    const { keys: k, old, want } = q;
    this.batch.flush();
    const call = this.o.run('keywardLease', [k.rpm, k.tpm, k.conc, k.concw], [
      a.rpm, a.tpm, a.tokens, this.o.clock.deadline(),
      old?.id ?? '', old?.left.rpm ?? 0, old?.left.tpm ?? 0,
      q.sliceId, want?.rpm ?? 0, want?.tpm ?? 0, this.o.sliceMs * REDIS_LIFETIME_FACTOR, want?.keepRpm ?? 0, want?.keepTpm ?? 0,
      a.conc, q.slotId, this.o.leaseMs, q.blockId, q.wantBlock, Math.floor(a.conc * BLOCK_KEEP_SHARE),
    ]) as Promise<number[]>;
    if (want) this.slices.track(a.keyId, call);
    if (q.wantBlock > 0) this.blocks.track(a.keyId, call);
    return call;
  }

  /**
   * The admission from lease.lua's reply: {admitted (1, 0 denied, -1 stale), code, wait, now,
   * slice granted, rpm remaining, rpm reset, tpm remaining, tpm reset, block granted, block weight}.
   */
  private answer(a: LeasedAdmission, q: LeaseAsk, v: number[]): AdmitResult {
    this.o.clock.learn(v[3]);
    if (v[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
    if (q.want && v[4] !== 1) this.slices.refused(a.keyId);
    if (q.wantBlock > 0 && v[9] !== 1) this.blocks.refused(a.keyId);
    if (v[0] !== 1) return { ok: false, code: CODES[(v[1] ?? 2) - 1] ?? 'rpm_exceeded', retryAfterMs: v[2] ?? 1 };
    if (q.want && v[4] === 1) {
      const seen = { rpm: Number(v[5] ?? 0), tpm: Number(v[7] ?? 0) };
      this.slices.install(a.keyId, { id: q.sliceId, rpmCap: a.rpm, tpmCap: a.tpm, granted: { rpm: q.want.rpm, tpm: q.want.tpm }, seen }, q.sentAt);
    }
    const kept = a.conc > 0 ? this.startSlot(a, q, v) : -1;
    return { ok: true, lease: new SliceLease(this, a, { slotId: q.slotId || undefined, kept }), quota: quotaFromReply(a.rpm, a.tpm, v.slice(5)) };
  }

  /** Keeps the request's own slot alive, and takes the key's block as Redis left it. */
  private startSlot(a: LeasedAdmission, q: LeaseAsk, v: number[]): LeaseTicket {
    const kept = this.keeper.add(q.slotId, [q.keys.conc]);
    this.blocks.started(a.keyId);
    const now = this.blocks.current(a.keyId);
    if (q.wantBlock > 0 && v[9] === 1) {
      // A block dropped while the call was out has its resize queued after it: Redis ends
      // up with the smaller weight, so the grant must not be used.
      if (!q.had || now === q.had) {
        this.blocks.granted(a.keyId, q.blockId, a.conc, q.wantBlock, q.sentAt);
        if (!q.had) this.blockTickets.set(q.blockId, this.keeper.add(q.blockId, [q.keys.conc]));
      }
    } else if (q.blockId !== '' && Number(v[10] ?? 0) === 0) {
      this.blocks.lost(a.keyId, q.blockId);
    }
    return kept;
  }
}

const hasBuckets = (a: LeasedAdmission): boolean => a.rpm > 0 || a.tpm > 0;

const keyNames = (tag: string): KeyNames => ({ tag, rpm: `${tag}:rpm`, tpm: `${tag}:tpm`, conc: `${tag}:conc`, concw: `${tag}:concw` });

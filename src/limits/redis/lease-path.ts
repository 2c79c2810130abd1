/**
 * The admission path of a key limited by its own RPM/TPM/concurrency alone, with bucket
 * slices (slices.ts) and blocks of slots (slot-blocks.ts), lua/lease.lua: a request is
 * admitted with no round trip while this instance's slice covers it and its block has a
 * free slot, else by one lease.lua call that also gives back what is left of the old slice
 * and, far from the limits, leases a new slice and a bigger block. Keys with a per-model
 * limit or a limited route take the per-request path (request-path.ts).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { bucketQuota, quotaFromReply } from '../bucket.js';
import type { LeaseTerm } from '../lease-term.js';
import { type LeaseKeeper, type LeaseTicket, newLeaseId } from '../leases.js';
import type { AdmitResult, QuotaFigures } from '../limiter.js';
import { StaleAdmissionError } from './api.js';
import type { RedisClock } from './clock.js';
import { keyNames, type LeaseAsk, slicesInTheWay } from './lease-call.js';
import { LEDGER_NEWS_CHANNEL, SLICE_RETRY_MS } from './ledger-news.js';
import { knownOutcome, leaseRefusal } from './replies.js';
import type { RunScript } from './scripts.js';
import type { SettleBatch, SettleOp } from './settle-batch.js';
import { type LeasedAdmission, type LeaseOwner, SliceLease } from './slice-lease.js';
import { BLOCK_KEEP_SHARE, type Block, BlockTable } from './slot-blocks.js';
import { REDIS_LIFETIME_FACTOR, SliceTable } from './slices.js';

export type { LeasedAdmission };

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
  /** a slot's and a block's lifetime without a refresh */
  term: LeaseTerm;
}

export interface LeasePath {
  /** Admits from a live slice, with no I/O; null when no slice covers the request. Call once per request, first. */
  admitLocal(leased: LeasedAdmission): AdmitResult | null;
  /** The round trip for a request admitLocal refused. Rejects when Redis fails; the caller applies onError. */
  admit(leased: LeasedAdmission): Promise<AdmitResult>;
  /** Slices held now. */
  held(): number;
  /** Blocks of slots held now. */
  blocksHeld(): number;
  /** Requests in flight on slots of blocks. */
  onBlocks(): number;
  /** The keeper refreshed these lease ids (sent at sentAt, this clock); `missing`: those Redis no longer recorded. */
  refreshed(ids: string[], sentAt: number, missing: readonly string[]): void;
  /** Another instance was refused for the slices out on this bucket (its key): this instance's goes back now. */
  bucketNews(bucketKey: string): void;
  /** Gives every slice and every unused slot of a block back (queued in the batch). */
  close(): void;
}

/** A bucket's figures from what is left of it; null without a limit. */
const figures = (cap: number, remaining: number): QuotaFigures | null => (cap > 0 ? bucketQuota(remaining, cap) : null);

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

  constructor(private readonly opts: LeasePathOptions) {
    const { sliceMs, term } = opts;
    this.keeper = opts.keeper;
    this.batch = opts.batch;
    this.blocks = new BlockTable({ sliceMs, term, resize: (keyId, block, weight, dropped) => this.resized(keyId, block, weight, dropped) });
    this.slices = new SliceTable({
      sliceMs,
      giveBack: (keyId, slice) => this.batch.add(this.settleOp(keyId, slice.left, { rpm: slice.rpmCap, tpm: slice.tpmCap }, { sliceId: slice.id })),
    });
  }

  /** Counts the request toward the key's demand and admits it locally if it can. */
  admitLocal(leased: LeasedAdmission): AdmitResult | null {
    if (hasBuckets(leased)) this.slices.note(leased.keyId, leased.tokens);
    if (leased.conc > 0) this.blocks.note(leased.keyId);
    return this.take(leased);
  }

  /** The round trip, for a request admitLocal did not admit. */
  async admit(leased: LeasedAdmission): Promise<AdmitResult> {
    // Another request of this key is asking for a slice or a block: it may cover this one too.
    const askingSlice = hasBuckets(leased) ? this.slices.asking(leased.keyId) : null;
    const askingBlock = leased.conc > 0 ? this.blocks.asking(leased.keyId) : null;
    if (askingSlice || askingBlock) {
      await Promise.all([askingSlice, askingBlock]);
      const res = this.take(leased);
      if (res) return res;
    }
    let ask = this.prepare(leased, askingSlice !== null, askingBlock !== null);
    let reply = await this.send(leased, ask);
    for (let i = 0; i < SLICE_RETRY_MS.length && slicesInTheWay(reply); i++) {
      // Not the last word: only what the refusal tells the tables counts.
      this.answer(leased, ask, reply);
      await sleep(SLICE_RETRY_MS[i]!);
      // Asks for no new slice or block: near the limit Redis grants none.
      ask = this.prepare(leased, true, true);
      reply = await this.send(leased, ask);
    }
    return this.answer(leased, ask, reply);
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

  bucketNews(bucketKey: string): void {
    for (const keyId of this.slices.holding()) {
      const names = keyNames(this.opts.keyTag(keyId));
      if (names.rpm !== bucketKey && names.tpm !== bucketKey) continue;
      this.slices.retire(keyId);
      this.batch.flush();
      return;
    }
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
    const names = keyNames(this.opts.keyTag(keyId));
    const { sliceId, slotId } = ids;
    return {
      kind: 'buckets',
      tag: names.tag,
      leaseId: slotId ?? sliceId ?? '',
      ...(sliceId ? { sliceId } : {}),
      buckets: [
        ...(caps.rpm > 0 && (sliceId || delta.rpm !== 0) ? [{ key: names.rpm, cap: caps.rpm, delta: delta.rpm }] : []),
        ...(caps.tpm > 0 && (sliceId || delta.tpm !== 0) ? [{ key: names.tpm, cap: caps.tpm, delta: delta.tpm }] : []),
      ],
      sets: slotId ? [names.conc] : [],
      owner: this.opts.owner,
    };
  }

  private resized(keyId: string, block: Block, weight: number, dropped: boolean): void {
    // A dropped block's slots still in use stay refreshed until the last of them ends
    // (weight 0); otherwise Redis would forget them while their requests run.
    if (dropped && weight === 0) {
      this.keeper.remove(this.blockTickets.get(block.id) ?? -1);
      this.blockTickets.delete(block.id);
    }
    const names = keyNames(this.opts.keyTag(keyId));
    this.batch.add({ kind: 'blockWeight', tag: names.tag, set: names.conc, blockId: block.id, weight, owner: this.opts.owner });
  }

  /** Admits from this instance's slice and block when both cover the request (all or nothing). */
  private take(leased: LeasedAdmission): AdmitResult | null {
    const block = leased.conc > 0 ? this.blocks.free(leased.keyId, leased.conc) : null;
    if (leased.conc > 0 && !block) return null;
    const slice = hasBuckets(leased) ? this.slices.take(leased.keyId, leased.rpm, leased.tpm, leased.tokens) : null;
    if (hasBuckets(leased) && !slice) return null;
    if (block) this.blocks.take(leased.keyId, block);
    return {
      ok: true,
      lease: new SliceLease(this, leased, { block: block ?? undefined, slice: slice ?? undefined }),
      quota: {
        requests: slice && figures(leased.rpm, slice.seen.rpm - (slice.granted.rpm - slice.left.rpm)),
        tokens: slice && figures(leased.tpm, slice.seen.tpm - (slice.granted.tpm - slice.left.tpm)),
      },
    };
  }

  /** What the lease call gives back and asks for; `askingSlice`/`askingBlock`: another request of the key already asks. */
  private prepare(leased: LeasedAdmission, askingSlice: boolean, askingBlock: boolean): LeaseAsk {
    const wantBlock = leased.conc > 0 && !askingBlock ? this.blocks.want(leased.keyId, leased.conc) : 0;
    // A slice serves a concurrency-limited key only together with a block of its slots.
    const withBlock = leased.conc === 0 || wantBlock > 0 || this.blocks.current(leased.keyId) !== null;
    const want = hasBuckets(leased) && !askingSlice && withBlock ? this.slices.want(leased.keyId, leased.rpm, leased.tpm) : null;
    const old = this.slices.detach(leased.keyId);
    const keys = keyNames(this.opts.keyTag(leased.keyId));
    const sliceId = newLeaseId();
    const slotId = leased.conc > 0 ? newLeaseId() : '';
    const had = this.blocks.current(leased.keyId);
    const blockId = had?.id ?? (wantBlock > 0 ? newLeaseId() : '');
    return { keys, old, want, wantBlock, sliceId, slotId, blockId, had, sentAt: performance.now() };
  }

  /** Sends lease.lua (see its header for ARGV), after the queued settlements. */
  private send(leased: LeasedAdmission, ask: LeaseAsk): Promise<number[]> {
    const { keys: names, old, want } = ask;
    this.batch.flush();
    const call = this.opts.run('keywardLease', [names.rpm, names.tpm, names.conc, names.concw], [
      leased.rpm, leased.tpm, leased.tokens, this.opts.clock.deadline(),
      old?.id ?? '', old?.left.rpm ?? 0, old?.left.tpm ?? 0,
      ask.sliceId, want?.rpm ?? 0, want?.tpm ?? 0, this.opts.sliceMs * REDIS_LIFETIME_FACTOR, want?.keepRpm ?? 0, want?.keepTpm ?? 0,
      leased.conc, ask.slotId, this.opts.term.ms, ask.blockId, ask.wantBlock, Math.floor(leased.conc * BLOCK_KEEP_SHARE),
      LEDGER_NEWS_CHANNEL,
    ], (answer) => this.undoLate(leased, ask, answer)) as Promise<number[]>;
    if (want) this.slices.track(leased.keyId, call);
    if (ask.wantBlock > 0) this.blocks.track(leased.keyId, call);
    return call;
  }

  /**
   * An admission Redis granted whose reply came after the call's deadline: its slot and
   * tokens, a new slice and a new block go back now, as nobody will use or finish them. A
   * grown existing block is left as Redis has it: a later call may have resized it since,
   * and the next shrink of an idle block brings it back (it errs towards refusing).
   */
  private undoLate(leased: LeasedAdmission, ask: LeaseAsk, answer: unknown): void {
    if (!Array.isArray(answer) || Number(answer[0]) !== 1) return;
    this.batch.add(this.settleOp(leased.keyId, { rpm: 1, tpm: leased.tokens }, leased, { slotId: ask.slotId || undefined }));
    if (ask.want && Number(answer[4]) === 1) this.batch.add(this.settleOp(leased.keyId, { rpm: ask.want.rpm, tpm: ask.want.tpm }, leased, { sliceId: ask.sliceId }));
    if (ask.wantBlock > 0 && !ask.had && Number(answer[9]) === 1) this.batch.add({ kind: 'blockWeight', tag: ask.keys.tag, set: ask.keys.conc, blockId: ask.blockId, weight: 0, owner: this.opts.owner });
  }

  /**
   * The admission from lease.lua's reply: {admitted (1, 0 denied, -1 stale), code, wait, now,
   * slice granted, rpm remaining, rpm reset, tpm remaining, tpm reset, block granted, block weight}.
   */
  private answer(leased: LeasedAdmission, ask: LeaseAsk, answered: unknown): AdmitResult {
    const reply = knownOutcome('lease.lua', answered, [1, 0, -1]);
    this.opts.clock.learn(reply[3]);
    if (reply[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
    const refused = reply[0] === 0 ? leaseRefusal(reply, leased) : null;
    if (ask.want && reply[4] !== 1) this.slices.refused(leased.keyId);
    if (ask.wantBlock > 0 && reply[9] !== 1) this.blocks.refused(leased.keyId);
    if (refused) return refused;
    if (ask.want && reply[4] === 1) {
      const seen = { rpm: Number(reply[5] ?? 0), tpm: Number(reply[7] ?? 0) };
      this.slices.install(leased.keyId, { id: ask.sliceId, rpmCap: leased.rpm, tpmCap: leased.tpm, granted: { rpm: ask.want.rpm, tpm: ask.want.tpm }, seen }, ask.sentAt);
    }
    const kept = leased.conc > 0 ? this.startSlot(leased, ask, reply) : -1;
    return { ok: true, lease: new SliceLease(this, leased, { slotId: ask.slotId || undefined, kept }), quota: quotaFromReply(leased.rpm, leased.tpm, reply.slice(5)) };
  }

  /** Keeps the request's own slot alive, and takes the key's block as Redis left it. */
  private startSlot(leased: LeasedAdmission, ask: LeaseAsk, reply: number[]): LeaseTicket {
    const kept = this.keeper.add(ask.slotId, [ask.keys.conc]);
    this.blocks.started(leased.keyId);
    const current = this.blocks.current(leased.keyId);
    if (ask.wantBlock > 0 && reply[9] === 1) {
      // A block dropped while the call was out has its resize queued after it: Redis ends
      // up with the smaller weight, so the grant must not be used.
      if (!ask.had || current === ask.had) {
        this.blocks.granted(leased.keyId, ask.blockId, leased.conc, ask.wantBlock, ask.sentAt);
        if (!ask.had) this.blockTickets.set(ask.blockId, this.keeper.add(ask.blockId, [ask.keys.conc]));
      }
    } else if (ask.blockId !== '' && Number(reply[10] ?? 0) === 0) {
      this.blocks.lost(leased.keyId, ask.blockId);
    }
    return kept;
  }
}

const hasBuckets = (leased: LeasedAdmission): boolean => leased.rpm > 0 || leased.tpm > 0;

/**
 * The admission path of a key limited by its own RPM/TPM alone, with bucket slices
 * (slices.ts, lua/lease.lua): a request is admitted from this instance's slice with no
 * round trip while one covers it, else by one lease.lua call that also gives back what is
 * left of the old slice and, far from the limit, leases a new one. Keys with a concurrency
 * limit, a per-model limit or a limited route take the per-request path (redis.ts).
 */
import { CODES, WINDOW_MS } from './bucket.js';
import { newLeaseId } from './leases.js';
import { type AdmitInput, type AdmitResult, type QuotaFigures, isLimited } from './limiter.js';
import type { RedisClock } from './redis-clock.js';
import type { RunScript } from './scripts.js';
import type { SettleBatch, SettleOp } from './settle-batch.js';
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
}

export interface LeasedAdmission {
  keyId: string;
  rpm: number;
  tpm: number;
  tokens: number;
}

/** The request in slice terms when it is limited by the key's own RPM/TPM alone, else null. */
export function leasable(input: AdmitInput): LeasedAdmission | null {
  const { route, limits } = input;
  if (isLimited(route.concurrency) || isLimited(route.rpm) || isLimited(limits.concurrency)) return null;
  if (isLimited(input.modelLimit?.rpm) || isLimited(input.modelLimit?.tpm)) return null;
  const rpm = isLimited(limits.rpm) ? limits.rpm : 0;
  const tpm = isLimited(limits.tpm) ? limits.tpm : 0;
  if (rpm === 0 && tpm === 0) return null;
  return { keyId: input.keyId, rpm, tpm, tokens: Math.max(0, Math.ceil(input.tokens)) };
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
  /** Gives every slice back (queued in the batch). */
  close(): void;
}

const figures = (cap: number, remaining: number): QuotaFigures | null =>
  cap > 0
    ? { limit: cap, remaining: Math.max(0, Math.floor(remaining)), resetMs: remaining >= cap ? 0 : Math.ceil(((cap - remaining) * WINDOW_MS) / cap) }
    : null;

export function createLeasePath(o: LeasePathOptions): LeasePath {
  const keysOf = (keyId: string): { tag: string; rpm: string; tpm: string } => {
    const tag = o.keyTag(keyId);
    return { tag, rpm: `${tag}:rpm`, tpm: `${tag}:tpm` };
  };
  /** Adjusts the key's buckets by `rpm` and `tpm` (positive gives back), in the next batch. */
  const adjust = (keyId: string, a: { rpm: number; tpm: number }, caps: { rpm: number; tpm: number }, sliceId?: string): SettleOp => {
    const k = keysOf(keyId);
    return {
      kind: 'b',
      tag: k.tag,
      leaseId: sliceId ?? '',
      ...(sliceId ? { sliceId } : {}),
      buckets: [
        ...(caps.rpm > 0 && (sliceId || a.rpm !== 0) ? [{ key: k.rpm, cap: caps.rpm, delta: a.rpm }] : []),
        ...(caps.tpm > 0 && (sliceId || a.tpm !== 0) ? [{ key: k.tpm, cap: caps.tpm, delta: a.tpm }] : []),
      ],
      sets: [],
      owner: o.owner,
    };
  };
  const slices = new SliceTable({
    sliceMs: o.sliceMs,
    giveBack: (keyId, s) => o.batch.add(adjust(keyId, s.left, { rpm: s.rpmCap, tpm: s.tpmCap }, s.id)),
  });

  /** The lease of an admitted request: settlement and undo go into the batch. */
  const leaseOf = (a: LeasedAdmission): { finish(u: { tokens: number | null }): void; cancel(): void } => {
    let done = false;
    const caps = { rpm: a.rpm, tpm: a.tpm };
    const close = (delta: { rpm: number; tpm: number }): void => {
      if (done) return;
      done = true;
      o.batch.add(adjust(a.keyId, delta, caps));
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

  const local = (a: LeasedAdmission, s: Slice): AdmitResult => ({
    ok: true,
    lease: leaseOf(a),
    quota: {
      requests: figures(a.rpm, s.seen.rpm - (s.granted.rpm - s.left.rpm)),
      tokens: figures(a.tpm, s.seen.tpm - (s.granted.tpm - s.left.tpm)),
    },
  });

  /** Counts the request toward the key's demand and admits it from a slice if one covers it. */
  const admitLocal = (a: LeasedAdmission): AdmitResult | null => {
    slices.note(a.keyId, a.tokens);
    const s = slices.take(a.keyId, a.rpm, a.tpm, a.tokens);
    return s ? local(a, s) : null;
  };

  /** The round trip, for a request admitLocal did not admit. */
  const admit = async (a: LeasedAdmission): Promise<AdmitResult> => {
    let s: Slice | null;
    // Another request of this key is asking for a slice: it may cover this one too.
    const asking = slices.asking(a.keyId);
    if (asking) {
      await asking;
      s = slices.take(a.keyId, a.rpm, a.tpm, a.tokens);
      if (s) return local(a, s);
    }
    const want = asking ? null : slices.want(a.keyId, a.rpm, a.tpm);
    const old = slices.detach(a.keyId);
    const k = keysOf(a.keyId);
    const id = newLeaseId();
    const sentAt = performance.now();
    o.batch.flush();
    const call = o.run('keywardLease', [k.rpm, k.tpm], [
      a.rpm, a.tpm, a.tokens, o.clock.deadline(),
      old?.id ?? '', old?.left.rpm ?? 0, old?.left.tpm ?? 0,
      id, want?.rpm ?? 0, want?.tpm ?? 0, o.sliceMs * REDIS_LIFETIME_FACTOR, want?.keepRpm ?? 0, want?.keepTpm ?? 0,
    ]) as Promise<number[]>;
    if (want) slices.track(a.keyId, call);
    const v = await call;
    o.clock.learn(v[3]);
    if (v[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
    if (want && v[4] !== 1) slices.refused(a.keyId);
    if (v[0] !== 1) return { ok: false, code: CODES[(v[1] ?? 2) - 1] ?? 'rpm_exceeded', retryAfterMs: v[2] ?? 1 };
    const seen = { rpm: Number(v[5] ?? 0), tpm: Number(v[7] ?? 0) };
    if (want && v[4] === 1) {
      slices.install(a.keyId, { id, rpmCap: a.rpm, tpmCap: a.tpm, granted: { rpm: want.rpm, tpm: want.tpm }, seen }, sentAt);
    }
    return {
      ok: true,
      lease: leaseOf(a),
      quota: { requests: a.rpm > 0 ? { limit: a.rpm, remaining: seen.rpm, resetMs: Number(v[6] ?? 0) } : null,
        tokens: a.tpm > 0 ? { limit: a.tpm, remaining: seen.tpm, resetMs: Number(v[8] ?? 0) } : null },
    };
  };

  return {
    admit,
    admitLocal,
    held: () => slices.held(),
    close() {
      slices.sweep(true);
      slices.stop();
    },
  };
}

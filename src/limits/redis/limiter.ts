/**
 * Shared limiter on Redis (single node or Cluster). Admission is at most one round trip;
 * settlements leave in one batched call per tick (settle-batch.ts); a key limited by its own
 * RPM/TPM/concurrency alone may be admitted from a slice leased to this instance, with no round trip at
 * all, its concurrency slots taken from a block of slots leased the same way (redis-lease.ts,
 * `lease`). Time comes from Redis TIME inside the scripts, so instance clocks never matter.
 *
 * Key layout: everything of one API key under one hash tag, `{<prefix>:k:<keyId>}:rpm|tpm|conc`,
 * its per-model buckets `{<prefix>:k:<keyId>}:m:<pattern>:rpm|tpm`; an upstream's capacity
 * under its own tag, `{<prefix>:r:<route>}:rpm|conc`. Spend holds: see ledger-redis.ts.
 *
 * Why admission stays one round trip: a Lua script may only touch keys of one slot in a
 * Cluster, and a route's keys and a key's keys live in different slots (often on different
 * nodes), so no single script can check both atomically there.
 *  - Standalone Redis has no slots: one admit.lua call gets both groups of keys and checks
 *    route, RPM, TPM, concurrency in order before writing anything. Exact, nothing consumed
 *    on any denial.
 *  - Cluster, when both the route and the key are limited: admit.lua runs once per hash tag,
 *    both calls sent at the same time (one round trip of latency). Each call is itself
 *    all-or-nothing. When one side admits and the other denies, the admitted side is undone
 *    with settle.lua (its RPM token and TPM reservation given back, its slot freed); that
 *    extra trip happens only on the denial path. The cost: for the moment between the two
 *    calls and the undo, the undone reservation is visible to concurrent requests, which
 *    may see one slot or token fewer than they would have. When only the route or only the
 *    key is limited (the common case) there is a single call and no such window.
 */
import { CODES, DEFAULT_LEASE_MS, quotaOf } from '../bucket.js';
import { createLeaseKeeper, newLeaseId } from '../leases.js';
import { createRedisLedger } from './ledger.js';
import { type AdmitInput, type AdmitResult, NO_QUOTA, hasAnyLimit, isLimited } from '../limiter.js';
import { createRedisClock } from './clock.js';
import { StaleAdmissionError, createLeasePath, leasable } from './lease-path.js';
import { type RedisLease, type RedisLimiter, type RedisLimiterOptions, errorTags, failedHashTags, hashTag } from './api.js';
import { atTurnEnd, scriptRunner } from './scripts.js';
import { type SettleOp, settleBatchOf } from './settle-batch.js';

export { StaleAdmissionError, failedHashTags, hashTag };
export type { RedisLease, RedisLimiter, RedisLimiterOptions };

/** Settlements of one tick leave together (settle-batch.ts). */
export const DEFAULT_SETTLE_EVERY_MS = 5;

const NOOP_LEASE: RedisLease = { finish: () => undefined, cancel: () => undefined };

/** Lua's unpack is bounded by the C stack; refresh long lists in chunks. */
const REFRESH_CHUNK = 1000;

/** A group of writes inside one hash tag, as settle.lua takes them. */
interface Part {
  tag: string;
  buckets: { key: string; cap: number; delta: number }[];
  sets: string[];
}

export function createRedisLimiter(opts: RedisLimiterOptions): RedisLimiter {
  const client = opts.redis;
  const leaseMs = opts.leaseMs ?? DEFAULT_LEASE_MS;
  const cluster = client.isCluster;
  let redisErrors = 0;
  const run = scriptRunner(client);

  const failed = (op: 'admit' | 'settle' | 'refresh' | 'hold' | 'peek', err: unknown): void => {
    redisErrors++;
    opts.onError?.(op, err);
  };

  const keeper = createLeaseKeeper({
    everyMs: opts.refreshEveryMs ?? Math.floor(leaseMs / 3),
    refresh: async (setKey, ids) => {
      for (let i = 0; i < ids.length; i += REFRESH_CHUNK) {
        const chunk = ids.slice(i, i + REFRESH_CHUNK);
        const sentAt = performance.now();
        // The set's block weights (slots.lua) live as long as the set.
        const missing = (await run('keywardRefresh', [setKey, `${setKey}w`], [leaseMs, ...chunk])) as string[];
        sliced?.refreshed(chunk, sentAt, missing);
      }
    },
    onError: (err) => failed('refresh', err),
  });

  const clock = createRedisClock(opts.staleAfterMs);
  const tag = (kind: 'k' | 'r', id: string): string => hashTag(opts.prefix, kind, id);
  const batch = settleBatchOf(client, { run, cluster, everyMs: opts.settleEveryMs ?? DEFAULT_SETTLE_EVERY_MS });
  const owner = (err: unknown): void => failed('settle', err);
  // Every call this instance makes is preceded by the settlements it has queued (settle-batch.ts).
  const send: typeof run = (name, keys, args) => {
    batch.flush();
    return run(name, keys, args);
  };

  const money = createRedisLedger({
    run: send,
    batch,
    prefix: opts.prefix,
    leaseMs,
    refreshEveryMs: opts.refreshEveryMs ?? Math.floor(leaseMs / 3),
    onError: (op, err) => failed(op, err),
    clock,
    atTurnEnd: (fn) => atTurnEnd(client, fn),
    cluster,
  });

  const sliced = opts.lease
    ? createLeasePath({ run: send, batch, owner, clock, sliceMs: opts.lease.sliceMs, keyTag: (id) => tag('k', id), keeper, leaseMs })
    : null;
  /** Requests admitNow counted and found no slice for; admit goes straight to Redis with them. */
  const triedNow = new WeakSet<AdmitInput>();
  /** Queues the parts' writes for the next batch. */
  const settle = (leaseId: string, parts: Part[]): void => {
    for (const p of parts) batch.add({ kind: 'b', tag: p.tag, leaseId, buckets: p.buckets, sets: p.sets, owner } satisfies SettleOp);
  };

  /** Slots of requests in flight: their own leases and slots of blocks (a block's lease is not a request's). */
  const slotsHeld = (): number => keeper.count() - (sliced ? sliced.blocksHeld() - sliced.onBlocks() : 0);

  const admitNow = (input: AdmitInput): AdmitResult | null => {
    const l = sliced && leasable(input);
    if (!l) return null;
    const res = sliced.admitLocal(l);
    if (!res) triedNow.add(input);
    return res;
  };

  const admit = async (input: AdmitInput): Promise<AdmitResult> => {
    const l = sliced && leasable(input);
    if (l) {
      const res = triedNow.has(input) ? null : sliced.admitLocal(l);
      if (res) return res;
      try {
        return await sliced.admit(l);
      } catch (err) {
        if (typeof err === 'object' && err !== null) errorTags.set(err, [tag('k', input.keyId)]);
        failed('admit', err);
        throw err;
      }
    }
    const { route, limits } = input;
    const tokens = Math.max(0, Math.ceil(input.tokens));
    const rc = isLimited(route.concurrency) ? route.concurrency : 0;
    const rr = isLimited(route.rpm) ? route.rpm : 0;
    const kr = isLimited(limits.rpm) ? limits.rpm : 0;
    const kt = isLimited(limits.tpm) ? limits.tpm : 0;
    const kc = isLimited(limits.concurrency) ? limits.concurrency : 0;
    const mr = isLimited(input.modelLimit?.rpm) ? input.modelLimit.rpm : 0;
    const mt = isLimited(input.modelLimit?.tpm) ? input.modelLimit.tpm : 0;
    const routeOn = rc > 0 || rr > 0;
    const keyOn = kr > 0 || kt > 0 || kc > 0 || mr > 0 || mt > 0;
    if (!hasAnyLimit(input)) return { ok: true, lease: NOOP_LEASE, quota: NO_QUOTA };
    const rt = tag('r', route.name);
    const kt_ = tag('k', input.keyId);
    const mk = `${kt_}:m:${encodeURIComponent(input.modelLimit?.pattern ?? '')}`;
    const routeKeys = [`${rt}:rpm`, `${rt}:conc`];
    // The model's buckets ride along only when the key has a per-model limit.
    const keyKeys = [`${kt_}:rpm`, `${kt_}:tpm`, `${kt_}:conc`, `${kt_}:concw`, ...(mr > 0 || mt > 0 ? [`${mk}:rpm`, `${mk}:tpm`] : [])];
    const leaseId = newLeaseId();

    // What undoing each side takes: its tokens back and its slot freed.
    const routeUndo: Part = {
      tag: rt,
      buckets: rr > 0 ? [{ key: routeKeys[0]!, cap: rr, delta: 1 }] : [],
      sets: rc > 0 ? [routeKeys[1]!] : [],
    };
    const keyUndo: Part = {
      tag: kt_,
      buckets: [
        ...(kr > 0 ? [{ key: keyKeys[0]!, cap: kr, delta: 1 }] : []),
        ...(kt > 0 && tokens > 0 ? [{ key: keyKeys[1]!, cap: kt, delta: tokens }] : []),
        ...(mr > 0 ? [{ key: keyKeys[4]!, cap: mr, delta: 1 }] : []),
        ...(mt > 0 && tokens > 0 ? [{ key: keyKeys[5]!, cap: mt, delta: tokens }] : []),
      ],
      sets: kc > 0 ? [keyKeys[2]!] : [],
    };

    const due = clock.deadline();
    const argv = (r: boolean, k: boolean): (string | number)[] =>
      [leaseId, leaseMs, r ? 1 : 0, rc, rr, k ? 1 : 0, kr, kt, kc, tokens, due, mr, mt];
    const call = async (r: boolean, k: boolean): Promise<number[]> => {
      try {
        const v = (await send('keywardAdmit', [...(r ? routeKeys : []), ...(k ? keyKeys : [])], argv(r, k))) as number[];
        clock.learn(v[3]);
        if (v[0] === -1) throw new StaleAdmissionError('admission reached Redis after its deadline');
        return v;
      } catch (err) {
        if (typeof err === 'object' && err !== null) errorTags.set(err, [...(r ? [rt] : []), ...(k ? [kt_] : [])]);
        throw err;
      }
    };

    let verdict: number[];
    try {
      verdict = !cluster || !routeOn || !keyOn ? await call(routeOn, keyOn) : await bothTags();
    } catch (err) {
      failed('admit', err);
      throw err;
    }

    /** Cluster: one call per hash tag, sent together; an admitted side is undone if the other is not. */
    async function bothTags(): Promise<number[]> {
      const [r, k] = await Promise.allSettled([call(true, false), call(false, true)]);
      const rOk = r.status === 'fulfilled' && r.value[0] === 1;
      const kOk = k.status === 'fulfilled' && k.value[0] === 1;
      if (rOk && kOk) return k.value;
      if (rOk) settle(leaseId, [routeUndo]);
      if (kOk) settle(leaseId, [keyUndo]);
      if (r.status === 'rejected') throw r.reason;
      if (k.status === 'rejected') throw k.reason;
      // Route first: its code wins; the wait is the longest among the failing sides.
      const denied = [r.value, k.value].filter((v) => v[0] !== 1);
      return [0, denied[0]![1]!, Math.max(...denied.map((v) => v[2]!))];
    }

    if (verdict[0] !== 1) {
      return { ok: false, code: CODES[(verdict[1] ?? 1) - 1] ?? 'rpm_exceeded', retryAfterMs: verdict[2] ?? 1 };
    }

    const slotSets = [...routeUndo.sets, ...keyUndo.sets];
    const kept = keeper.add(leaseId, slotSets);
    let done = false;
    const close = (parts: Part[]): void => {
      if (done) return;
      done = true;
      keeper.remove(kept);
      settle(leaseId, parts);
    };
    const lease: RedisLease = {
      finish(usage) {
        try {
          const real = usage?.tokens;
          const known = typeof real === 'number' && Number.isFinite(real) && real !== tokens;
          // Reserved minus real: positive refunds, negative charges the difference.
          const delta = known ? tokens - Math.max(0, Math.ceil(real)) : 0;
          const keyPart: Part = {
            tag: kt_,
            buckets: [
              ...(known && kt > 0 ? [{ key: keyKeys[1]!, cap: kt, delta }] : []),
              ...(known && mt > 0 ? [{ key: keyKeys[5]!, cap: mt, delta }] : []),
            ],
            sets: keyUndo.sets,
          };
          close([{ tag: rt, buckets: [], sets: routeUndo.sets }, keyPart]);
        } catch (err) {
          failed('settle', err);
        }
      },
      cancel() {
        try {
          close([routeUndo, keyUndo]);
        } catch (err) {
          failed('settle', err);
        }
      },
    };
    return { ok: true, lease, quota: quotaOf(kr, kt, verdict.slice(4)) };
  };

  return {
    admit,
    async peek(input) {
      const kr = isLimited(input.limits.rpm) ? input.limits.rpm : 0;
      const kt = isLimited(input.limits.tpm) ? input.limits.tpm : 0;
      if (kr === 0 && kt === 0) return NO_QUOTA;
      const k = tag('k', input.keyId);
      try {
        return quotaOf(kr, kt, (await send('keywardPeek', [`${k}:rpm`, `${k}:tpm`], [kr, kt])) as number[]);
      } catch (err) {
        failed('peek', err);
        throw err;
      }
    },
    hold: money.hold,
    ledger: money.ledger,
    refreshLeases: async () => {
      await Promise.all([keeper.refreshNow(), money.refresh()]);
    },
    admitNow,
    slicesHeld: () => sliced?.held() ?? 0,
    slotBlocksHeld: () => sliced?.blocksHeld() ?? 0,
    stats: () => ({ redisErrors, failOpenAdmissions: 0, slotsHeld: slotsHeld(), failOpenHolds: 0, holdsHeld: money.count() }),
    async close() {
      keeper.stop();
      money.stop();
      // Give slices back and let every settlement go, so a graceful stop frees what it held.
      sliced?.close();
      await batch.close();
    },
  };
}

/**
 * Fail-open / fail-closed against a private redis-server (unix socket, never the shared
 * server) that the tests kill, pause and bring back.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createLimiter } from '../../src/limits/create.js';
import type { AdmitInput, AdmitResult, Limiter } from '../../src/limits/limiter.js';
import { createRedisLimiter } from '../../src/limits/redis/limiter.js';
import { denied, input, leaseOf, uid } from '../helpers/redis-limits-conformance.js';
import { type SocketRedis, startSocketRedis, waitFor } from '../helpers/redis-server.js';

const TIMEOUT_MS = 100;
/** Event-loop jitter on a busy 2-core machine plus the guard's own slack. */
const MARGIN_MS = 100;
const RECOVERY_MS = 5_000;

let server: SocketRedis;

before(async () => {
  server = await startSocketRedis('failover');
});
after(() => server?.close());

function make(onError: 'open' | 'closed', events: string[] = []): Limiter {
  return createLimiter({
    redis: { url: `unix://${server.sock}`, prefix: uid('kwfo'), timeoutMs: TIMEOUT_MS, onError, lease: { enabled: true, sliceMs: 1_000 } },
    leaseMs: 5_000,
    log: (event) => void events.push(event),
  });
}

async function timed(lim: Limiter, inp: AdmitInput): Promise<AdmitResult> {
  const start = performance.now();
  const r = await lim.admit(inp);
  const ms = performance.now() - start;
  assert.ok(ms < TIMEOUT_MS + MARGIN_MS, `admission took ${ms.toFixed(1)} ms`);
  return r;
}

/** True when an admission that needs Redis was answered by Redis. */
async function redisServes(lim: Limiter): Promise<boolean> {
  const before = lim.stats().failOpenAdmissions;
  const r = await lim.admit(input(uid('probe'), { limits: { rpm: 100 } }));
  if (r.ok) r.lease.finish({ tokens: null });
  return r.ok && lim.stats().failOpenAdmissions === before;
}

const limited = (): AdmitInput => input(uid('k'), { limits: { rpm: 1000, concurrency: 10 } });

describe('createLimiter with onError: open', { timeout: 30_000 }, () => {
  test('Redis killed: every admission goes through the fallback within the timeout; a restart is picked up', async (t) => {
    const events: string[] = [];
    const lim = make('open', events);
    t.after(() => lim.close());
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions');
    events.length = 0;
    const opened = lim.stats().failOpenAdmissions;

    server.proc.kill('SIGKILL');
    await server.exited;
    const seq: AdmitResult[] = [];
    for (let i = 0; i < 10; i++) seq.push(await timed(lim, limited()));
    const par = await Promise.all(Array.from({ length: 10 }, () => timed(lim, limited())));
    assert.ok([...seq, ...par].every((r) => r.ok));
    assert.equal(lim.stats().failOpenAdmissions, opened + 20);
    // The fallback still enforces limits, per instance.
    const key = uid('k');
    const held = leaseOf(await lim.admit(input(key, { limits: { concurrency: 1 } })));
    denied(await lim.admit(input(key, { limits: { concurrency: 1 } })), 'concurrency_exceeded');
    held.finish({ tokens: null });
    for (const r of [...seq, ...par]) if (r.ok) r.lease.finish({ tokens: 5 });

    await server.restart();
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions after a restart');
    assert.ok(lim.stats().redisErrors > 0);
    assert.equal(lim.stats().slotsHeld, 0);
    assert.deepEqual(events, ['limits_redis_down', 'limits_redis_up'], 'state changes are logged once each');
  });

  test('Redis paused: admissions fall back within the timeout; its backlog leaks no slot; leases finish where admitted', async (t) => {
    const lim = make('open');
    t.after(() => lim.close());
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions');
    const inRedis = uid('k');
    const l1 = leaseOf(await lim.admit(input(inRedis, { limits: { concurrency: 1 } })));
    const opened = lim.stats().failOpenAdmissions;

    server.proc.kill('SIGSTOP');
    try {
      // The first one waits out the timeout against Redis; Redis runs it only after SIGCONT.
      const backlog = uid('k');
      const local = leaseOf(await timed(lim, input(backlog, { limits: { concurrency: 1 } })));
      const rs: AdmitResult[] = [];
      for (let i = 0; i < 10; i++) {
        rs.push(await timed(lim, limited()));
        await new Promise((r) => setTimeout(r, 30)); // spread over more than one breaker window
      }
      rs.push(...(await Promise.all(Array.from({ length: 10 }, () => timed(lim, limited())))));
      assert.ok(rs.every((r) => r.ok));
      // The fallback knows nothing of l1, so it admits this key once more.
      const l2 = leaseOf(await timed(lim, input(inRedis, { limits: { concurrency: 1 } })));
      assert.equal(lim.stats().failOpenAdmissions, opened + 22);
      for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
      local.finish({ tokens: null });
      l2.finish({ tokens: null });
      assert.equal(lim.stats().slotsHeld, 1, 'only l1, held in Redis');

      server.proc.kill('SIGCONT');
      await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions after SIGCONT');
      // Redis ran the timed-out admission late and refused it: the slot is free.
      leaseOf(await lim.admit(input(backlog, { limits: { concurrency: 1 } }))).finish({ tokens: null });
      // l1 still holds its slot in Redis, and finishing it frees it there.
      denied(await lim.admit(input(inRedis, { limits: { concurrency: 1 } })), 'concurrency_exceeded');
      l1.finish({ tokens: null });
      await waitFor(async () => {
        const r = await lim.admit(input(inRedis, { limits: { concurrency: 1 } }));
        if (r.ok) r.lease.finish({ tokens: null });
        return r.ok;
      }, 2_000, 'the slot of l1 to be freed in Redis');
    } finally {
      server.proc.kill('SIGCONT');
    }
  });

  test('Redis never reachable: fails open within the timeout', async () => {
    const lim = createLimiter({
      redis: { url: `unix://${join(server.dir, 'nobody-here.sock')}`, prefix: 'kw', timeoutMs: TIMEOUT_MS, onError: 'open', lease: { enabled: true, sliceMs: 1_000 } },
      leaseMs: 30_000,
    });
    for (let i = 0; i < 5; i++) assert.ok((await timed(lim, limited())).ok);
    assert.equal(lim.stats().failOpenAdmissions, 5);
    await lim.close();
  });
});

describe('createLimiter with onError: closed', { timeout: 30_000 }, () => {
  test('paused or killed Redis answers limits_unavailable within the timeout; recovers by itself', async (t) => {
    const lim = make('closed');
    t.after(() => lim.close());
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions');

    server.proc.kill('SIGSTOP');
    try {
      for (let i = 0; i < 5; i++) denied(await timed(lim, limited()), 'limits_unavailable');
      // A key limited only per model waits on the same shard, so the open breaker answers it at once.
      const modelOnly = { ...input(uid('k')), modelLimit: { pattern: 'gpt-*', rpm: 10, tpm: null } };
      const start = performance.now();
      denied(await lim.admit(modelOnly), 'limits_unavailable');
      assert.ok(performance.now() - start < TIMEOUT_MS / 2, `the breaker answered a per-model key after ${(performance.now() - start).toFixed(1)} ms`);
      // A request with no limits at all needs no Redis, so nothing is unavailable for it.
      assert.ok((await timed(lim, input(uid('k')))).ok);
    } finally {
      server.proc.kill('SIGCONT');
    }
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions after SIGCONT');

    server.proc.kill('SIGKILL');
    await server.exited;
    for (let i = 0; i < 5; i++) denied(await timed(lim, limited()), 'limits_unavailable');
    await server.restart();
    await waitFor(() => redisServes(lim), RECOVERY_MS, 'Redis admissions after a restart');
    assert.equal(lim.stats().failOpenAdmissions, 0);
  });
});

test('a Redis that never comes up is logged down with the reason its connection gave', { timeout: 10_000 }, async (t) => {
  let told!: (fields: Record<string, unknown>) => void;
  const down = new Promise<Record<string, unknown>>((r) => (told = r));
  const lim = createLimiter({
    redis: { url: `unix://${join(server.dir, 'nothing-listens.sock')}`, prefix: uid('kwfo'), timeoutMs: TIMEOUT_MS, onError: 'open', lease: { enabled: false, sliceMs: 1_000 } },
    leaseMs: 5_000,
    log: (event, fields) => {
      if (event === 'limits_redis_down') told(fields);
    },
  });
  t.after(() => lim.close());
  assert.match(String((await down).error), /ENOENT/);
});

describe('redis limiter on a private server', () => {
  test('scripts come back after SCRIPT FLUSH (NOSCRIPT falls back to EVAL)', async () => {
    const redis = new Redis({ path: server.sock });
    const lim = createRedisLimiter({ redis, prefix: uid('kwfo'), leaseMs: 5_000 });
    const key = uid('k');
    leaseOf(await lim.admit(input(key, { limits: { rpm: 3 } }))).finish({ tokens: null });
    await redis.script('FLUSH');
    leaseOf(await lim.admit(input(key, { limits: { rpm: 3 } }))).finish({ tokens: null });
    leaseOf(await lim.admit(input(key, { limits: { rpm: 3 } }))).finish({ tokens: null });
    denied(await lim.admit(input(key, { limits: { rpm: 3 } })), 'rpm_exceeded');
    assert.equal(lim.stats().redisErrors, 0);
    await lim.close();
    redis.disconnect();
  });
});

test('without a Redis URL createLimiter is the in-process limiter', async () => {
  let t = 0;
  const lim = createLimiter({ leaseMs: 30_000, now: () => t });
  const key = uid('k');
  leaseOf(await lim.admit(input(key, { limits: { rpm: 1 } })));
  denied(await lim.admit(input(key, { limits: { rpm: 1 } })), 'rpm_exceeded');
  t += 60_000;
  leaseOf(await lim.admit(input(key, { limits: { rpm: 1 } })));
  await lim.close();
});

/**
 * Conformance, part two: per-model limits and the quota figures admissions report
 * (DESIGN sections 6 and 11), and the TPM rule for an estimate above the capacity on the key
 * bucket (admit.lua, or lease.lua with slices on) and a model bucket (admit.lua).
 * Registered inside runLimiterConformance's suite.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ModelLimitInput } from '../../src/limits/limiter.js';
import { type Harness, denied, input, leaseOf, uid } from './redis-limits-conformance.js';

const model = (o: Partial<ModelLimitInput>): ModelLimitInput => ({ pattern: 'gpt-4o*', rpm: null, tpm: null, ...o });

export function quotaConformance(get: () => Harness): void {
  test('model limits: the matching pattern has its own RPM, same code and retry-after; another model passes', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const limits = { rpm: 10 };
    const mini = { limits, modelLimit: model({ rpm: 2 }) };
    leaseOf(await lim.admit({ ...input(key, { limits }), modelLimit: mini.modelLimit })).finish({ tokens: null });
    leaseOf(await lim.admit({ ...input(key, { limits }), modelLimit: mini.modelLimit })).finish({ tokens: null });
    const wait = denied(await lim.admit({ ...input(key, { limits }), modelLimit: mini.modelLimit }), 'rpm_exceeded');
    assert.ok(wait > 25_000 && wait <= 30_000, `one token per 30 s, got ${wait}`);
    // Another model of the same key: no per-model entry, or another entry with its own bucket.
    leaseOf(await lim.admit(input(key, { limits }))).finish({ tokens: null });
    leaseOf(await lim.admit({ ...input(key, { limits }), modelLimit: model({ pattern: 'o3*', rpm: 2 }) })).finish({ tokens: null });
    // The key's own RPM counted the four admissions, not the denial.
    const q = await lim.peek({ keyId: key, limits: { rpm: 10, tpm: null, concurrency: null } });
    assert.equal(q.requests?.remaining, 6);
  });

  test('model limits: TPM with its own code; settlement refunds and charges the model bucket too', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const modelLimit = model({ tpm: 1000 });
    const ask = (tokens: number) => lim.admit({ ...input(key, { tokens }), modelLimit });
    leaseOf(await ask(600)).finish({ tokens: 100 }); // refund 500: 900 left
    leaseOf(await ask(880)).finish({ tokens: null }); // 20 left
    const wait = denied(await ask(100), 'tpm_exceeded');
    assert.ok(wait > 3_000 && wait <= 4_800, `80 tokens at 1000/min, got ${wait}`);
    // Charging more than reserved takes the bucket further down.
    const other = uid('k');
    const ask2 = (tokens: number) => lim.admit({ ...input(other, { tokens }), modelLimit });
    leaseOf(await ask2(100)).finish({ tokens: 600 });
    denied(await ask2(450), 'tpm_exceeded');
    leaseOf(await ask2(390)).finish({ tokens: null });
  });

  test('TPM: an estimate above the capacity passes on a full bucket and then waits until full, not for the estimate', async () => {
    const lim = get().limiter;
    const huge = 5000; // against a capacity of 1000 per minute
    const key = uid('k');
    const ask = (tokens: number) => lim.admit(input(key, { limits: { tpm: 1000 }, tokens }));
    const modelKey = uid('k');
    const modelLimit = model({ tpm: 1000 });
    const askModel = (tokens: number) => lim.admit({ ...input(modelKey, { tokens }), modelLimit });
    for (const [bucket, admit] of [['key', ask], ['model', askModel]] as const) {
      leaseOf(await admit(huge)).finish({ tokens: null }); // full: passes, the bucket at -4000
      const wait = denied(await admit(huge), 'tpm_exceeded');
      // From -4000 to full (1000) at 1000 per minute is 300 s; waiting to hold 5000 would be 540 s.
      assert.ok(wait > 298_000 && wait <= 300_000, `${bucket} bucket: got ${wait}`);
    }
  });

  test('model limits apply in addition to the key: either one denies; nothing is consumed on a denial', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const modelLimit = model({ rpm: 1 });
    leaseOf(await lim.admit({ ...input(key, { limits: { rpm: 2 } }), modelLimit })).finish({ tokens: null });
    // The model bucket is empty: denied, and the key's second RPM token stays.
    for (let i = 0; i < 3; i++) denied(await lim.admit({ ...input(key, { limits: { rpm: 2 } }), modelLimit }), 'rpm_exceeded');
    leaseOf(await lim.admit(input(key, { limits: { rpm: 2 } }))).finish({ tokens: null });
    denied(await lim.admit(input(key, { limits: { rpm: 2 } })), 'rpm_exceeded');

    // The key's own limit denies a model whose own bucket is full; the model bucket keeps its token.
    const k2 = uid('k');
    const ml = model({ rpm: 5 });
    leaseOf(await lim.admit(input(k2, { limits: { rpm: 1 } }))).finish({ tokens: null });
    denied(await lim.admit({ ...input(k2, { limits: { rpm: 1 } }), modelLimit: ml }), 'rpm_exceeded');
    const rs = await Promise.all(Array.from({ length: 6 }, () => lim.admit({ ...input(k2), modelLimit: ml })));
    assert.equal(rs.filter((r) => r.ok).length, 5);
    for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
  });

  test('model limits: concurrent requests admit exactly the model RPM', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const modelLimit = model({ rpm: 4, tpm: 10_000 });
    const rs = await Promise.all(Array.from({ length: 12 }, () => lim.admit({ ...input(key, { tokens: 10 }), modelLimit })));
    assert.equal(rs.filter((r) => r.ok).length, 4);
    for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
  });

  test('quota: admissions report the key’s own figures going down; none for a limit the key lacks', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const limits = { rpm: 3, tpm: 600 };
    const seen: number[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await lim.admit(input(key, { limits, tokens: 100 }));
      assert.ok(r.ok);
      seen.push(r.quota.requests!.remaining);
      assert.equal(r.quota.requests!.limit, 3);
      assert.equal(r.quota.tokens!.limit, 600);
      // 600 per minute is 10 per second: a slow machine may see a few back, never the reservation.
      const tokens = r.quota.tokens!.remaining;
      assert.ok(tokens >= 500 - 100 * i && tokens < 500 - 100 * i + 50, `tokens remaining ${tokens} after ${i + 1}`);
      const reset = r.quota.requests!.resetMs;
      assert.ok(reset > (i + 1) * 20_000 - 3_000 && reset <= (i + 1) * 20_000, `requests reset ${reset}`);
      r.lease.finish({ tokens: null });
    }
    assert.deepEqual(seen, [2, 1, 0]);
    const only = await lim.admit(input(uid('k'), { limits: { concurrency: 2 } }));
    assert.ok(only.ok);
    assert.deepEqual(only.quota, { requests: null, tokens: null });
    only.lease.finish({ tokens: null });
    const rpmOnly = await lim.admit(input(uid('k'), { limits: { rpm: 10 } }));
    assert.ok(rpmOnly.ok);
    assert.equal(rpmOnly.quota.tokens, null);
    assert.equal(rpmOnly.quota.requests?.remaining, 9);
    rpmOnly.lease.finish({ tokens: null });
  });

  test('peek: the same figures without side effects; a fresh key is full', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const limits = { rpm: 3, tpm: null, concurrency: null };
    assert.deepEqual(await lim.peek({ keyId: key, limits }), {
      requests: { limit: 3, remaining: 3, resetMs: 0 },
      tokens: null,
    });
    leaseOf(await lim.admit(input(key, { limits }))).finish({ tokens: null });
    for (let i = 0; i < 10; i++) {
      const q = await lim.peek({ keyId: key, limits });
      assert.equal(q.requests?.remaining, 2);
      assert.ok(q.requests!.resetMs > 0 && q.requests!.resetMs <= 20_000);
    }
    // Peeking took nothing: exactly two more admissions fit.
    const rs = await Promise.all(Array.from({ length: 4 }, () => lim.admit(input(key, { limits }))));
    assert.equal(rs.filter((r) => r.ok).length, 2);
    for (const r of rs) if (r.ok) r.lease.finish({ tokens: null });
    const tq = await lim.peek({ keyId: uid('k'), limits: { rpm: null, tpm: 1000, concurrency: 5 } });
    assert.deepEqual(tq, { requests: null, tokens: { limit: 1000, remaining: 1000, resetMs: 0 } });
  });

  test('quota: a TPM bucket in debt reports 0 remaining and the time until it is full again', async () => {
    const lim = get().limiter;
    const key = uid('k');
    const limits = { rpm: null, tpm: 1000, concurrency: null };
    const r = await lim.admit(input(key, { limits, tokens: 3000 }));
    assert.ok(r.ok);
    assert.equal(r.quota.tokens?.remaining, 0);
    // From -2000 to 1000 at 1000 per minute: three minutes.
    assert.ok(r.quota.tokens!.resetMs > 179_000 && r.quota.tokens!.resetMs <= 180_000, `got ${r.quota.tokens!.resetMs}`);
    r.lease.finish({ tokens: null });
  });
}

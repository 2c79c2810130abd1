/**
 * Shadow limits (DESIGN section 12), on a real
 * in-process limiter: each shadow name covers its own checks and no other's, and an enforced
 * refusal whose re-ask (shadowed checks off) fits gives that admission back and says the
 * request may retry at once. And which recorded codes are of steps after the budgets', the
 * question that decides whether a shadowed budget's live ledger is read before the hold.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { AdmitInput, AdmitResult, KeyLimits } from '../../src/limits/limiter.js';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import { admitShadowed, holdShadowed } from '../../src/limits/shadow.js';
import type { Holder } from '../../src/policy/holders.js';
import { hasLaterStepCodes, isShadowed, shadowSet } from '../../src/policy/shadow.js';
import { SHADOW_CHECKS } from '../../src/protocol/shadow-checks.js';

const input = (keyId: string, limits: Partial<KeyLimits>, extra: Partial<AdmitInput> = {}): AdmitInput => ({
  keyId,
  limits: { rpm: null, tpm: null, concurrency: null, ...limits },
  tokens: 0,
  route: { name: 'unlimited', concurrency: 0, rpm: 0 },
  ...extra,
});

function refused(r: AdmitResult): Extract<AdmitResult, { ok: false }> & { check: string } {
  assert.equal(r.ok, false, 'expected a refusal');
  assert.ok(!r.ok && r.code !== 'limits_unavailable');
  return r as Extract<AdmitResult, { ok: false }> & { check: string };
}

test('an enforced refusal whose re-ask without the shadowed checks fits: that admission is given back, retry at once', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  try {
    const limits = { concurrency: 1, rpm: 10 };
    const first = await limiter.admit(input('k_race', limits));
    assert.ok(first.ok);
    // The slot frees just after the refusal is answered, before the re-ask with RPM (shadowed) off.
    let freed = false;
    const racing = {
      admit: async (i: AdmitInput) => {
        const r = await limiter.admit(i);
        if (!r.ok && !freed) {
          freed = true;
          first.lease.finish({ tokens: null });
        }
        return r;
      },
    };
    const codes: string[] = [];
    const r = refused(await admitShadowed(racing, input('k_race', limits), { shadow: shadowSet(['rpm']), codes }));
    assert.deepEqual([r.code, r.check, r.retryAfterMs, codes], ['concurrency_exceeded', 'concurrency', 0, []]);
    // The re-ask's admission took nothing: no slot held, and only the first request's RPM token gone.
    assert.equal(limiter.stats().slotsHeld, 0);
    const peek = await limiter.peek({ keyId: 'k_race', limits: { rpm: 10, tpm: null, concurrency: 1 } });
    assert.equal(peek.requests?.remaining, 9);
  } finally {
    await limiter.close();
  }
});

test('shadowing budget leaves the per-model limits enforced, tpm the concurrency limit, and model the budgets', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  try {
    const modelLimit = { pattern: 'gpt-4o*', rpm: 1, tpm: null };
    const budgetOnly = { shadow: shadowSet(['budget']), codes: [] as string[] };
    const ok = await admitShadowed(limiter, input('k_m', {}, { modelLimit }), budgetOnly);
    assert.ok(ok.ok);
    ok.lease.finish({ tokens: null });
    const r = refused(await admitShadowed(limiter, input('k_m', {}, { modelLimit }), budgetOnly));
    assert.deepEqual([r.code, r.check, budgetOnly.codes], ['rpm_exceeded', 'model_rpm', []]);

    const tpmOnly = { shadow: shadowSet(['tpm']), codes: [] as string[] };
    const slot = await admitShadowed(limiter, input('k_c', { concurrency: 1 }), tpmOnly);
    assert.ok(slot.ok);
    const busy = refused(await admitShadowed(limiter, input('k_c', { concurrency: 1 }), tpmOnly));
    assert.deepEqual([busy.code, busy.check, tpmOnly.codes], ['concurrency_exceeded', 'concurrency', []]);
    slot.lease.finish({ tokens: null });

    const spent: Holder = { id: 'key:k_b', kind: 'budget', base: 10, limit: 10, epoch: 0, code: 'key_budget_exhausted', period: null };
    const modelOnly = { shadow: shadowSet(['model']), codes: [] as string[] };
    const hold = await holdShadowed(limiter, { tag: 'k_b', holders: [spent], amount: 1 }, modelOnly);
    assert.deepEqual([hold.ok ? 'held' : hold.code, modelOnly.codes], ['key_budget_exhausted', []]);
  } finally {
    await limiter.close();
  }
});

test('codes of steps 6 to 8: none recorded is none; a budget code beside a later one still has one', () => {
  assert.equal(hasLaterStepCodes([]), false);
  assert.equal(hasLaterStepCodes(['key_budget_exhausted']), false);
  assert.equal(hasLaterStepCodes(['rpm_exceeded']), true);
  // Step 5 found the key's budget spent in the replica, a shadowed RPM refused too: a project
  // budget spent live must still be read, so its code lands before rpm_exceeded.
  assert.equal(hasLaterStepCodes(['key_budget_exhausted', 'rpm_exceeded']), true);
});

test('each shadow name shadows its own checks and no other name\'s', () => {
  for (const name of SHADOW_CHECKS) {
    const set = shadowSet([name]);
    assert.deepEqual(SHADOW_CHECKS.filter((c) => isShadowed(set, c)), [name], `shadow: [${name}]`);
  }
});

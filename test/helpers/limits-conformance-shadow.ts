/**
 * Conformance, part four: what a refusal says (which check refused, the key's quota figures)
 * and shadow limits (DESIGN section 12) over each limiter: a shadowed refusal is admitted
 * without taking anything from that check's bucket, slots or ledger, every other check
 * takes and settles as if enforced, and enforcing the check at once refuses exactly when
 * it should. Registered inside runLimiterConformance's suite.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { AdmitInput, AdmitResult, HoldInput, Lease, LimitRefusal, ModelLimitInput, RouteCapacity } from '../../src/limits/limiter.js';
import { admitShadowed, holdShadowed } from '../../src/limits/shadow.js';
import { shadowSet } from '../../src/policy/shadow.js';
import type { ShadowCheck } from '../../src/protocol/shadow-checks.js';
import { keyBudget, projectBudget, wallet } from './limits-conformance-ledger.js';
import { type Harness, input, leaseOf, uid } from './redis-limits-conformance.js';

const model = (o: Partial<ModelLimitInput>): ModelLimitInput => ({ pattern: 'gpt-4o*', rpm: null, tpm: null, ...o });

function refusal(r: AdmitResult, code: string, check: string): LimitRefusal {
  assert.equal(r.ok, false, `expected ${code} (${check}), got an admission`);
  assert.ok(!r.ok && r.code !== 'limits_unavailable');
  assert.deepEqual([r.code, r.check], [code, check]);
  return r;
}

/** One admission with `checks` shadowed: its result and the codes it would have got. */
interface Shadowed {
  r: AdmitResult;
  codes: string[];
}

export function shadowConformance(get: () => Harness): void {
  const lim = () => get().limiter;
  const shadowed = async (inp: AdmitInput, checks: ShadowCheck[]): Promise<Shadowed> => {
    const codes: string[] = [];
    return { r: await admitShadowed(lim(), inp, { shadow: shadowSet(checks), codes }), codes };
  };
  /** `n` admissions at once with `checks` shadowed. */
  const burst = (n: number, make: () => AdmitInput, checks: ShadowCheck[]): Promise<Shadowed[]> => Promise.all(Array.from({ length: n }, () => shadowed(make(), checks)));
  const plain = (rs: Shadowed[]) => rs.filter((x) => x.r.ok && x.codes.length === 0);
  const shadowOnly = (rs: Shadowed[], codes: string) => rs.filter((x) => x.r.ok && x.codes.join(',') === codes);
  const finish = (rs: Shadowed[], tokens: number | null = null) => rs.forEach((x) => leaseOf(x.r).finish({ tokens }));

  test('a refusal names the check that refused; a key RPM or TPM refusal carries the key figures, remaining 0', async () => {
    const route: RouteCapacity = { name: uid('route'), concurrency: 1, rpm: 0 };
    const held = leaseOf(await lim().admit(input(uid('k'), { route })));
    refusal(await lim().admit(input(uid('k'), { route })), 'route_capacity_exceeded', 'route_concurrency');
    held.finish({ tokens: null });
    const routeRpm: RouteCapacity = { name: uid('route'), concurrency: 0, rpm: 1 };
    leaseOf(await lim().admit(input(uid('k'), { route: routeRpm }))).finish({ tokens: null });
    refusal(await lim().admit(input(uid('k'), { route: routeRpm })), 'route_capacity_exceeded', 'route_rpm');

    const key = uid('k');
    const limits = { rpm: 2, tpm: 1000 };
    leaseOf(await lim().admit(input(key, { limits, tokens: 900 }))).finish({ tokens: null });
    // 100 tokens left, 500 asked: the figures say 0 tokens remaining, and the RPM bucket as it is.
    const tpm = refusal(await lim().admit(input(key, { limits, tokens: 500 })), 'tpm_exceeded', 'tpm');
    assert.deepEqual([tpm.quota.tokens?.limit, tpm.quota.tokens?.remaining, tpm.quota.requests?.remaining], [1000, 0, 1]);
    assert.ok(tpm.quota.tokens!.resetMs > 50_000, `the bucket is full again in about 54 s, got ${tpm.quota.tokens!.resetMs}`);
    leaseOf(await lim().admit(input(key, { limits, tokens: 50 }))).finish({ tokens: null });
    const rpm = refusal(await lim().admit(input(key, { limits, tokens: 10 })), 'rpm_exceeded', 'rpm');
    assert.deepEqual([rpm.quota.requests?.limit, rpm.quota.requests?.remaining], [2, 0]);
    assert.ok(rpm.quota.requests!.resetMs > 55_000 && rpm.quota.requests!.resetMs <= 60_000, `got ${rpm.quota.requests!.resetMs}`);

    const conc = uid('k');
    const slot = leaseOf(await lim().admit(input(conc, { limits: { concurrency: 1 } })));
    refusal(await lim().admit(input(conc, { limits: { concurrency: 1 } })), 'concurrency_exceeded', 'concurrency');
    slot.finish({ tokens: null });

    const m = uid('k');
    const modelLimit = model({ rpm: 1, tpm: 100 });
    leaseOf(await lim().admit({ ...input(m, { tokens: 100 }), modelLimit })).finish({ tokens: null });
    refusal(await lim().admit({ ...input(m, { tokens: 100 }), modelLimit }), 'rpm_exceeded', 'model_rpm');
    refusal(await lim().admit({ ...input(m, { tokens: 100 }), modelLimit: model({ tpm: 100 }) }), 'tpm_exceeded', 'model_tpm');
  });

  test('shadow rpm: N+K at once, N take and pass, K pass taking nothing; enforcing at once refuses with one token\'s wait', async () => {
    const key = uid('k');
    const limits = { rpm: 5 };
    const rs = await burst(8, () => input(key, { limits }), ['rpm']);
    assert.equal(plain(rs).length, 5);
    const extra = shadowOnly(rs, 'rpm_exceeded');
    assert.equal(extra.length, 3);
    // The shadowed limit's figures, as for an enforced one: nothing left.
    for (const x of extra) assert.deepEqual([x.r.ok && x.r.quota.requests?.limit, x.r.ok && x.r.quota.requests?.remaining], [5, 0]);
    // Had the three taken a token each, the wait would be four tokens' (48 s).
    const wait = refusal(await lim().admit(input(key, { limits })), 'rpm_exceeded', 'rpm').retryAfterMs;
    assert.ok(wait <= 12_000, `one token of 5 a minute, got ${wait}`);
    finish(rs);
  });

  test('shadow tpm: the shadowed requests neither reserve nor settle on the bucket; the others do', async () => {
    const key = uid('k');
    const limits = { tpm: 1000 };
    const rs = await burst(13, () => input(key, { limits, tokens: 100 }), ['tpm']);
    assert.equal(plain(rs).length, 10);
    const extra = shadowOnly(rs, 'tpm_exceeded');
    assert.equal(extra.length, 3);
    for (const x of extra) assert.equal(x.r.ok && x.r.quota.tokens?.remaining, 0);
    finish(extra, 900); // their real usage is not charged to a bucket they did not reserve on
    finish(plain(rs)); // the reservations stand
    const wait = refusal(await lim().admit(input(key, { limits, tokens: 100 })), 'tpm_exceeded', 'tpm').retryAfterMs;
    assert.ok(wait > 5_000 && wait <= 6_000, `100 tokens at 1000 a minute, got ${wait}`);
  });

  test('shadow concurrency: shadowed requests hold no slot; the limit frees and refuses exactly as before', async () => {
    const key = uid('k');
    const limits = { concurrency: 2 };
    const slots = lim().stats().slotsHeld;
    const rs = await burst(5, () => input(key, { limits }), ['concurrency']);
    const [first, second] = plain(rs);
    assert.ok(first && second && plain(rs).length === 2);
    assert.equal(shadowOnly(rs, 'concurrency_exceeded').length, 3);
    assert.equal(lim().stats().slotsHeld, slots + 2);
    finish(shadowOnly(rs, 'concurrency_exceeded'));
    refusal(await lim().admit(input(key, { limits })), 'concurrency_exceeded', 'concurrency');
    leaseOf(first.r).finish({ tokens: null });
    const again = leaseOf(await lim().admit(input(key, { limits })));
    refusal(await lim().admit(input(key, { limits })), 'concurrency_exceeded', 'concurrency');
    again.finish({ tokens: null });
    leaseOf(second.r).finish({ tokens: null });
  });

  test('shadow route: the route\'s slots and RPM stay untouched, the key\'s own limits take as enforced', async () => {
    const route: RouteCapacity = { name: uid('route'), concurrency: 1, rpm: 0 };
    const holder = leaseOf(await lim().admit(input(uid('k'), { route })));
    const b = uid('k');
    const limits = { rpm: 2 };
    const leases: Lease[] = [];
    for (let i = 0; i < 2; i++) {
      const x = await shadowed(input(b, { limits, route }), ['route']);
      assert.deepEqual(x.codes, ['route_capacity_exceeded']);
      leases.push(leaseOf(x.r));
    }
    // The key's RPM took both: the route is shadowed, the key's RPM is not.
    const third = await shadowed(input(b, { limits, route }), ['route']);
    refusal(third.r, 'rpm_exceeded', 'rpm');
    assert.deepEqual(third.codes, ['route_capacity_exceeded']);
    // The shadowed requests, still in flight, hold none of the route's one slot.
    holder.finish({ tokens: null });
    const c = leaseOf(await lim().admit(input(uid('k'), { route })));
    refusal(await lim().admit(input(uid('k'), { route })), 'route_capacity_exceeded', 'route_concurrency');
    c.finish({ tokens: null });
    for (const l of leases) l.finish({ tokens: null });

    const routeRpm: RouteCapacity = { name: uid('route'), concurrency: 0, rpm: 2 };
    const rs = await burst(4, () => input(uid('k'), { route: routeRpm }), ['route']);
    assert.deepEqual([plain(rs).length, shadowOnly(rs, 'route_capacity_exceeded').length], [2, 2]);
    const wait = refusal(await lim().admit(input(uid('k'), { route: routeRpm })), 'route_capacity_exceeded', 'route_rpm').retryAfterMs;
    assert.ok(wait <= 30_000, `one token of 2 a minute, got ${wait}`);
    finish(rs);
  });

  test('shadow model: the per-model buckets stay untouched, the key\'s own RPM takes and still refuses', async () => {
    const key = uid('k');
    const limits = { rpm: 3 };
    const modelLimit = model({ rpm: 1 });
    const ask = () => shadowed({ ...input(key, { limits }), modelLimit }, ['model']);
    const first = await ask();
    assert.deepEqual(first.codes, []);
    for (let i = 0; i < 2; i++) assert.deepEqual((await ask()).codes, ['rpm_exceeded']);
    assert.equal((await lim().peek({ keyId: key, limits: { rpm: 3, tpm: null, concurrency: null } })).requests?.remaining, 0);
    // The key's own RPM, enforced and checked first, refuses the fourth.
    const fourth = await ask();
    refusal(fourth.r, 'rpm_exceeded', 'rpm');
    assert.deepEqual(fourth.codes, []);
    // The wait is the longest of the failing checks': the model bucket lacks one token of 1 a
    // minute; had the two shadowed requests taken theirs, it would lack three.
    const wait = refusal(await lim().admit({ ...input(key, { limits }), modelLimit }), 'rpm_exceeded', 'rpm').retryAfterMs;
    assert.ok(wait > 55_000 && wait <= 60_000, `got ${wait}`);

    const t = uid('k');
    const tpmLimit = model({ tpm: 1000 });
    const rs: Shadowed[] = [];
    for (let i = 0; i < 3; i++) rs.push(await shadowed({ ...input(t, { tokens: 400 }), modelLimit: tpmLimit }, ['model']));
    assert.deepEqual(rs.map((x) => x.codes.join()), ['', '', 'tpm_exceeded']);
    finish(rs);
    const tpmWait = refusal(await lim().admit({ ...input(t, { tokens: 400 }), modelLimit: tpmLimit }), 'tpm_exceeded', 'model_tpm').retryAfterMs;
    assert.ok(tpmWait > 11_000 && tpmWait <= 12_000, `200 tokens short at 1000 a minute, got ${tpmWait}`);
  });

  test('shadow: several checks would refuse: every code once, in decision order; each shadowed limit shows its own figures', async () => {
    const key = uid('k');
    const limits = { rpm: 1, tpm: 100 };
    leaseOf(await lim().admit(input(key, { limits, tokens: 100 }))).finish({ tokens: null });
    const x = await shadowed(input(key, { limits, tokens: 100 }), ['tpm', 'rpm']);
    assert.deepEqual(x.codes, ['rpm_exceeded', 'tpm_exceeded']);
    assert.ok(x.r.ok);
    assert.deepEqual([x.r.quota.requests?.limit, x.r.quota.requests?.remaining, x.r.quota.tokens?.limit, x.r.quota.tokens?.remaining], [1, 0, 100, 0]);
    x.r.lease.finish({ tokens: 5000 });
    const wait = refusal(await lim().admit(input(key, { limits, tokens: 100 })), 'rpm_exceeded', 'rpm').retryAfterMs;
    assert.ok(wait <= 60_000, `neither bucket was taken from: ${wait}`);
    // Shadowing one check leaves the other enforced.
    const y = await shadowed(input(key, { limits, tokens: 100 }), ['rpm']);
    const enforced = refusal(y.r, 'tpm_exceeded', 'tpm');
    assert.deepEqual(y.codes, ['rpm_exceeded']);
    // The enforced TPM refusal shows the shadowed RPM bucket as an enforced one's would be.
    assert.deepEqual([enforced.quota.requests?.limit, enforced.quota.requests?.remaining, enforced.quota.tokens?.remaining], [1, 0, 0]);
  });

  test('an enforced refusal waits for the enforced checks alone: a shadowed check failing after it adds nothing', async () => {
    const key = uid('k');
    const limits = { rpm: 2, tpm: 100 };
    leaseOf(await lim().admit(input(key, { limits, tokens: 100 }))).finish({ tokens: null });
    const second = await shadowed(input(key, { limits, tokens: 100 }), ['tpm']);
    assert.deepEqual(second.codes, ['tpm_exceeded']);
    leaseOf(second.r).finish({ tokens: null });
    // Both buckets are empty: RPM (enforced, checked first) lacks a token of 2 a minute, TPM
    // (shadowed) lacks a whole minute's 100.
    const third = await shadowed(input(key, { limits, tokens: 100 }), ['tpm']);
    const wait = refusal(third.r, 'rpm_exceeded', 'rpm').retryAfterMs;
    assert.ok(wait > 25_000 && wait <= 30_000, `one RPM token, not the shadowed TPM bucket's minute: ${wait}`);
    assert.deepEqual(third.codes, []);
    // Enforced, the same request waits for both.
    const both = refusal(await lim().admit(input(key, { limits, tokens: 100 })), 'rpm_exceeded', 'rpm').retryAfterMs;
    assert.ok(both > 55_000, `the longest of both: ${both}`);
  });

  test('shadow budget: a holder that cannot fit is left out of the hold; the others hold and settle as enforced', async () => {
    const hold = async (inp: HoldInput) => {
      const codes: string[] = [];
      return { r: await holdShadowed(lim(), inp, { shadow: shadowSet(['budget']), codes }), codes };
    };
    const tag = uid('tag');
    const empty = wallet(uid('u'), { base: 0 });
    const w = await hold({ tag, holders: [empty], amount: 0.5 });
    assert.ok(w.r.ok);
    assert.deepEqual(w.codes, ['insufficient_balance']);
    w.r.hold.settle(0.4);
    assert.equal((await lim().ledger({ tag, holders: [empty] }))[0]!.live, 0, 'the wallet was neither held nor charged');

    const team = uid('tag');
    const key = keyBudget(uid('k'), { base: 1, limit: 1 });
    const project = projectBudget(uid('p'), { base: 0, limit: 10 });
    const t = await hold({ tag: team, holders: [key, project], amount: 4 });
    assert.ok(t.r.ok);
    assert.deepEqual(t.codes, ['key_budget_exhausted']);
    const [k1, p1] = await lim().ledger({ tag: team, holders: [key, project] });
    assert.deepEqual([k1!.live, p1!.live], [1, 4]);
    t.r.hold.settle(3);
    const [k2, p2] = await lim().ledger({ tag: team, holders: [key, project] });
    assert.deepEqual([k2!.live, p2!.live], [1, 3]);
    // Enforced: the key refuses at once; the project has exactly 7 left.
    const enforced = await lim().hold({ tag: team, holders: [project], amount: 7 });
    assert.ok(enforced.ok);
    const over = await lim().hold({ tag: team, holders: [project], amount: 0.01 });
    assert.deepEqual(over.ok ? null : over.code, 'project_budget_exhausted');
    enforced.hold.settle(0);
    const keyOnly = await lim().hold({ tag: team, holders: [key], amount: 0 });
    assert.deepEqual(keyOnly.ok ? null : keyOnly.code, 'key_budget_exhausted');
  });
}

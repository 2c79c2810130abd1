import assert from 'node:assert/strict';
import { test } from 'node:test';
import { bucketLevel, concurrencyWaitMs, fullAgainMs, refillWaitMs, tpmAdmits } from '../../src/limits/bucket.js';
import { MemoryClaims } from '../../src/limits/claims-memory.js';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import { denied, input, leaseOf, runLimiterConformance, uid } from '../helpers/redis-limits-conformance.js';

function fakeClock(start = 1_700_000_000_000): { now: () => number; advance: (ms: number) => void } {
  let t = start;
  return { now: () => t, advance: (ms) => void (t += ms) };
}

runLimiterConformance('memory (fake clock)', async () => {
  const clock = fakeClock();
  const leaseMs = 300;
  // No refresh timer: with a fake clock the tests drive refreshLeases themselves.
  const limiter = createMemoryLimiter({ now: clock.now, leaseMs, refreshEveryMs: 0 });
  return {
    limiter,
    shortLease: limiter, // time only moves when a test moves it
    leaseMs,
    passTime: async (ms) => clock.advance(ms),
    close: () => limiter.close(),
  };
});

test('memory: RPM refills continuously at N per minute', async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 30_000 });
  const key = uid('k');
  const limits = { rpm: 2 };
  leaseOf(await lim.admit(input(key, { limits })));
  leaseOf(await lim.admit(input(key, { limits })));
  assert.equal(denied(await lim.admit(input(key, { limits })), 'rpm_exceeded'), 30_000);
  clock.advance(29_999);
  assert.equal(denied(await lim.admit(input(key, { limits })), 'rpm_exceeded'), 1);
  clock.advance(1);
  leaseOf(await lim.admit(input(key, { limits })));
  denied(await lim.admit(input(key, { limits })), 'rpm_exceeded');
  // A long pause refills to capacity, never beyond.
  clock.advance(10 * 60_000);
  for (let i = 0; i < 2; i++) leaseOf(await lim.admit(input(key, { limits })));
  denied(await lim.admit(input(key, { limits })), 'rpm_exceeded');
  await lim.close();
});

test('memory: a TPM bucket one token short of the reservation refuses it until that token is back', async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 30_000 });
  const key = uid('k');
  const limits = { tpm: 1000 };
  leaseOf(await lim.admit(input(key, { limits, tokens: 901 }))).finish({ tokens: null });
  // 99 left, 100 asked: one token (60 ms at 1000 a minute) short. Off by one, it would admit.
  assert.equal(denied(await lim.admit(input(key, { limits, tokens: 100 })), 'tpm_exceeded'), 60);
  clock.advance(59);
  assert.equal(denied(await lim.admit(input(key, { limits, tokens: 100 })), 'tpm_exceeded'), 1);
  clock.advance(1);
  leaseOf(await lim.admit(input(key, { limits, tokens: 100 }))).finish({ tokens: null });
  await lim.close();
});

// The conformance suite's cancel test limits the key alone: these check the route's and a
// per-model limit's RPM token come back too. No time passes, so only the undo can admit the second.
test("memory: cancel gives the route's RPM token back, as it does the key's", async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 30_000 });
  const route = { name: uid('route'), concurrency: 0, rpm: 1 };
  leaseOf(await lim.admit(input(uid('k'), { route }))).cancel();
  leaseOf(await lim.admit(input(uid('k'), { route }))).finish({ tokens: null });
  denied(await lim.admit(input(uid('k'), { route })), 'route_capacity_exceeded');
  await lim.close();
});

test("memory: cancel gives a per-model limit's RPM token back", async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 30_000 });
  const model = { ...input(uid('k')), modelLimit: { pattern: 'gpt-4o*', rpm: 1, tpm: null } };
  leaseOf(await lim.admit(model)).cancel();
  leaseOf(await lim.admit(model)).finish({ tokens: null });
  denied(await lim.admit(model), 'rpm_exceeded');
  await lim.close();
});

test('memory: concurrency retry-after is the soonest lease expiry, at most 1 s', async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 5_000, refreshEveryMs: 0 });
  const key = uid('k');
  const limits = { concurrency: 1 };
  leaseOf(await lim.admit(input(key, { limits })));
  assert.equal(denied(await lim.admit(input(key, { limits })), 'concurrency_exceeded'), 1_000);
  clock.advance(4_700);
  assert.equal(denied(await lim.admit(input(key, { limits })), 'concurrency_exceeded'), 300);
  clock.advance(300);
  leaseOf(await lim.admit(input(key, { limits })));
  await lim.close();
});

test('memory: the default lease refresh timer keeps slots and stops when none are held', async () => {
  let t = 0;
  const lim = createMemoryLimiter({ now: () => t, leaseMs: 60, refreshEveryMs: 5 });
  const key = uid('k');
  assert.equal(lim.refreshing(), false, 'no timer before any lease');
  const lease = leaseOf(await lim.admit(input(key, { limits: { concurrency: 1 } })));
  assert.equal(lim.refreshing(), true);
  // Let the real timer run a few times while the fake clock moves within each lease period.
  for (let i = 0; i < 6; i++) {
    t += 40;
    await new Promise((r) => setTimeout(r, 15));
  }
  denied(await lim.admit(input(key, { limits: { concurrency: 1 } })), 'concurrency_exceeded');
  lease.finish({ tokens: null });
  assert.equal(lim.stats().slotsHeld, 0);
  assert.equal(lim.refreshing(), false, 'the timer stops once no lease is held');
  await lim.close();
});

test('memory: state for idle keys is dropped a window after their buckets were last written', async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 1_000, refreshEveryMs: 0 });
  for (let i = 0; i < 1100; i++) {
    const r = await lim.admit(input(`idle-${i}`, { limits: { rpm: 60, concurrency: 1 }, tokens: 1 }));
    leaseOf(r).finish({ tokens: null });
    clock.advance(1_000);
  }
  // The sweep ran (every 1024 admissions): keys idle for more than a window are gone.
  assert.ok(lim.entries() < 300, `entries after the sweep: ${lim.entries()}`);
  // Nothing observable breaks: an old key admits again with a full bucket.
  for (let i = 0; i < 60; i++) leaseOf(await lim.admit(input('idle-0', { limits: { rpm: 60 } })));
  denied(await lim.admit(input('idle-0', { limits: { rpm: 60 } })), 'rpm_exceeded');
  await lim.close();
});

test('bucket math', () => {
  assert.equal(bucketLevel(undefined, 10, 0), 10);
  assert.equal(bucketLevel({ tokens: 0, ts: 0 }, 60, 500), 0.5);
  assert.equal(bucketLevel({ tokens: 5, ts: 0 }, 10, 60_000), 10);
  assert.equal(refillWaitMs(0, 1, 60), 1_000);
  assert.equal(refillWaitMs(0.5, 1, 60), 500);
  assert.equal(fullAgainMs(0, 60), 60_000);
  assert.ok(tpmAdmits(10, 5000, 10), 'a full bucket admits an oversized request');
  assert.ok(!tpmAdmits(9, 5000, 10));
  assert.ok(tpmAdmits(-50, 0, 10), 'a zero reservation is never held back');
  assert.equal(concurrencyWaitMs(undefined, 0), 1_000);
  assert.equal(concurrencyWaitMs(1_250, 1_000), 250);
});

test('memory claims: bounded; past the bound the expired go first, then the holders claimed longest ago', () => {
  let t = 0;
  const claims = new MemoryClaims(() => t, 3);
  const at = (holder: string, ttlMs = 1_000) => ({ tag: 'tag', holder, epoch: 0, name: 'alert:0.8', token: 'mine', ttlMs });
  const other = (holder: string) => ({ ...at(holder), token: 'theirs' });
  assert.equal(claims.claim(at('a', 10)), 'claimed');
  assert.equal(claims.claim(at('b')), 'claimed');
  assert.equal(claims.claim(at('c')), 'claimed');
  t = 20; // a's claim has expired
  assert.equal(claims.claim(at('d')), 'claimed');
  assert.equal(claims.size(), 3);
  assert.equal(claims.claim(other('b')), 'taken', 'b was kept: a had expired');
  assert.equal(claims.claim(at('e')), 'claimed');
  assert.equal(claims.size(), 3);
  assert.equal(claims.claim(other('b')), 'claimed', 'b, claimed longest ago, was dropped to make room');
  assert.equal(claims.claim(other('d')), 'taken');
});

test('memory: a raised limit finds the level its bucket had; a lowered TPM keeps the debt (DESIGN section 12)', async () => {
  const clock = fakeClock();
  const lim = createMemoryLimiter({ now: clock.now, leaseMs: 30_000 });
  const key = uid('k');
  leaseOf(await lim.admit(input(key, { limits: { rpm: 60 } }))).finish({ tokens: null });
  clock.advance(1_500); // the bucket (59 of 60) would have been full again at 60 after 1 s
  let admitted = 0;
  while ((await lim.admit(input(key, { limits: { rpm: 600 } }))).ok) admitted++;
  assert.equal(admitted, 74, '59 left, and 1.5 s at 10 a second');

  const debtor = uid('k');
  leaseOf(await lim.admit(input(debtor, { limits: { tpm: 60_000 }, tokens: 100 }))).finish({ tokens: 61_000 });
  clock.advance(20_000); // refilled at the lowered 600 a minute: -1,000 + 200
  denied(await lim.admit(input(debtor, { limits: { tpm: 600 }, tokens: 10 })), 'tpm_exceeded');
  clock.advance(58_000); // past the 61 s it would have taken at 60,000: at 600, -1,000 + 780 = -220
  denied(await lim.admit(input(debtor, { limits: { tpm: 600 }, tokens: 10 })), 'tpm_exceeded');
  clock.advance(24_000); // +240: 20
  assert.equal((await lim.admit(input(debtor, { limits: { tpm: 600 }, tokens: 10 }))).ok, true);
  await lim.close();
});

test('memory claims: a pending claim is held for its claimer, renewed, done for good, released or taken over once lapsed (claim.lua\'s rules)', () => {
  const clock = fakeClock();
  const claims = new MemoryClaims(clock.now);
  const at = { tag: 't', holder: 'key:k_1', epoch: 1, name: 'alert:0.8', ttlMs: 60_000, pendingMs: 100 };
  assert.equal(claims.claim({ ...at, token: 'a' }), 'claimed');
  assert.equal(claims.claim({ ...at, token: 'b' }), 'held');
  clock.advance(80);
  assert.equal(claims.claim({ ...at, token: 'b', turn: 'renew' }), 'held', 'a turn by another token changes nothing');
  assert.equal(claims.claim({ ...at, token: 'a', turn: 'renew' }), 'claimed');
  clock.advance(80);
  assert.equal(claims.claim({ ...at, token: 'b' }), 'held', 'renewed at 80: still a\'s at 160');
  clock.advance(30);
  assert.equal(claims.claim({ ...at, token: 'b' }), 'claimed', 'lapsed: taken over');
  assert.equal(claims.claim({ ...at, token: 'a', turn: 'done' }), 'held', 'a no longer holds it: b does, pending');
  assert.equal(claims.claim({ ...at, token: 'b', turn: 'release' }), 'claimed');
  assert.equal(claims.claim({ ...at, token: 'c' }), 'claimed', 'released: taken over at once');
  assert.equal(claims.claim({ ...at, token: 'c', turn: 'done' }), 'claimed');
  clock.advance(1_000);
  assert.equal(claims.claim({ ...at, token: 'd' }), 'taken', 'done: for good');
  assert.equal(claims.claim({ ...at, token: 'c' }), 'claimed', 'its claimer asking again');
  assert.equal(claims.claim({ ...at, token: 'd' }), 'taken', 'and not pending again');
  assert.equal(claims.claim({ ...at, epoch: 0, token: 'c', turn: 'done' }), 'taken', 'a turn for an older epoch');
  assert.equal(claims.claimedBy({ tag: 't', holder: 'wallet:u', epoch: 1, name: 'start', token: '5', ttlMs: 60_000 }), '5');
  clock.advance(50_000);
  assert.equal(claims.claimedBy({ tag: 't', holder: 'wallet:u', epoch: 1, name: 'start', token: '6', ttlMs: 60_000 }), '5', 'a claim without pendingMs is for good');
});

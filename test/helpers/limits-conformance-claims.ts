/**
 * Conformance, part four: claims (Limiter.claimOnce, budget alerts, DESIGN section 13) and
 * the ledger figures the alerts read (the epoch they belong to, the figure at its start).
 * Registered inside runLimiterConformance's suite; every test uses its own tag.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ClaimInput, ClaimResult, Limiter } from '../../src/limits/limiter.js';
import { keyBudget, wallet } from './limits-conformance-ledger.js';
import { type Harness, uid } from './redis-limits-conformance.js';

const DAY_MS = 86_400_000;
const claim = (o: Partial<ClaimInput> & Pick<ClaimInput, 'tag' | 'holder'>): ClaimInput => ({ epoch: 0, name: 'alert:0.8', token: uid('tok'), ttlMs: DAY_MS, ...o });

const count = (rs: ClaimResult[], r: ClaimResult): number => rs.filter((x) => x === r).length;

export function claimConformance(get: () => Harness): void {
  test('claims: twenty claimers at once, one is granted; the same token again is granted again, another is not', async () => {
    const h = get();
    const peer = h.peer ? await h.peer({ shortLease: false }) : null;
    const lims: Limiter[] = peer ? [h.limiter, peer.limiter] : [h.limiter];
    try {
      const at = { tag: uid('tag'), holder: `key:${uid('k')}` };
      const asks = Array.from({ length: 20 }, (_, i) => claim({ ...at, token: `t${i}` }));
      const rs = await Promise.all(asks.map((c, i) => lims[i % lims.length]!.claimOnce(c)));
      assert.equal(count(rs, 'claimed'), 1, rs.join());
      assert.equal(count(rs, 'taken'), 19);
      const winner = asks[rs.indexOf('claimed')]!;
      // A retry of the winner (its answer lost) is granted; any other claimer still is not.
      assert.equal(await lims.at(-1)!.claimOnce(winner), 'claimed');
      assert.equal(await h.limiter.claimOnce(claim({ ...at })), 'taken');
      // Another name of the same holder and epoch is a claim of its own.
      assert.equal(await h.limiter.claimOnce(claim({ ...at, name: 'alert:0.95' })), 'claimed');
    } finally {
      await peer?.limiter.close();
      await peer?.crash();
    }
  });

  test('claims: a newer epoch arms every name again; an older one is refused once a newer is claimed', async () => {
    const lim = get().limiter;
    const at = { tag: uid('tag'), holder: `wallet:${uid('u')}` };
    assert.equal(await lim.claimOnce(claim({ ...at, epoch: 3 })), 'claimed');
    assert.equal(await lim.claimOnce(claim({ ...at, epoch: 3 })), 'taken');
    assert.equal(await lim.claimOnce(claim({ ...at, epoch: 4 })), 'claimed');
    assert.equal(await lim.claimOnce(claim({ ...at, epoch: 4, name: 'alert:1' })), 'claimed');
    // A lagging replica's older epoch: its figures are stale, so it claims nothing.
    assert.equal(await lim.claimOnce(claim({ ...at, epoch: 3, name: 'alert:0.95' })), 'taken');
    // Holders and tags are apart: the same holder id under another tag has its own claims.
    assert.equal(await lim.claimOnce(claim({ ...at, tag: uid('tag'), epoch: 4 })), 'claimed');
  });

  test('claims: kept for ttlMs after the last claim, then forgotten', async () => {
    const h = get();
    const at = { tag: uid('tag'), holder: `project:${uid('p')}` };
    // A second between the first two calls: room for a stalled machine on real Redis.
    assert.equal(await h.limiter.claimOnce(claim({ ...at, ttlMs: 1_000 })), 'claimed');
    assert.equal(await h.limiter.claimOnce(claim({ ...at, ttlMs: 1_000 })), 'taken');
    await h.passTime(1_100);
    assert.equal(await h.limiter.claimOnce(claim({ ...at, ttlMs: 1_000 })), 'claimed');
  });

  test('ledger figures name their epoch and the figure at its start, a newer stored epoch over a lagging replica', async () => {
    const lim = get().limiter;
    const tag = uid('tag');
    const u = uid('u');
    const w3 = wallet(u, { base: 10, epoch: 3 });
    const hold = await lim.hold({ tag, holders: [w3], amount: 2 });
    assert.ok(hold.ok);
    hold.hold.settle(1.5);
    // The console has counted part of it: the replica says 9.
    let [fig] = await lim.ledger({ tag, holders: [wallet(u, { base: 9, epoch: 3 })] });
    assert.deepEqual(fig, { id: `wallet:${u}`, live: 8.5, epoch: 3, start: 10 });
    // A replica still at epoch 2 reads the stored epoch's figures.
    [fig] = await lim.ledger({ tag, holders: [wallet(u, { base: 4, epoch: 2 })] });
    assert.deepEqual(fig, { id: `wallet:${u}`, live: 8.5, epoch: 3, start: 10 });
    // A newer epoch (a top-up) starts from the replica's figure.
    [fig] = await lim.ledger({ tag, holders: [wallet(u, { base: 20, epoch: 4 })] });
    assert.deepEqual(fig, { id: `wallet:${u}`, live: 20, epoch: 4, start: 20 });
    // No ledger yet: the replica's figure, at the holder's epoch.
    const k = keyBudget(uid('k'), { base: 3, limit: 10, epoch: 7 });
    assert.deepEqual(await lim.ledger({ tag, holders: [k] }), [{ id: k.id, live: 3, epoch: 7, start: 3 }]);
  });
}

/**
 * Settlements survive a Redis blip (settle-batch.ts): a call that failed for want of Redis is
 * sent again, and a call Redis ran after all (past its deadline, or with its answer lost) is
 * not applied a second time. Against a real Redis, through a TCP proxy that holds or drops
 * its bytes.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { Redis } from 'ioredis';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { deleteByPrefix } from '../helpers/redis-harness.js';
import { startFreezeProxy, type FreezeProxy } from '../helpers/freeze-proxy.js';
import { createRedisClient } from '../../src/limits/redis/client.js';
import { Deadlines } from '../../src/limits/redis/deadlines.js';
import { scriptRunner, type RunScript } from '../../src/limits/redis/scripts.js';
import { hashSlot } from '../../src/limits/redis/hash-slot.js';
import { createSettleBatch, type SettleOp } from '../../src/limits/redis/settle-batch.js';

const prefix = `kwretry${process.pid}`;
const tag = `{${prefix}:k:a}`;
let direct: Redis;
let proxy: FreezeProxy;
let viaProxy: ReturnType<typeof createRedisClient>;

before(async () => {
  direct = new Redis(TEST_REDIS_URL);
  proxy = await startFreezeProxy({ target: new URL(TEST_REDIS_URL) });
  viaProxy = createRedisClient({ url: proxy.url, timeoutMs: 200 });
  await once(viaProxy, 'ready');
});
after(async () => {
  viaProxy.disconnect();
  proxy.close();
  await deleteByPrefix(direct, prefix);
  direct.disconnect();
});

/**
 * The client's next 'ready'. Not events.once, which rejects on an 'error' first: a cut
 * connection whose unread bytes make the kernel answer with a reset is such an error, and
 * the client reconnects after it.
 */
const readyAgain = (): Promise<void> => new Promise((resolve) => viaProxy.once('ready', () => resolve()));

/** The level bucket.lua stored for `key` (absent: never written). */
const level = async (key: string): Promise<number | null> => {
  const t = await direct.hget(key, 't');
  return t === null ? null : Number(t);
};

/** A settlement that charges a whole bucket of 1,000 (to about 0; twice would be about -1,000) and frees a slot. */
function chargeAndFree(name: string, owner: (err: unknown) => void): Extract<SettleOp, { kind: 'buckets' }> & { bucket: string; set: string } {
  const bucket = `${tag}:tpm:${name}`;
  const set = `${tag}:conc:${name}`;
  return { kind: 'buckets', tag, leaseId: `lease-${name}`, buckets: [{ key: bucket, cap: 1_000, delta: -1_000 }], sets: [set], owner, bucket, set };
}

/** `run` through the proxy, bounded at 200 ms, counting calls and telling of each answered one. */
function countedRun(): { run: RunScript; calls: () => number; answered: () => Promise<void> } {
  const real = scriptRunner(viaProxy, new Deadlines({ timeoutMs: 200 }));
  let calls = 0;
  let waiter: (() => void) | null = null;
  const run: RunScript = (name, keys, args) => {
    calls++;
    const p = real(name, keys, args);
    p.then(() => waiter?.(), () => undefined);
    return p;
  };
  return { run, calls: () => calls, answered: () => new Promise<void>((r) => (waiter = r)) };
}

/**
 * One settlement (chargeAndFree) of a held slot, sent at once into a frozen link by a batch
 * that resends after `retryFirstMs`; `failed` is the first error its owner hears.
 */
async function sentIntoBlip(name: string, retryFirstMs = 20) {
  const counted = countedRun();
  let owner!: (err: unknown) => void;
  const failed = new Promise<unknown>((r) => (owner = r));
  const batch = createSettleBatch({ run: counted.run, cluster: false, prefix, everyMs: 1, retryFirstMs });
  const op = chargeAndFree(name, owner);
  await direct.zadd(op.set, Date.now() + 60_000, op.leaseId);
  proxy.frozen = true;
  batch.add(op);
  batch.flush();
  return { counted, batch, op, failed };
}

test('one call sent twice under its id is applied once', async () => {
  const run = scriptRunner(direct);
  const bucket = `${tag}:tpm:twice`;
  const call = [[`${tag}:settled:twice`, bucket], [7, 60_000, 1, 'b', 'lease-x', '', 1, 0, 1_000, -1_000]] as const;
  assert.deepEqual(await run('keywardSettle', [...call[0]], [...call[1]]), [1]);
  assert.deepEqual(await run('keywardSettle', [...call[0]], [...call[1]]), [0], 'applied nothing the second time');
  const ttl = await direct.pttl(call[0][0]);
  assert.ok(ttl > 0 && ttl <= 60_000, `the record is forgotten: ${ttl}`);
  assert.ok((await level(bucket))! > -500, `charged once: ${await level(bucket)}`);
  // without an id every send applies: what the id is for
  await run('keywardSettle', [bucket], ['', 0, 1, 'b', 'lease-x', '', 1, 0, 1_000, -1_000]);
  assert.ok((await level(bucket))! < -500);
});

test('a settlement Redis ran after its deadline is not applied again when it is resent', { timeout: 10_000 }, async () => {
  const { counted, batch, op, failed } = await sentIntoBlip('late');
  assert.equal((await failed as Error).name, 'CallTimeoutError');
  const resent = counted.answered();
  proxy.thaw(); // Redis runs the first send now, and the resend follows it
  await resent;
  await batch.close();
  assert.equal(counted.calls(), 2);
  assert.equal(await direct.zscore(op.set, op.leaseId), null, 'the slot is free');
  const lvl = (await level(op.bucket))!;
  assert.ok(lvl > -500 && lvl < 500, `charged once, not twice: ${lvl}`);
});

test('a settlement lost with its connection is applied once Redis is back', { timeout: 10_000 }, async () => {
  const { counted, batch, op, failed } = await sentIntoBlip('lost');
  await failed;
  const applied = counted.answered();
  proxy.cut(); // the first send never reaches Redis; the client reconnects
  await applied;
  await batch.close();
  assert.ok(counted.calls() >= 2);
  assert.equal(await direct.zscore(op.set, op.leaseId), null, 'the slot is free');
  const lvl = (await level(op.bucket))!;
  assert.ok(lvl > -500 && lvl < 500, `charged once: ${lvl}`);
});

test('closing sends a waiting settlement once more at once, and waits for it', { timeout: 10_000 }, async () => {
  // a first resend 30 s away: only close() can send it before the test ends
  const { counted, batch, op, failed } = await sentIntoBlip('close', 30_000);
  await failed;
  const back = readyAgain();
  proxy.cut();
  await back;
  await batch.close();
  assert.equal(counted.calls(), 2);
  assert.equal(await direct.zscore(op.set, op.leaseId), null, 'the slot is free');
});

test('on a Cluster a blip leaves a call per hash slot: every one is sent again, however many slots', { timeout: 30_000 }, async () => {
  // Cluster batching over the single node: one call per hash slot of the operations' tags
  const counted = countedRun();
  let owner!: (err: unknown) => void;
  const failed = new Promise<unknown>((r) => (owner = r));
  const batch = createSettleBatch({ run: counted.run, cluster: true, prefix, everyMs: 1, retryFirstMs: 20 });
  const ops = Array.from({ length: 2_000 }, (_, i) => {
    const t = `{${prefix}:k:slot${i}}`;
    return { kind: 'buckets' as const, tag: t, leaseId: `lease-${i}`, buckets: [], sets: [`${t}:conc`], owner };
  });
  const seed = direct.pipeline();
  for (const op of ops) seed.zadd(op.sets[0]!, Date.now() + 60_000, op.leaseId);
  await seed.exec();
  proxy.frozen = true;
  for (const op of ops) batch.add(op);
  batch.flush();
  // CRC16 over tags that differ only in their last digits spreads them unevenly: count the slots.
  const slots = new Set(ops.map((op) => hashSlot(op.tag))).size;
  assert.ok(slots > 1_000, `${slots} hash slots`);
  assert.equal(counted.calls(), slots, 'one call per hash slot');
  await failed;
  const back = readyAgain();
  proxy.cut();
  await back;
  await batch.close();
  const left = direct.pipeline();
  for (const op of ops) left.zcard(op.sets[0]!);
  const held = (await left.exec())!.filter(([, n]) => n !== 0).length;
  assert.equal(held, 0, 'every slot freed');
});

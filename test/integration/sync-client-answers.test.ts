/**
 * Console answers the sync client must not take at their word (DESIGN section 7): a changes
 * answer older than the replica (a console restored from a backup) is followed by a
 * snapshot; a change page too large to read on the event loop is replaced by a snapshot;
 * data that cannot be applied is retried slowly, logged as an error; a change batch that can
 * never be applied is followed by a snapshot, not asked for again from the same cursor,
 * and pages that keep failing after each snapshot are asked for ever less often.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { MAX_CHANGES_BYTES } from '../../src/sync/bodies.js';
import type { LogSink } from '../../src/log.js';
import type { ConsoleFixture } from '../helpers/console-fixture.js';
import { syncTestBed, type SyncTestBed } from '../helpers/sync-bed.js';
import { lookupSecret, sha256, until } from '../helpers/console-replica.js';

let bed: SyncTestBed;
let fx: ConsoleFixture;

before(async () => {
  bed = await syncTestBed('sync-answers');
  ({ fx } = bed);
  await fx.api('PUT', '/admin/v1/wallets/ann', { body: { balance: 5 } });
});
after(() => bed.close());

type Line = { level: keyof LogSink; fields: Record<string, unknown>; msg: string };

/** A client into a new replica, fetching through `through`, logging into `lines`; `random` is its backoff's jitter. */
function client(name: string, through: typeof fetch, random?: () => number) {
  const lines: Line[] = [];
  const at = (level: keyof LogSink) => (fields: object, msg = '') => void lines.push({ level, fields: fields as Record<string, unknown>, msg });
  const log: LogSink = { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
  const backoff = { baseMs: 20, maxMs: 100, ...(random ? { random } : {}) };
  const { replica, client: c } = bed.sidecar(name, { waitMs: 500, backoff, fetch: through, log });
  return { replica, client: c, lines };
}

/** Answers the next changes call with `answer(after)` instead of the console's, once. */
function replacingNextChanges(answer: (after: number) => Response) {
  let armed = false;
  const through: typeof fetch = (input, init) => {
    const url = String(input);
    if (!armed || !url.includes('/sync/v1/changes')) return fetch(input, init);
    armed = false;
    return Promise.resolve(answer(Number(new URL(url).searchParams.get('after'))));
  };
  return { through, arm: () => (armed = true) };
}

test('a changes answer older than the replica (a restored console) is followed by a snapshot', async () => {
  const swap = replacingNextChanges((after) => Response.json({ version: after - 1, changes: [] }));
  const { client: c, lines } = client('older', swap.through);
  await c.start();
  const snapshots = c.status().snapshots;
  swap.arm();
  // a change the console makes meanwhile, so the next long poll answers at once
  await fx.api('PUT', '/admin/v1/wallets/ann', { body: { balance: 6 } });
  assert.ok(await until(() => c.status().snapshots === snapshots + 1), 'a snapshot follows the older answer');
  assert.ok(lines.some((l) => l.level === 'warn' && /older than the replica/.test(l.msg)));
  assert.equal(c.status().failures, 0);
});

test('a change page larger than the sidecar reads on its event loop is replaced by a snapshot', async () => {
  const swap = replacingNextChanges((after) => Response.json({ version: after + 1, changes: [], padding: 'x'.repeat(MAX_CHANGES_BYTES) }));
  const { replica, client: c, lines } = client('large', swap.through);
  await c.start();
  const snapshots = c.status().snapshots;
  swap.arm();
  const k = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'ann' } })).body as { secret: string };
  assert.ok(await until(() => c.status().snapshots === snapshots + 1), 'a snapshot replaces the page');
  assert.ok(await until(() => lookupSecret(replica, k.secret) !== null), 'what the page held arrives');
  assert.ok(lines.some((l) => l.level === 'info' && /too large/.test(l.msg)));
  assert.equal(c.status().failures, 0);
});

test('a snapshot that cannot be applied is an error, retried after seconds rather than the console-away backoff', async () => {
  let corrupt = true;
  const tamper: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    if (!corrupt || !String(input).includes('/snapshot')) return res;
    return new Response((await res.text()).replace(/"balance":[0-9.]+/, '"balance":"lots"'), { status: 200 });
  };
  const { client: c, lines } = client('unusable', tamper);
  void c.start();
  assert.ok(await until(() => lines.some((l) => /console sync failed/.test(l.msg))));
  const failure = lines.find((l) => /console sync failed/.test(l.msg))!;
  assert.equal(failure.level, 'error');
  // 2 s doubling, with equal jitter: the first retry 1 to 2 s away (the console-away backoff here is at most 100 ms)
  assert.ok((failure.fields.retryInMs as number) >= 1000, String(failure.fields.retryInMs));
  corrupt = false;
  assert.ok(await until(() => c.status().connected, 5000), 'recovers once the console sends a good snapshot');
});

/** A key record for `user` with `hash`, whatever the console holds. */
const keyRecord = (id: string, user: string, hash: string) => ({
  type: 'key', id, hash, kind: 'personal', user, project: null, status: 'active', budget: null, spent: 0,
  models: null, routing: null, rpm: null, tpm: null, concurrency: null,
});

test('a change batch that can never be applied (a record that does not validate) is followed by a snapshot', async () => {
  const swap = replacingNextChanges((after) => Response.json({ version: after + 1, changes: [{ op: 'upsert', ...keyRecord('k_bad', 'ann', 'not-a-hash') }] }));
  const { replica, client: c, lines } = client('invalid', swap.through);
  await c.start();
  const snapshots = c.status().snapshots;
  swap.arm();
  await fx.api('PUT', '/admin/v1/wallets/ann', { body: { balance: 7 } });
  assert.ok(await until(() => lines.some((l) => /console sync failed/.test(l.msg))), 'the bad batch is a failure');
  assert.equal(replica.db.prepare("SELECT COUNT(*) FROM keys WHERE id = 'k_bad'").pluck().get(), 0, 'nothing of the bad batch applied');
  // The console would send the same page from the same cursor again: only a snapshot gets past
  // it. It comes after the unusable-data retry (1 to 2 s); the bound leaves room for a loaded machine.
  assert.ok(await until(() => c.status().snapshots === snapshots + 1, 10_000), 'a snapshot follows the batch that cannot apply');
  assert.ok(await until(() => c.status().connected, 5000));
});

test('a change batch the replica cannot apply (two keys with one hash) is followed by a snapshot, not retried from the same cursor', async () => {
  const taken = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'ann' } })).body as { secret: string };
  const hash = sha256(taken.secret);
  // valid on its own, but its hash is another key's: the replica's unique index refuses it
  const swap = replacingNextChanges((after) => Response.json({ version: after + 1, changes: [{ op: 'upsert', ...keyRecord('k_clash', 'ann', hash) }] }));
  const { replica, client: c } = client('clash', swap.through);
  await c.start();
  assert.ok(replica.lookup(hash), 'the key whose hash the batch reuses');
  const snapshots = c.status().snapshots;
  swap.arm();
  await fx.api('PUT', '/admin/v1/wallets/ann', { body: { balance: 8 } });
  assert.ok(await until(() => c.status().snapshots === snapshots + 1, 10_000), 'a snapshot follows the batch that cannot apply');
  assert.equal(replica.db.prepare("SELECT COUNT(*) FROM keys WHERE id = 'k_clash'").pluck().get(), 0);
});

test('a console whose every change page cannot be applied is asked for snapshots ever less often, not every 2 s', async () => {
  const bad: typeof fetch = (input, init) =>
    String(input).includes('/sync/v1/changes')
      ? Promise.resolve(Response.json({ version: Number(new URL(String(input)).searchParams.get('after')) + 1, changes: [{ op: 'upsert', ...keyRecord('k_bad2', 'ann', 'not-a-hash') }] }))
      : fetch(input, init);
  // No jitter: the unusable-data backoff's steps are 1 s, 2 s, 4 s...
  const { client: c, lines } = client('invalid-always', bad, () => 0);
  await c.start();
  const failures = () => lines.filter((l) => /console sync failed/.test(l.msg));
  assert.ok(await until(() => failures().length >= 2, 10_000), 'two failures, with a snapshot between them');
  assert.deepEqual(failures().map((l) => l.fields.retryInMs), [1000, 2000], 'the snapshot between them did not start the backoff over');
  assert.ok(c.status().snapshots >= 2);
  await c.stop();
});

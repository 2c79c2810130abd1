/**
 * The usage ledger's id of an event sent without an event_id: a digest of the whole event.
 * `estimated` is part of it only when true, so an estimate and a measured report of the
 * same request are two events, while every event without the flag keeps the id it had
 * before the flag existed (a batch retried across an upgrade is still seen as a repeat).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { openConsoleDb, type DB } from '../../src/console/db.js';
import { ChangeFeed } from '../../src/console/feed.js';
import { makePricer } from '../../src/console/pricing.js';
import { ConsoleStore } from '../../src/console/store.js';
import { ingestUsage } from '../../src/console/usage.js';
import type { UsageEvent } from '../../src/protocol/usage.js';

let dir: string;
let db: DB;
let store: ConsoleStore;
// One token in or out costs 1e-6, so a billed event is easy to count.
const pricer = makePricer({ models: [], unpriced: { inputPerMillion: 1, outputPerMillion: 1 } });

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-usage-digest-'));
  db = openConsoleDb(join(dir, 'console.sqlite'));
  const feed = new ChangeFeed({ db, retain: 1000, maxBatch: 100 });
  store = new ConsoleStore({ db, masterKey: randomBytes(32), hasher: makeKeyHasher({ hash: 'sha256' }), feed });
  store.createProject({ id: 'p_digest' });
});
after(() => {
  db.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The digest as it was before `estimated`: sha256 (hex) of the JSON array of these seven fields, in this order. */
function digestWithoutEstimated(ev: UsageEvent): string {
  const fields = [ev.request_id, ev.key_id, ev.model, ev.input_tokens, ev.output_tokens, ev.status, ev.at];
  return createHash('sha256').update(JSON.stringify(fields)).digest('hex');
}

const ledgerIds = (requestId: string) =>
  (db.prepare('SELECT event_id, estimated FROM usage WHERE request_id = ? ORDER BY estimated').all(requestId) as { event_id: string; estimated: number }[]);

function newKey(): string {
  return store.createKey({ kind: 'team', project: 'p_digest' }).key.id;
}

test('two events identical but for estimated: true are two events, each billed', () => {
  const keyId = newKey();
  const measured: UsageEvent = { request_id: 'r-twin', key_id: keyId, model: 'm', input_tokens: 100, output_tokens: 50, status: 200, at: '2025-01-02T03:04:05.000Z' };
  const estimated: UsageEvent = { ...measured, estimated: true };

  const r = ingestUsage({ store, pricer, events: [measured, estimated] });
  assert.deepEqual([r.accepted, r.duplicates, r.cost], [2, 0, 0.0003]);
  assert.equal(store.getKey(keyId).spent, 0.0003);
  const rows = ledgerIds('r-twin');
  assert.deepEqual(rows.map((x) => x.estimated), [0, 1]);
  assert.notEqual(rows[0]!.event_id, rows[1]!.event_id);

  // Each is still recognised on a retry.
  const again = ingestUsage({ store, pricer, events: [estimated, measured] });
  assert.deepEqual([again.accepted, again.duplicates], [0, 2]);
  assert.equal(store.getKey(keyId).spent, 0.0003);
});

test('an event without estimated keeps the id it had before the field existed; estimated: false is the same event', () => {
  const keyId = newKey();
  const ev: UsageEvent = { request_id: 'r-plain', key_id: keyId, model: null, input_tokens: 7, output_tokens: 0, status: 429, at: '2025-06-30T23:59:59.999Z' };

  assert.equal(ingestUsage({ store, pricer, events: [ev] }).accepted, 1);
  assert.deepEqual(ledgerIds('r-plain'), [{ event_id: digestWithoutEstimated(ev), estimated: 0 }]);

  const unset = ingestUsage({ store, pricer, events: [{ ...ev, estimated: false }] });
  assert.deepEqual([unset.accepted, unset.duplicates], [0, 1]);
  assert.equal(store.getKey(keyId).spent, 0.000007);
});

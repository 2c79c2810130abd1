/**
 * How often the sync client asks the console: a console answering "nothing new" at once is
 * not polled in a loop; after a failure the first poll asks without waiting; each return of
 * the console is announced (the usage pusher is nudged); a console that stays away is retried
 * at most 2 s apart. (sync-client.test.ts covers what reaches the replica.)
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import type { SyncClientOptions } from '../../src/sync/client.js';
import type { ConsoleFixture } from '../helpers/console-fixture.js';
import { syncTestBed, type SyncTestBed } from '../helpers/sync-bed.js';
import { until } from '../helpers/console-replica.js';

let bed: SyncTestBed;
let fx: ConsoleFixture;

before(async () => {
  bed = await syncTestBed('sync-retries');
  ({ fx } = bed);
});
after(() => bed.close());

/** A sync client into a new replica named `name`, fetching through `through`; stopped and closed after the file. */
const sidecar = (name: string, opts: Partial<SyncClientOptions> = {}) =>
  bed.sidecar(name, { waitMs: 1000, backoff: { baseMs: 200, maxMs: 400 }, ...opts });

test('a console answering "nothing new" at once, long before waitMs, is not polled in a tight loop', async (t) => {
  let calls = 0;
  let replicaVersion = () => 0;
  // A console that answers every changes call at once with the replica's own version and no
  // changes: one shutting down, or one that ignores waitMs. Snapshots come from the real one.
  const quick: Server = createServer((_req, res) => {
    calls++;
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ version: replicaVersion(), changes: [] }));
  });
  await new Promise<void>((r) => quick.listen(0, '127.0.0.1', r));
  t.after(() => new Promise<void>((r) => quick.close(() => r())));
  const quickUrl = `http://127.0.0.1:${(quick.address() as AddressInfo).port}`;
  const through: typeof fetch = (input, init) => {
    const url = String(input);
    return url.includes('/sync/v1/changes') ? fetch(quickUrl + url.slice(fx.url.length), init) : fetch(input, init);
  };
  const { replica, client } = sidecar('at-once', { fetch: through });
  replicaVersion = () => replica.status().version ?? 0;
  await client.start();
  assert.ok(await until(() => calls > 0));
  const from = calls;
  await new Promise((r) => setTimeout(r, 1000)); // a rate: calls per second of wall time
  assert.ok(calls - from <= 10, `${calls - from} change polls in a second`);
  assert.equal(client.status().connected, true, 'not a failure: the console answered');
  await client.stop();
});

test('after a failure the next poll asks without waiting (waitMs=0), so a returning console is seen at once', async () => {
  const waits: number[] = [];
  let down = false;
  const gate: typeof fetch = async (input, init) => {
    const url = String(input);
    if (url.includes('/sync/v1/changes')) waits.push(Number(new URL(url).searchParams.get('waitMs')));
    if (down) throw new Error('network down');
    return fetch(input, init);
  };
  const { client } = sidecar('after-failure', { fetch: gate });
  await client.start();
  assert.ok(await until(() => waits.length > 0));
  assert.equal(waits[0], 1000, 'connected: a long poll');
  down = true;
  assert.ok(await until(() => !client.status().connected));
  const failedAt = waits.length;
  down = false;
  assert.ok(await until(() => waits.length > failedAt && client.status().connected, 5000));
  assert.equal(waits[failedAt], 0, 'the first poll after the failure does not wait');
});

test('onConnected is called when the console is reached, and again each time it returns after a failure (the usage pusher is nudged)', async () => {
  let down = false;
  const gate: typeof fetch = async (input, init) => {
    if (down) throw new Error('network down');
    return fetch(input, init);
  };
  let connected = 0;
  const { client } = sidecar('nudged', { fetch: gate, waitMs: 200, backoff: { baseMs: 20, maxMs: 50 }, onConnected: () => connected++ });
  await client.start();
  assert.equal(connected, 1);
  down = true;
  assert.ok(await until(() => !client.status().connected));
  down = false;
  assert.ok(await until(() => client.status().connected));
  assert.equal(connected, 2);
});

test('console away: retries stay at most 2 s apart however long it stays away (the default cap)', async (t) => {
  // A console that hangs up on every connection (a port of its own, not one freed for the test).
  const gone = createNetServer((socket) => socket.destroy());
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
  t.after(() => new Promise<void>((r) => gone.close(() => r())));
  const url = `http://127.0.0.1:${(gone.address() as AddressInfo).port}`;
  const delays: number[] = [];
  const at = (fields: object, msg = '') => void (/console sync failed/.test(msg) && delays.push((fields as { retryInMs: number }).retryInMs));
  // the default backoff, its jitter at the low end: each delay is half the capped step
  const { client } = sidecar('away-cap', { url, waitMs: 200, backoff: { random: () => 0 }, log: { debug: at, info() {}, warn: at, error: at } });
  void client.start();
  assert.ok(await until(() => delays.length >= 6, 6000), `${delays.length} failures`);
  await client.stop();
  assert.deepEqual(delays.slice(0, 6), [125, 250, 500, 1000, 1000, 1000], 'doubling from 250 ms, capped at 2 s');
});

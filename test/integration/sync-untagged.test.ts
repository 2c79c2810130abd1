/**
 * The sync client and a console that names no history (an older or third-party console,
 * DESIGN section 7): no tag is stored or sent and sync goes on as before. A console that
 * starts naming its history has its tag kept beside the version and sent back on the next
 * poll; one that stops has it dropped.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { createSyncClient, type SyncClient } from '../../src/sync/client.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { lookupSecret, sha256, whenReplica } from '../helpers/console-replica.js';

const key = (id: string, status = 'active') => ({
  type: 'key', id, hash: sha256(`secret-${id}`), kind: 'personal', user: 'u_1', project: null, status,
  budget: null, spent: 0, models: null, routing: null, rpm: null, tpm: null, concurrency: null,
});

/**
 * A console of its own over node:http: a snapshot at version 1, then the batches the test
 * publishes, each answered to the long poll waiting for it. Every changes query is kept.
 */
class FakeConsole {
  readonly queries: URLSearchParams[] = [];
  private readonly batches: { version: number; body: string }[] = [];
  private readonly waiting = new Set<() => void>();
  private readonly server: Server;
  private readonly lookouts = new Set<() => void>();
  url = '';

  constructor() {
    this.server = createServer((req, res) => {
      const url = new URL(req.url ?? '/', 'http://fake');
      if (url.pathname === '/sync/v1/snapshot') {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.end(`${JSON.stringify({ type: 'meta', version: 1 })}\n${JSON.stringify({ type: 'wallet', user: 'u_1', balance: 5 })}\n${JSON.stringify(key('k_1'))}\n`);
        return;
      }
      if (url.pathname !== '/sync/v1/changes') return void res.writeHead(404).end();
      this.queries.push(url.searchParams);
      for (const look of [...this.lookouts]) look();
      this.answer(Number(url.searchParams.get('after')), Number(url.searchParams.get('waitMs')), res);
    });
  }

  async listen(): Promise<void> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** Publishes a batch at `version`, naming `tag` when given, to the polls after the version before it. */
  publish(version: number, changes: object[], tag?: string): void {
    this.batches.push({ version, body: JSON.stringify({ version, ...(tag === undefined ? {} : { tag }), changes }) });
    for (const wake of [...this.waiting]) wake();
  }

  /** Resolves with the first changes query `pred` accepts, once it has come. */
  query(pred: (q: URLSearchParams) => boolean): Promise<URLSearchParams> {
    return new Promise((resolve) => {
      const look = () => {
        const q = this.queries.find(pred);
        if (!q) return;
        this.lookouts.delete(look);
        resolve(q);
      };
      this.lookouts.add(look);
      look();
    });
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }

  private answer(after: number, waitMs: number, res: import('node:http').ServerResponse): void {
    const send = () => {
      const next = this.batches.find((b) => b.version > after);
      if (!next) return false;
      res.writeHead(200, { 'content-type': 'application/json' }).end(next.body);
      return true;
    };
    if (send()) return;
    const wake = () => {
      if (send()) done();
    };
    const done = () => {
      clearTimeout(timer);
      this.waiting.delete(wake);
    };
    const timer = setTimeout(() => {
      done();
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ version: after, changes: [] }));
    }, waitMs);
    this.waiting.add(wake);
    res.on('close', done);
  }
}

let fake: FakeConsole;
let dir: string;
let replica: ReplicaStore;
let client: SyncClient;

before(async () => {
  fake = new FakeConsole();
  await fake.listen();
  dir = mkdtempSync(join(tmpdir(), 'kw-sync-untagged-'));
  replica = new ReplicaStore({ path: join(dir, 'replica.sqlite') });
  client = createSyncClient({ url: fake.url, token: 'fake-sync-token', waitMs: 2000, target: replicaWriter(replica), backoff: { baseMs: 20, maxMs: 100 } });
});
after(async () => {
  await client.stop();
  await replica.close();
  await fake.close();
  rmSync(dir, { recursive: true, force: true });
});

test('a console that names no history: no tag kept or sent, and its changes apply as before', async () => {
  await client.start();
  assert.equal(replica.status().version, 1);
  assert.equal(replica.status().tag, null);
  fake.publish(2, [{ op: 'upsert', ...key('k_1', 'deleted') }]);
  await whenReplica(replica, () => replica.status().version === 2);
  assert.equal(lookupSecret(replica, 'secret-k_1')?.key.status, 'deleted');
  assert.equal(replica.status().tag, null);
  await fake.query((q) => q.get('after') === '2');
  assert.ok(fake.queries.length > 0);
  for (const q of fake.queries) assert.equal(q.has('tag'), false, q.toString());
  assert.equal(client.status().snapshots, 1);
});

test('a tag the console starts sending is kept and sent back; one it stops sending is dropped', async () => {
  const tagged = fake.query((q) => q.get('after') === '3');
  fake.publish(3, [{ op: 'upsert', ...key('k_2') }], 'history/1 é');
  await whenReplica(replica, () => replica.status().version === 3);
  assert.equal(replica.status().tag, 'history/1 é');
  assert.equal((await tagged).get('tag'), 'history/1 é', 'sent back, URL-encoded on the way');

  const untagged = fake.query((q) => q.get('after') === '4');
  fake.publish(4, [{ op: 'upsert', ...key('k_3') }]);
  await whenReplica(replica, () => replica.status().version === 4);
  assert.equal(replica.status().tag, null);
  assert.equal((await untagged).has('tag'), false);
  assert.ok(lookupSecret(replica, 'secret-k_3'));
  assert.equal(client.status().snapshots, 1, 'no snapshot taken for it');
});

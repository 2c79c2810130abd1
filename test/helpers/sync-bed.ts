/**
 * What the sync client tests share: a console fixture, a temp dir for replica files, and the
 * replicas and sync clients the tests open, all stopped and removed by `close`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { createSyncClient, type SyncClient, type SyncClientOptions } from '../../src/sync/client.js';
import { startConsoleFixture, type ConsoleFixture } from './console-fixture.js';

/** A sync client's options but its target; url and token default to the bed console's. */
export type BedClientOptions = Omit<SyncClientOptions, 'url' | 'token' | 'target'> & Partial<Pick<SyncClientOptions, 'url' | 'token'>>;

export interface SyncTestBed {
  fx: ConsoleFixture;
  /** A replica at `<name>.sqlite` in the bed's dir. */
  replica(name: string, opts?: { owner?: boolean }): ReplicaStore;
  /** A sync client writing into `replica`. */
  client(replica: ReplicaStore, opts: BedClientOptions): SyncClient;
  /** A new replica named `name` and a sync client into it: a sidecar's sync half. */
  sidecar(name: string, opts: BedClientOptions): { replica: ReplicaStore; client: SyncClient };
  /** Stops every client, closes every replica, then the console, and removes the dir. */
  close(): Promise<void>;
}

/** Starts a console fixture (as `fixture` says) and makes a temp dir named after `tag`. */
export async function syncTestBed(tag: string, fixture: Parameters<typeof startConsoleFixture>[0] = {}): Promise<SyncTestBed> {
  const fx = await startConsoleFixture(fixture);
  const dir = mkdtempSync(join(tmpdir(), `kw-${tag}-`));
  const clients: SyncClient[] = [];
  const replicas: ReplicaStore[] = [];
  const bed: SyncTestBed = {
    fx,
    replica(name, opts = {}) {
      const replica = new ReplicaStore({ path: join(dir, `${name}.sqlite`), ...opts });
      replicas.push(replica);
      return replica;
    },
    client(replica, opts) {
      const client = createSyncClient({ url: fx.url, token: fx.tokens.sync, target: replicaWriter(replica), ...opts });
      clients.push(client);
      return client;
    },
    sidecar(name, opts) {
      const replica = bed.replica(name);
      return { replica, client: bed.client(replica, opts) };
    },
    async close() {
      await Promise.all(clients.map((c) => c.stop()));
      await Promise.all(replicas.map((r) => r.close()));
      await fx.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  return bed;
}

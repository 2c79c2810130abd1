/**
 * What an instance runs once towards the console (DESIGN section 7): the sync client that
 * writes the replica, and the usage pusher. The sync client sees the console first when it
 * comes back, so it nudges the pusher to deliver what was buffered during the outage.
 */
import type { Config } from '../config/schema.js';
import type { Logger } from '../obs/logger.js';
import type { ReplicaStore } from '../replica/store.js';
import { replicaWriter } from '../replica/writer.js';
import { createSyncClient, createUsagePusher, type SyncClient, type UsagePusher } from '../sync/client.js';

/**
 * The process that syncs the replica owns it: it holds the path against a second syncing
 * process, and a damaged file found by a lookup goes aside (store.ts, quarantine) for the
 * next snapshot to fill a new one. A process that only reads the file (a `--workers`
 * worker) or one filled by `keyward import` does neither.
 */
export function replicaOwnership(config: Config, logger: Logger): { owner: boolean; onDamaged: (movedTo: string) => void } {
  return {
    owner: config.console != null,
    onDamaged: (movedTo) => logger.error({ moved_to: movedTo }, 'the replica file is damaged: moved aside; not ready until a snapshot fills a new one'),
  };
}

/** Usage events kept while the console is away (drops are counted). */
const USAGE_BUFFER = 100_000;

export function consoleClients(o: { config: Config; replica: ReplicaStore; logger: Logger; pushUsage: boolean }): { sync: SyncClient | null; usage: UsagePusher | null } {
  const c = o.config.console;
  if (!c) return { sync: null, usage: null };
  const usage = o.pushUsage
    ? createUsagePusher({ url: c.url, token: c.token, maxBuffer: USAGE_BUFFER, batchSize: 500, flushMs: 1000, log: o.logger })
    : null;
  const sync = createSyncClient({
    url: c.url, token: c.token, waitMs: c.waitMs, target: replicaWriter(o.replica), log: o.logger,
    onConnected: () => usage?.nudge(),
  });
  // A replica that lost its data (quarantine) waits for no long poll to end before its snapshot.
  o.replica.onChange((status) => {
    if (status.version === null) sync.snapshotNow();
  });
  return { sync, usage };
}

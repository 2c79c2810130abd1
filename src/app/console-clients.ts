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
  return { sync, usage };
}

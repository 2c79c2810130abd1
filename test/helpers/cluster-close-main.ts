/**
 * A process that opens keyward's Cluster client and drops it from inside a slot-map read
 * (ioredis emits `refresh` within the read, before it ends), as the ledger-news listener
 * drops its own, then leaves nothing else open: it exits only if the close left no timer
 * behind. Says `closed` on stdout once it has dropped the client.
 *   node --import tsx test/helpers/cluster-close-main.ts <redis+cluster url>
 */
import type { Cluster } from 'ioredis';
import { createRedisClient, disconnectRedisClient, whenServing } from '../../src/limits/redis/client.js';

const client = createRedisClient({ url: process.argv[2]!, timeoutMs: 100 }) as Cluster;
await whenServing(client);
client.once('refresh', () => {
  disconnectRedisClient(client);
  process.stdout.write('closed\n');
});

/**
 * Conformance harness over Redis (single node or Cluster): a fresh key prefix per run,
 * real time, peers with their own connection, and cleanup of every key it wrote.
 */
import { EventEmitter } from 'node:events';
import type { Cluster, Redis } from 'ioredis';
import { createRedisClient, disconnectRedisClient, whenServing } from '../../src/limits/redis/client.js';
import { type RedisLimiter, createRedisLimiter } from '../../src/limits/redis/limiter.js';
import { type Harness, uid } from './redis-limits-conformance.js';

export async function redisHarness(opts: { url: string; leaseMs?: number; lease?: { sliceMs: number } }): Promise<Harness & { prefix: string }> {
  const sliced = opts.lease ? { lease: opts.lease } : {};
  // Long enough that a stalled machine between a refresh and the next does not lapse a lease the test keeps live.
  const leaseMs = opts.leaseMs ?? 1_500;
  const longLeaseMs = 30_000;
  const prefix = uid('kwtest');
  const clients: (Redis | Cluster)[] = [];
  const connect = async (): Promise<Redis | Cluster> => {
    const client = createRedisClient({ url: opts.url, timeoutMs: 2_000 });
    clients.push(client);
    await whenServing(client);
    return client;
  };
  const main = await connect();
  const limiter = createRedisLimiter({ redis: main, prefix, leaseMs: longLeaseMs, ...sliced });
  const shortLease = createRedisLimiter({ redis: main, prefix, leaseMs, ...sliced });
  return {
    prefix,
    limiter,
    shortLease,
    leaseMs,
    spendSlices: opts.lease !== undefined,
    passTime: (ms) => new Promise((r) => setTimeout(r, ms)),
    async peer(o) {
      const client = await connect();
      const news = new EventEmitter();
      const peer = createRedisLimiter({ redis: client, prefix, leaseMs: o.shortLease ? leaseMs : longLeaseMs, ...sliced, onLedgerNews: (key) => news.emit('news', key) });
      await peer.listening();
      return {
        limiter: peer,
        news,
        async crash() {
          // The connection goes first: nothing a graceful close would give back (spend
          // slices, unused slots) reaches Redis. Closing then stops its timers; its leases,
          // holds and slices stay behind in Redis until they expire.
          if (client.status !== 'end') disconnectRedisClient(client);
          await peer.close();
        },
      };
    },
    async close() {
      await Promise.all([limiter.close(), shortLease.close()]);
      await deleteByPrefix(main, prefix);
      // Each client once: disconnecting twice arms a timer in ioredis that holds the process.
      // A Cluster client's slot-map timer is disarmed as keyward's own close does it.
      for (const c of clients) if (c.status !== 'end') disconnectRedisClient(c);
    },
  };
}

/** Deletes every key under `prefix` (on every master of a Cluster). */
export async function deleteByPrefix(client: Redis | Cluster, prefix: string): Promise<void> {
  const nodes = client.isCluster ? (client as Cluster).nodes('master') : [client as Redis];
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', `{${prefix}:*`, 'COUNT', 500);
      cursor = next;
      // One DEL per key: in a Cluster the keys of one node still span many slots.
      for (const k of keys) await node.del(k);
    } while (cursor !== '0');
  }
}

/** An after hook's cleanup: deletes every key under `prefix`, then disconnects `client`. */
export async function deleteByPrefixAndDisconnect(client: Redis | Cluster, prefix: string): Promise<void> {
  await deleteByPrefix(client, prefix);
  disconnectRedisClient(client);
}

/**
 * Limiter instances for the leasing tests, each on its own connection to one Redis and
 * sharing `prefix`. `close()` closes them, deletes their keys and disconnects every client;
 * `track` hands it a client the test opened itself.
 */
export function leasingInstances(url: string, prefix: string) {
  const clients: Redis[] = [];
  const limiters: RedisLimiter[] = [];
  const connect = async (): Promise<Redis> => {
    const c = createRedisClient({ url, timeoutMs: 2_000 }) as Redis;
    clients.push(c);
    // A Cluster is 'ready' before each master's own connection: a hold sent to one still connecting would fail.
    await whenServing(c);
    return c;
  };
  return {
    connect,
    track: (c: Redis) => void clients.push(c),
    async instance(o: { sliceMs?: number; leaseMs?: number; settleEveryMs?: number } = {}): Promise<{ lim: RedisLimiter; client: Redis }> {
      const client = await connect();
      const lim = createRedisLimiter({ redis: client, prefix, leaseMs: o.leaseMs ?? 30_000, lease: { sliceMs: o.sliceMs ?? 1000 }, ...(o.settleEveryMs ? { settleEveryMs: o.settleEveryMs } : {}) });
      limiters.push(lim);
      return { lim, client };
    },
    async close(): Promise<void> {
      await Promise.allSettled(limiters.map((l) => l.close()));
      await deleteByPrefix(await connect(), prefix);
      for (const c of clients) if (c.status !== 'end') disconnectRedisClient(c);
    },
  };
}

/**
 * Counts the writes each connection's real socket makes from now on (calls of its
 * `_write` and `_writev`, each one syscall or less): how many writes a set of commands took.
 */
export function countWrites(client: Redis | Cluster): { counts(): number[]; restore(): void } {
  type Sock = { _write: (...a: unknown[]) => void; _writev?: (...a: unknown[]) => void };
  const nodes = client.isCluster ? (client as Cluster).nodes('master') : [client as Redis];
  const socks = nodes.map((n) => n.stream as unknown as Sock);
  const counts = socks.map(() => 0);
  socks.forEach((s, i) => {
    for (const m of ['_write', '_writev'] as const) {
      const orig = s[m];
      if (!orig) continue;
      // An own property over the prototype's method; deleting it restores the prototype's.
      s[m] = function (this: unknown, ...a: unknown[]) {
        counts[i]!++;
        return orig.apply(this, a);
      };
    }
  });
  return {
    counts: () => [...counts],
    restore: () => socks.forEach((s) => ['_write', '_writev'].forEach((m) => delete (s as Record<string, unknown>)[m])),
  };
}

/** The blocks among a lease set's members (`<block id>#<j>`, lua/slots.lua): each one's member numbers, in order. */
export function blocksIn(members: string[]): Map<string, number[]> {
  const blocks = new Map<string, number[]>();
  for (const m of members) {
    const [, id, j] = /^(.+)#(\d+)$/.exec(m) ?? [];
    if (id) blocks.set(id, [...(blocks.get(id) ?? []), Number(j)]);
  }
  for (const js of blocks.values()) js.sort((x, y) => x - y);
  return blocks;
}

/**
 * ioredis client for the limiter, configured to fail fast: a limits check must never hold
 * a request longer than `timeoutMs` when Redis is down, paused or unreachable. Commands get
 * no `commandTimeout` (a timer per command): the limiter bounds each of its calls itself
 * (deadlines.ts, `callTimeoutMs`), and the failover guard bounds each request's.
 * The URL forms of `redis.url` are src/config/redis-url.ts's.
 */
import { once } from 'node:events';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { type RedisTarget, parseRedisUrl } from '../../config/redis-url.js';
import './string-methods.js';

export { parseRedisUrl };

export interface RedisClientOptions {
  url: string;
  timeoutMs: number;
  /** Connection state changes only (never per command), for the log. */
  onState?: (state: 'up' | 'down', fields: { error?: string }) => void;
}

/** Reconnect quickly at first, then every 2 s at most: recovery is automatic. */
export const reconnectDelayMs = (attempt: number): number => Math.min(2_000, 50 * 2 ** Math.min(attempt, 6));

/** Enough for a MOVED after a resharding and an ASK during one; more only loops on a missing master. */
const MAX_REDIRECTIONS = 6;

export function createRedisClient(opts: RedisClientOptions): Redis | Cluster {
  const target = parseRedisUrl(opts.url);
  const common = {
    // No queueing while disconnected: the command fails at once and the caller falls back.
    maxRetriesPerRequest: 0,
    // A resent admission after a reconnect could be counted twice.
    autoResendUnfulfilledCommands: false,
    connectTimeout: Math.max(1_000, opts.timeoutMs * 10),
    // Connect now, so the first requests do not pay for the handshake.
    lazyConnect: false,
    // Off: each call is written when it is made. ioredis' auto-pipelining holds a turn's
    // calls until the previous turn's pipeline has its replies, and keeps its pipelines in
    // a Map and a Set that churn once per turn, which promotes whole pipelines to the old
    // generation (docs/performance.md, "Redis calls"). keyward batches at its own level:
    // one hold call per hash slot and turn, one settlement call per slot and tick.
    enableAutoPipelining: false,
  } satisfies RedisOptions;

  let client: Redis | Cluster;
  if (target.kind === 'cluster') {
    client = clusterClient(target, common, opts.timeoutMs);
  } else {
    const options: RedisOptions = { ...common, enableOfflineQueue: false, retryStrategy: reconnectDelayMs };
    client = target.kind === 'unix' ? new Redis({ ...options, path: target.path }) : new Redis(target.url, options);
  }
  reportState(client, opts.onState);
  return client;
}

/** How often a Cluster client reads the slot map again (DESIGN section 6: exact again within the node timeout plus 5 s). */
const SLOTS_REFRESH_MS = 1_000;

function clusterClient(target: Extract<RedisTarget, { kind: 'cluster' }>, common: RedisOptions, timeoutMs: number): Cluster {
  return new Cluster(target.nodes, {
    enableOfflineQueue: false,
    clusterRetryStrategy: reconnectDelayMs,
    slotsRefreshTimeout: Math.max(1_000, timeoutMs * 10),
    // The slot map is read again every second (CLUSTER SLOTS from some node). ioredis reads
    // it otherwise only on a redirection or a connection error, and a master that hangs (a
    // frozen VM, a partition that drops packets) gives neither: keyward's own deadline ends
    // each call first, so a promoted replica would never be used while the master hung.
    slotsRefreshInterval: SLOTS_REFRESH_MS,
    scaleReads: 'master',
    // Off: a Cluster groups a pipelined call by its first argument, which for a script
    // with a variable number of keys is the key count (scripts.ts).
    enableAutoPipelining: false,
    // While a master is gone, its hash slots answer with a redirection to it, a refused
    // connection or CLUSTERDOWN. ioredis waits 100 ms before each retry by default, which
    // spends the whole timeout; without the wait the admission fails in a few round trips and
    // falls back, and the next one tries again, so a promoted replica is used as soon as it serves.
    retryDelayOnFailover: 0,
    retryDelayOnClusterDown: 0,
    retryDelayOnTryAgain: 0,
    maxRedirections: MAX_REDIRECTIONS,
    redisOptions: {
      ...common,
      ...(target.username ? { username: target.username } : {}),
      ...(target.password ? { password: target.password } : {}),
      ...(target.tls ? { tls: {} } : {}),
    },
  });
}

/** Tells `onState` when the connection comes up or goes down. */
function reportState(client: Redis | Cluster, onState: RedisClientOptions['onState']): void {
  // Without an 'error' listener ioredis would crash the process on the first failure.
  let up = false;
  // A connection that never came up is down too, and its first error says why (refused, a
  // wrong password): the limits calls that fail meanwhile only say they found no connection.
  let told = false;
  client.on('ready', () => {
    if (!up) onState?.('up', {});
    up = true;
    told = true;
  });
  client.on('error', (err: Error) => {
    if (up || !told) onState?.('down', { error: err.message });
    up = false;
    told = true;
  });
  client.on('close', () => {
    if (up) onState?.('down', { error: 'connection closed' });
    up = false;
  });
}

/**
 * Resolves once the client can serve every key: a single node when it is ready, a Cluster
 * when its hash-slot map is known and each master's own connection is ready (a command for a
 * master still connecting fails at once, with no offline queue). A Cluster opens a master's
 * connection only when a command first goes there, so those not opened yet are opened now.
 */
export async function whenServing(client: Redis | Cluster): Promise<void> {
  if (client.status !== 'ready') await once(client, 'ready');
  if (!client.isCluster) return;
  const connecting = (client as Cluster).nodes('master').filter((node) => node.status !== 'ready');
  for (const node of connecting) if (node.status === 'wait') node.connect().catch(() => {});
  await Promise.all(connecting.map((node) => once(node, 'ready')));
}

/** Closes politely when Redis answers, else drops the connection; never waits long. */
export async function closeRedisClient(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    client.quit().catch(() => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
    }),
  ]);
  clearTimeout(timer);
  // Only when quit did not finish: a second disconnect arms a 2 s timer that holds the process.
  if (client.status !== 'end') client.disconnect();
  if (client.isCluster) disarmSlotsRefresh(client as Cluster);
}

/** Drops the connection now, and leaves no timer of the client's behind. */
export function disconnectRedisClient(client: Redis | Cluster): void {
  client.disconnect();
  if (client.isCluster) disarmSlotsRefresh(client as Cluster);
}

/**
 * Ends a closed Cluster client's slot-map timer. ioredis clears that timer at a disconnect or
 * a quit, but a slot-map read in flight then ends by arming it again, and from there the
 * timer reads an empty map every `slotsRefreshInterval` for good, holding the process open
 * after everything else has closed. The read ends within `slotsRefreshTimeout` (its own
 * deadline); a disconnect after that clears the armed timer. The wait is unref'd: when no
 * read was in flight nothing holds the process, and when one was, its timer does.
 */
function disarmSlotsRefresh(client: Cluster): void {
  setTimeout(() => client.disconnect(), slotsRefreshTimeoutMs(client) + SLOTS_REFRESH_MS).unref();
}

const slotsRefreshTimeoutMs = (client: Cluster): number => client.options.slotsRefreshTimeout ?? 1_000;

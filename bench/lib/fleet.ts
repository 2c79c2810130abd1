/**
 * The upstream and the servers of the variants a run measures, each a child process
 * (lib/servers.ts), with what a round needs to know about them: port, pids, Redis.
 */
import type { Parties } from './measure.js';
import type { RedisUnderTest } from './redis-server.js';
import { failOpenHoldsAtExit, readMetrics, startServer, stopServer, type LimiterTrouble, type Started } from './servers.js';
import { HEADERS, PATH, VARIANTS, type Variant } from './settings.js';

export interface Fleet {
  upstream: Started;
  servers: Partial<Record<Variant, Started>>;
  /** what runs, in VARIANTS order (direct is the upstream itself) */
  variants: Variant[];
  redis: RedisUnderTest | null;
}

/** keyward's arguments per variant (bench/servers/keyward.ts), Redis ones only with a Redis. */
function keywardArgs(v: Variant, upstreamUrl: string, redisUrl: string | null): string[] | null {
  if (v === 'keyward') return [upstreamUrl, 'memory'];
  if (redisUrl === null) return null;
  if (v === 'keyward-redis') return [upstreamUrl, 'redis', redisUrl];
  if (v === 'keyward-redis-budgets') return [upstreamUrl, 'redis-budgets', redisUrl];
  if (v === 'keyward-redis-w2') return [upstreamUrl, 'redis', redisUrl, '2'];
  return null;
}

/** Starts the upstream, bare, and every wanted variant that can run; bare always runs (the baseline). */
export async function startFleet(opts: { redis: RedisUnderTest | null; want: (v: Variant) => boolean; profile?: boolean }): Promise<Fleet> {
  const upstream = await startServer('upstream', [], { cpu: 0 });
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
  const servers: Partial<Record<Variant, Started>> = {};
  servers.bare = await startServer('bare', [upstreamUrl], { cpu: 1, profile: opts.profile });
  for (const v of VARIANTS) {
    const args = opts.want(v) ? keywardArgs(v, upstreamUrl, opts.redis?.url ?? null) : null;
    // the two-worker variant is not pinned: its workers would share one core
    if (args) servers[v] = await startServer('keyward', args, v === 'keyward-redis-w2' ? {} : { cpu: 1, profile: opts.profile });
  }
  const variants = VARIANTS.filter((v) => (v === 'direct' ? opts.want(v) : servers[v] !== undefined));
  return { upstream, servers, variants, redis: opts.redis };
}

export const portOf = (fleet: Fleet, v: Variant): number => (v === 'direct' ? fleet.upstream.port : fleet.servers[v]!.port);

export const partiesOf = (fleet: Fleet, v: Variant): Parties => ({
  proxy: v === 'direct' ? null : fleet.servers[v]!.child.pid!,
  upstream: fleet.upstream.child.pid!,
  redis: fleet.redis,
});

/** Every variant answers 200 to every body before anything is timed. */
export async function checkAnswers(fleet: Fleet, bodies: string[]): Promise<void> {
  for (const v of fleet.variants) {
    for (const body of bodies) {
      const res = await fetch(`http://127.0.0.1:${portOf(fleet, v)}${PATH}`, { method: 'POST', headers: HEADERS, body });
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`${v} answered ${res.status} to the benchmark request`);
    }
  }
}

/**
 * Stops every child; returns, per keyward variant, the Redis trouble it saw (admin /metrics
 * read before the stop, and the fallback spend holds a single process reports at exit).
 */
export async function stopFleet(fleet: Fleet): Promise<Partial<Record<Variant, LimiterTrouble>>> {
  const trouble: Partial<Record<Variant, LimiterTrouble>> = {};
  for (const [v, s] of Object.entries(fleet.servers) as [Variant, Started][]) {
    if (!v.startsWith('keyward')) continue;
    const t = await readMetrics(s);
    if (t) trouble[v] = t;
  }
  await Promise.all([...Object.values(fleet.servers), fleet.upstream].map(stopServer));
  for (const [v, t] of Object.entries(trouble) as [Variant, LimiterTrouble][]) t.failOpenHolds = failOpenHoldsAtExit(fleet.servers[v]!);
  await fleet.redis?.stop();
  return trouble;
}

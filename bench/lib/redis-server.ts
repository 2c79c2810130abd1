/**
 * The Redis the Redis variants use, and its CPU time. By default a private redis-server on a
 * loopback port claimed by binding it (no persistence), so its CPU is the benchmark's
 * alone: a shared Redis also serves whatever else runs on the machine. BENCH_REDIS_URL
 * names another one; its CPU then comes from /proc/<process_id> when that is readable,
 * else from INFO cpu.
 */
import { spawnSync } from 'node:child_process';
import { Redis } from 'ioredis';
import { REDIS_SERVER, spawnRedisOnSomePort } from '../../test/helpers/redis-server.js';
import { ownCpuSeconds } from './procstat.js';
import { redisAvailable, track } from './servers.js';
import { REDIS_URL, REDIS_URL_GIVEN, log } from './settings.js';

export interface RedisUnderTest {
  url: string;
  /** the redis-server process, when known */
  pid: number | null;
  /** started by this run */
  own: boolean;
  /** CPU seconds (user + system) Redis has used so far; null when unknown */
  cpuSeconds(): Promise<number | null>;
  stop(): Promise<void>;
}

async function startPrivate(): Promise<RedisUnderTest | null> {
  if (spawnSync(REDIS_SERVER, ['--version']).status !== 0) return null;
  const started = await spawnRedisOnSomePort(() => ['--save', '', '--appendonly', 'no']).catch(() => null);
  if (!started) return null;
  const { port, server } = started;
  track(server.proc);
  const pid = server.proc.pid!;
  return {
    url: `redis://127.0.0.1:${port}`,
    pid,
    own: true,
    cpuSeconds: () => Promise.resolve(ownCpuSeconds(pid)),
    stop: () => server.stop(),
  };
}

async function useShared(url: string): Promise<RedisUnderTest | null> {
  if (!(await redisAvailable(url))) return null;
  const client = new Redis(url, { maxRetriesPerRequest: 1 });
  client.on('error', () => undefined);
  const field = (info: string, name: string) => Number(new RegExp(`^${name}:(\\S+)`, 'm').exec(info)?.[1]);
  const pid = field(await client.info('server'), 'process_id');
  const viaProc = Number.isFinite(pid) && ownCpuSeconds(pid) !== null;
  return {
    url,
    pid: viaProc ? pid : null,
    own: false,
    cpuSeconds: async () => {
      if (viaProc) return ownCpuSeconds(pid);
      const info = await client.info('cpu');
      return field(info, 'used_cpu_sys') + field(info, 'used_cpu_user');
    },
    stop: async () => void client.disconnect(),
  };
}

/** A private redis-server, else BENCH_REDIS_URL or the default URL; null: no Redis at all. */
export async function redisUnderTest(): Promise<RedisUnderTest | null> {
  if (!REDIS_URL_GIVEN) {
    const own = await startPrivate();
    if (own) return own;
    log('bench: could not start a private redis-server; using the shared Redis, whose CPU includes other clients');
  }
  return useShared(REDIS_URL);
}

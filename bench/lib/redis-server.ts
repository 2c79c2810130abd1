/**
 * The Redis the Redis variants use, and its CPU time. By default a private redis-server on a
 * free loopback port (no persistence), so its CPU is the benchmark's alone: a shared Redis
 * also serves whatever else runs on the machine. BENCH_REDIS_URL names another one; its CPU
 * then comes from /proc/<process_id> when that is readable, else from INFO cpu.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createServer } from 'node:net';
import { Redis } from 'ioredis';
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

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      s.close(() => resolve(typeof addr === 'object' && addr ? addr.port : 0));
    });
  });
}

async function startPrivate(): Promise<RedisUnderTest | null> {
  if (spawnSync('redis-server', ['--version']).status !== 0) return null;
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--loglevel', 'warning'], { stdio: 'ignore' });
  track(child);
  const url = `redis://127.0.0.1:${port}`;
  for (let i = 0; i < 50 && !(await redisAvailable(url)); i++) await new Promise((r) => setTimeout(r, 100));
  if (!(await redisAvailable(url))) {
    child.kill('SIGKILL');
    return null;
  }
  const pid = child.pid!;
  return {
    url,
    pid,
    own: true,
    cpuSeconds: () => Promise.resolve(ownCpuSeconds(pid)),
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
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

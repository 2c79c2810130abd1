/**
 * Starts private redis-server processes for tests (never the shared one on 6379). A port is
 * claimed by starting on it and retrying elsewhere when the bind fails, never by probing for
 * a free port first (which races with everything else on the machine).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

export const REDIS_SERVER = process.env.REDIS_SERVER ?? '/usr/bin/redis-server';
export const REDIS_CLI = process.env.REDIS_CLI ?? 'redis-cli';
export const execFileP = promisify(execFile);

export interface RedisProcess {
  proc: ChildProcess;
  args: string[];
  /** Resolves once the process has exited. */
  exited: Promise<void>;
  stop(): Promise<void>;
}

export async function makeTmpDir(tag: string): Promise<{ dir: string; remove(): Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), `kw-${tag}-`));
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** Spawns redis-server and resolves when it accepts connections; rejects if it exits first. */
export function spawnRedis(args: string[], readyTimeoutMs = 10_000): Promise<RedisProcess> {
  const proc = spawn(REDIS_SERVER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  let output = '';
  return new Promise<RedisProcess>((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`redis-server not ready within ${readyTimeoutMs} ms: ${output.slice(-500)}`));
    }, readyTimeoutMs);
    const onData = (b: Buffer): void => {
      output += b.toString();
      if (/ready to accept connections/i.test(output)) {
        clearTimeout(timer);
        proc.stdout?.off('data', onData);
        proc.stdout?.resume(); // keep draining so the server never blocks on a full pipe
        resolve({ proc, args, exited, stop: () => stopProcess(proc, exited) });
      }
    };
    proc.stdout?.on('data', onData);
    proc.stderr?.on('data', (b: Buffer) => void (output += b.toString()));
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${code}): ${output.slice(-500)}`));
    });
  });
}

async function stopProcess(proc: ChildProcess, exited: Promise<void>): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  proc.kill('SIGCONT'); // a paused server cannot act on SIGTERM
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), 2_000);
  await exited;
  clearTimeout(timer);
}

/**
 * Starts redis-server on a random port from [base, base + span), retrying on another port
 * when the bind fails. `extra(port)` gives the arguments besides --port.
 */
export async function spawnRedisOnSomePort(
  extra: (port: number) => string[],
  opts: { base?: number; span?: number; attempts?: number } = {},
): Promise<{ port: number; server: RedisProcess }> {
  const base = opts.base ?? 20_000;
  const span = opts.span ?? 10_000;
  let lastError: unknown;
  for (let i = 0; i < (opts.attempts ?? 20); i++) {
    const port = base + Math.floor(Math.random() * span);
    try {
      const server = await spawnRedis(['--port', String(port), '--bind', '127.0.0.1', ...extra(port)]);
      return { port, server };
    } catch (err) {
      lastError = err; // most likely the port (or its cluster bus port) was taken
    }
  }
  throw lastError;
}

/** A private redis-server on a unix socket; `proc` and `exited` are those of the process running now. */
export interface SocketRedis {
  readonly proc: ChildProcess;
  readonly exited: Promise<void>;
  /** the socket's path, for `unix://` URLs and Redis({ path }) */
  sock: string;
  /** its temp dir, for other socket paths the tests need */
  dir: string;
  /** starts a new process with the same arguments, after a test killed the last one */
  restart(): Promise<void>;
  /** stops the process and removes the dir */
  close(): Promise<void>;
}

/**
 * Starts redis-server listening only on a unix socket (mode 700) in a new temp dir named
 * after `tag`, persisting nothing: a server the failover tests can pause, kill and restart.
 */
export async function startSocketRedis(tag: string): Promise<SocketRedis> {
  const tmp = await makeTmpDir(tag);
  const sock = join(tmp.dir, 'redis.sock');
  const args = ['--port', '0', '--unixsocket', sock, '--unixsocketperm', '700', '--save', '', '--appendonly', 'no', '--dir', tmp.dir];
  let current: RedisProcess;
  try {
    current = await spawnRedis(args);
  } catch (err) {
    await tmp.remove();
    throw err;
  }
  return {
    get proc() {
      return current.proc;
    },
    get exited() {
      return current.exited;
    },
    sock,
    dir: tmp.dir,
    async restart() {
      current = await spawnRedis(args);
    },
    async close() {
      await current.stop();
      await tmp.remove();
    },
  };
}

/** Polls `check` until it returns true, or fails after `timeoutMs`. */
export async function waitFor(check: () => Promise<boolean> | boolean, timeoutMs: number, what: string, everyMs = 25): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

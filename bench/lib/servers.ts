/**
 * The benchmark's servers, each in a child process of its own (bench/servers/*.ts), so the
 * load generator in the parent never shares an event loop with the server under test.
 * Children are killed when the parent exits, and exit by themselves when it dies.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import { KEY, PIN, root } from './settings.js';

const children = new Set<ChildProcess>();
/** A child the run started that must not outlive it (e.g. a private redis-server). */
export const track = (child: ChildProcess): void => void children.add(child);

export function killChildren(): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
}
process.on('exit', killChildren);
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    killChildren();
    process.exit(130);
  });
}

/** Runs a benchmark's main; on failure prints why, kills the children and exits 1. */
export function runMain(name: string, main: () => Promise<void>): void {
  main().then(
    () => process.exit(0),
    (err: unknown) => {
      process.stderr.write(`${name} failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      killChildren();
      process.exit(1);
    },
  );
}

export interface Started {
  child: ChildProcess;
  port: number;
  /** the server's first stdout line (port, admin port, mode, ...) */
  info: Record<string, unknown>;
  /** the JSON lines it wrote after that, e.g. keyward's `{"stats": ...}` on shutdown */
  later: Record<string, unknown>[];
}

const builds = new Map<string, string>();
/**
 * The compiled build of a source tree (`scripts/build.mjs --out <tree>/.bench/dist`), made
 * once per run: what production runs, so what the benchmark measures. BENCH_TSX=1 runs src/
 * through tsx instead (a tree from before bench/servers/build.ts always does).
 */
function buildOf(tree: string): string | undefined {
  if (process.env.BENCH_TSX === '1') return undefined;
  let out = builds.get(tree);
  if (!out) {
    out = join(tree, '.bench', 'dist');
    const r = spawnSync(process.execPath, [join(tree, 'scripts', 'build.mjs'), '--out', out], { cwd: tree, stdio: ['ignore', 'ignore', 'inherit'] });
    if (r.status !== 0) throw new Error(`building ${tree} failed`);
    builds.set(tree, out);
  }
  return out;
}

/** Starts `bench/servers/<name>.ts` in its own node process; resolves with its port. */
export function startServer(name: string, args: string[], opts: { cpu?: number; profile?: boolean; tree?: string; wrap?: string[]; nodeArgs?: string[]; onLine?: (line: string) => void } = {}): Promise<Started> {
  // `tree`: another checkout's copy of the server (bench/ab.ts compares two trees)
  const base = opts.tree ?? root;
  const nodeArgs = ['--import', 'tsx', ...(process.env.BENCH_NODE_ARGS ?? '').split(' ').filter(Boolean), ...(opts.nodeArgs ?? [])];
  // One directory per server: node writes one profile per thread (tsx's loader has its own).
  if (opts.profile) nodeArgs.push('--cpu-prof', `--cpu-prof-dir=${join(root, '.bench', 'prof', [name, ...args.slice(1, 2)].join('-'))}`);
  const script = join(base, 'bench', 'servers', `${name}.ts`);
  // `wrap`: a command the node process runs under (bench/instructions.ts: valgrind)
  const [cmd, ...argv] = [
    ...(PIN && opts.cpu !== undefined ? ['taskset', '-c', String(opts.cpu)] : []),
    ...(opts.wrap ?? []),
    process.execPath, ...nodeArgs, script, ...args,
  ];
  const child = spawn(cmd!, argv, {
    cwd: base,
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, KW_BENCH_KEY: KEY, ...(name.startsWith('keyward') ? { KW_BENCH_BUILD: buildOf(base) } : {}) },
  });
  children.add(child);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start within 20 s`)), 20_000);
    child.once('exit', (code) => reject(new Error(`${name} exited early with ${code}`)));
    const lines = createInterface({ input: child.stdout! });
    let started: Started | null = null;
    lines.on('line', (line) => {
      // not ours (e.g. --trace-gc output from BENCH_NODE_ARGS): to `onLine`, else on to stderr
      if (!line.startsWith('{')) return void (opts.onLine ? opts.onLine(line) : process.stderr.write(`[${name} ${child.pid}] ${line}\n`));
      if (started) {
        try {
          started.later.push(JSON.parse(line) as Record<string, unknown>);
        } catch {
          // not one of ours: ignore
        }
        return;
      }
      clearTimeout(timer);
      const info = JSON.parse(line) as Record<string, unknown>;
      started = { child, port: Number(info.port), info, later: [] };
      resolve(started);
    });
  });
}

/** Closes the child's stdin (its signal to shut down) and waits for it to exit; SIGKILL after 5 s. */
export function stopServer(s: Started): Promise<void> {
  return new Promise((resolve) => {
    if (s.child.exitCode !== null || s.child.signalCode !== null) return resolve();
    const timer = setTimeout(() => {
      s.child.kill('SIGKILL');
      resolve();
    }, 5_000);
    // 'close', not 'exit': stdout is read to its end, so the last lines are in.
    s.child.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    s.child.stdin?.end();
  });
}

export async function redisAvailable(url: string): Promise<boolean> {
  const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 1_000, retryStrategy: () => null });
  r.on('error', () => undefined);
  try {
    await r.connect();
    return (await r.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    r.disconnect();
  }
}

/** Redis trouble one keyward saw during the run: what went to the in-process fallback was not measured with Redis. */
export interface LimiterTrouble {
  redisErrors: number;
  failOpen: number;
  /** spend holds taken by the in-process ledger; null where unknown (not in /metrics; --workers N) */
  failOpenHolds: number | null;
}

/** Redis errors and fail-open admissions from a keyward's admin /metrics (for --workers N, the sum over its workers). */
export async function readMetrics(s: Started): Promise<LimiterTrouble | null> {
  if (!s.info.adminPort) return null;
  const text = await (await fetch(`http://127.0.0.1:${Number(s.info.adminPort)}/metrics`)).text();
  const read = (name: string) => Number(/^(\S+) (\S+)$/m.exec(text.split('\n').find((l) => l.startsWith(`${name} `)) ?? '')?.[2] ?? 0);
  return { redisErrors: read('keyward_redis_errors_total'), failOpen: read('keyward_fail_open_admissions_total'), failOpenHolds: null };
}

/** The fallback spend holds from the limiter stats a single-process keyward writes on shutdown. */
export function failOpenHoldsAtExit(s: Started): number | null {
  const stats = s.later.find((l) => typeof l.stats === 'object' && l.stats !== null)?.stats as { failOpenHolds?: unknown } | undefined;
  return typeof stats?.failOpenHolds === 'number' ? stats.failOpenHolds : null;
}

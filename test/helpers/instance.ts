/**
 * Reading a running `keyward serve` process from outside, as an operator would: its
 * access lines on stdout, its admin port's /metrics and /readyz, and `keyward import`
 * run as its own process to fill a replica file.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { KEYWARD_ARGS, type SidecarProcess } from './process.js';
import { send } from './http.js';

export interface AccessLine {
  worker: number;
  req_id: string;
  key_id: string | null;
  status: number;
  code: string | null;
}

/** Access lines written so far (with workers, the primary's and workers' stdout are one stream). */
export function accessLines(p: SidecarProcess): AccessLine[] {
  return p.lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request') as unknown as AccessLine[];
}

/** Resolves once `cond` holds, checked after every chunk the process writes to stdout. */
export function untilLogged(p: SidecarProcess, cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  if (cond()) return Promise.resolve();
  const out = p.child.stdout!;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      out.off('data', check);
      reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
    }, timeoutMs);
    const check = () => {
      // readline's listener was added first, so this chunk's lines are already in p.lines
      if (!cond()) return;
      clearTimeout(timer);
      out.off('data', check);
      resolve();
    };
    out.on('data', check);
  });
}

/** Waits for the access lines of every request id in `ids`, and returns them. */
export async function accessOf(p: SidecarProcess, ids: readonly string[], timeoutMs = 10_000): Promise<AccessLine[]> {
  const wanted = new Set(ids);
  const found = () => accessLines(p).filter((l) => wanted.has(l.req_id));
  await untilLogged(p, () => found().length >= wanted.size, `${wanted.size} access lines`, timeoutMs);
  return found();
}

const admin = (p: SidecarProcess) => `http://127.0.0.1:${p.adminPort}`;

/** The admin port's /metrics as series line → value. */
export async function scrape(p: SidecarProcess): Promise<Map<string, number>> {
  const res = await send(admin(p), { path: '/metrics' });
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  const out = new Map<string, number>();
  for (const line of res.body.toString('utf8').split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** Sum of every series of metric `name` (all label sets). */
export function metricSum(m: Map<string, number>, name: string): number {
  let sum = 0;
  for (const [series, v] of m) if (series === name || series.startsWith(`${name}{`)) sum += v;
  return sum;
}

/**
 * Scrapes /metrics until `cond` holds (every 20 ms), and returns that scrape: for what a
 * process does on its own time, such as a reload after a file change.
 */
export async function untilScraped(p: SidecarProcess, cond: (m: Map<string, number>) => boolean, what: string, timeoutMs = 5_000): Promise<Map<string, number>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await scrape(p);
    if (cond(m)) return m;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The config metrics of a scrape: reloads by result and the hash label(s) of keyward_config_info. */
export function configMetrics(m: Map<string, number>): { ok: number; error: number; hashes: string[]; lastSuccess: number } {
  const hashes = [...m.keys()].flatMap((series) => /^keyward_config_info\{hash="([0-9a-f]+)"\}$/.exec(series)?.[1] ?? []);
  return {
    ok: m.get('keyward_config_reloads_total{result="ok"}') ?? NaN,
    error: m.get('keyward_config_reloads_total{result="error"}') ?? NaN,
    hashes,
    lastSuccess: m.get('keyward_config_last_reload_success_timestamp_seconds') ?? NaN,
  };
}

export async function readyz(p: SidecarProcess): Promise<number> {
  return (await send(admin(p), { path: '/readyz' })).status;
}

/** `keyward import FILE --replica PATH` as its own process; rejects unless it exits 0. */
export async function importReplica(file: string, replicaPath: string): Promise<void> {
  const child = spawn(process.execPath, [...KEYWARD_ARGS, 'import', file, '--replica', replicaPath], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const [code] = (await once(child, 'close')) as [number | null];
  if (code !== 0) throw new Error(`keyward import exited with ${code}: ${stderr}`);
}

/**
 * The config of one fleet member: its own replica file, the fleet's shared Redis prefix.
 * `onError: closed`, so a Redis failure answers 503 instead of admitting per instance or
 * per worker, which would hide it.
 */
export function fleetYaml(o: { upstream: string; replica: string; redis: string; prefix: string; server?: string }): string {
  return [
    `server: { port: 0${o.server ? `, ${o.server}` : ''} }`,
    'admin: { port: 0 }',
    `upstreams: { default: { url: ${o.upstream} } }`,
    `replica: { path: ${o.replica} }`,
    `redis: { url: ${o.redis}, prefix: ${o.prefix}, timeoutMs: 1000, onError: closed }`,
    'logging: { level: info }',
    '',
  ].join('\n');
}

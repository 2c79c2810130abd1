/**
 * wrk as the load generator, the way an outside harness runs it (`wrk -t1 -c32`): a process
 * of its own, in C, so its cost per request is not the benchmark's event loop. A Lua script
 * sets the request and prints wrk's summary as one JSON line; wrk runs under `sh`, which
 * reads its own cutime/cstime after wrk exits: wrk's exact CPU time, threads included.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLK_TCK, statFields } from './procstat.js';
import { HEADERS, PATH, PIN, root } from './settings.js';

export const wrkAvailable = (): boolean => spawnSync('wrk', ['-v']).error === undefined;

export interface WrkResult {
  /** responses, any status */
  requests: number;
  /** responses with status >= 400 */
  non2xx: number;
  /** connect, read, write errors and timeouts */
  errors: number;
  seconds: number;
  /** ms */
  p50: number;
  p99: number;
  /** wrk's CPU seconds (user + system), all its threads */
  cpuSeconds: number | null;
  pid: number;
}

const scripts = new Map<string, string>();
/** One Lua script per body, under .bench/. */
function scriptFor(body: string): string {
  let file = scripts.get(body);
  if (file) return file;
  const dir = join(root, '.bench', 'wrk');
  mkdirSync(dir, { recursive: true });
  const n = scripts.size;
  writeFileSync(join(dir, `body-${n}.json`), body);
  file = join(dir, `request-${n}.lua`);
  const headers = Object.entries(HEADERS).map(([k, v]) => `wrk.headers[${JSON.stringify(k)}] = ${JSON.stringify(v)}`);
  writeFileSync(
    file,
    [
      `local f = assert(io.open(${JSON.stringify(join(dir, `body-${n}.json`))}, "rb"))`,
      'wrk.body = f:read("*a")',
      'f:close()',
      'wrk.method = "POST"',
      ...headers,
      'function done(summary, latency, requests)',
      '  local e = summary.errors',
      '  io.write(string.format(\'WRKJSON {"requests":%d,"durationUs":%d,"status":%d,"errors":%d,"p50Us":%d,"p99Us":%d}\\n\',',
      '    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,',
      '    latency:percentile(50), latency:percentile(99)))',
      'end',
      '',
    ].join('\n'),
  );
  scripts.set(body, file);
  return file;
}

export interface WrkRun {
  pid: number;
  done: Promise<WrkResult>;
}

/** Starts `wrk -t<threads> -c<connections> -d<duration>s` against the port; `done` resolves when it exits. */
export function startWrk(opts: { port: number; body: string; duration: number; connections: number; threads: number }): WrkRun {
  const args = [
    `-t${opts.threads}`, `-c${opts.connections}`, `-d${opts.duration}s`, '--timeout', '10s',
    '-s', scriptFor(opts.body), `http://127.0.0.1:${opts.port}${PATH}`,
  ];
  // `read` is a shell builtin: nothing else has been waited for when sh reads its stat.
  const shell = `${PIN ? 'taskset -c 0 ' : ''}wrk "$@"; r=$?; read -r s < /proc/$$/stat; echo "SHSTAT $s"; exit $r`;
  const child = spawn('sh', ['-c', shell, 'sh', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (err += c.toString()));
  const done = new Promise<WrkResult>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => {
      const json = /^WRKJSON (.*)$/m.exec(out)?.[1];
      if (code !== 0 || !json) return reject(new Error(`wrk failed (${code}): ${err || out}`));
      const w = JSON.parse(json) as { requests: number; durationUs: number; status: number; errors: number; p50Us: number; p99Us: number };
      const stat = /^SHSTAT (.*)$/m.exec(out)?.[1];
      const f = stat ? statFields(stat) : null;
      resolve({
        requests: w.requests,
        non2xx: w.status,
        errors: w.errors,
        seconds: w.durationUs / 1e6,
        p50: w.p50Us / 1000,
        p99: w.p99Us / 1000,
        // cutime + cstime of the shell: the children it waited for, i.e. wrk
        cpuSeconds: f ? (Number(f[13]) + Number(f[14])) / CLK_TCK : null,
        pid: child.pid!,
      });
    });
  });
  return { pid: child.pid!, done };
}

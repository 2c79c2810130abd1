/**
 * Measuring one variant: throughput with autocannon (and the server's own CPU per request
 * from /proc), latency at a fixed rate with autocannon -R and with the paced generator.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { paced, percentile } from '../paced.js';
import { BODY, CONNECTIONS, HEADERS, PATH, RATE_CONNECTIONS, RAW_REQUEST } from './settings.js';

export interface Throughput {
  rps: number;
  cpuUsPerRequest: number;
  ok: number;
  non2xx: number;
  errors: number;
  p50: number;
  p99: number;
}

export interface Latency {
  rate: number;
  achieved: number;
  p50: number;
  p99: number;
  samples: number;
  non2xx: number;
  errors: number;
}

export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function cannon(port: number, opts: { duration: number; connections: number; overallRate?: number; samples?: number[] }): PromiseLike<autocannon.Result> {
  const inst = autocannon({
    url: `http://127.0.0.1:${port}${PATH}`,
    method: 'POST',
    headers: HEADERS,
    body: BODY,
    connections: opts.connections,
    pipelining: 1,
    duration: opts.duration,
    ...(opts.overallRate ? { overallRate: opts.overallRate } : {}),
  });
  // autocannon's histograms keep whole milliseconds; the response events carry the
  // full-resolution time, which sub-millisecond differences need.
  if (opts.samples) {
    const samples = opts.samples;
    inst.on('response', (_client: unknown, status: number, _bytes: number, ms: number) => {
      if (status >= 200 && status < 300) samples.push(ms);
    });
  }
  return inst;
}

/** The pid and every descendant's (a cluster primary's workers), from /proc. */
function processTree(pid: number): number[] {
  const out = [pid];
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const kids = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      for (const k of kids ? kids.split(' ') : []) out.push(...processTree(Number(k)));
    }
  } catch {
    // gone, or no /proc: what was found so far
  }
  return out;
}

/** CPU seconds (user + system) a process and its descendants have used so far; null where /proc is missing. */
function cpuSeconds(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  const each = processTree(pid).map(ownCpuSeconds);
  return each[0] === null ? null : each.reduce<number>((a, c) => a + (c ?? 0), 0);
}

function ownCpuSeconds(pid: number): number | null {
  try {
    // the fields after the command name, which is in parentheses and may contain spaces
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return null;
  }
}
const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

export async function throughput(port: number, duration: number, pid?: number): Promise<Throughput> {
  const samples: number[] = [];
  const cpu0 = cpuSeconds(pid);
  const r = await cannon(port, { duration, connections: CONNECTIONS, samples });
  const cpu1 = cpuSeconds(pid);
  samples.sort((a, b) => a - b);
  return {
    rps: r['2xx'] / r.duration,
    ok: r['2xx'],
    non2xx: r.non2xx,
    errors: r.errors + r.timeouts,
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    // The server's own CPU per request: steadier than req/s when other work shares the machine.
    cpuUsPerRequest: cpu0 !== null && cpu1 !== null && r['2xx'] > 0 ? ((cpu1 - cpu0) * 1e6) / r['2xx'] : NaN,
  };
}

export async function latencyCannon(port: number, rate: number, duration: number): Promise<Latency> {
  const samples: number[] = [];
  const r = await cannon(port, { duration, connections: RATE_CONNECTIONS, overallRate: rate, samples });
  samples.sort((a, b) => a - b);
  return { rate, achieved: r['2xx'] / r.duration, p50: percentile(samples, 50), p99: percentile(samples, 99), samples: samples.length, non2xx: r.non2xx, errors: r.errors + r.timeouts };
}


export async function latencyPaced(port: number, rate: number, duration: number): Promise<Latency> {
  const r = await paced({ host: '127.0.0.1', port, request: RAW_REQUEST, rate, durationMs: duration * 1000 });
  const s = r.latencies.sort((a, b) => a - b);
  return { rate, achieved: r.latencies.length / duration, p50: percentile(s, 50), p99: percentile(s, 99), samples: s.length, non2xx: r.non2xx, errors: r.errors };
}

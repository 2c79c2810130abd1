/**
 * Measuring one variant: a throughput round with wrk or autocannon and the CPU time every
 * process involved spent on it (from /proc), and latency at a fixed, evenly paced rate.
 */
import autocannon from 'autocannon';
import { paced, percentile } from '../paced.js';
import { cpuSeconds, machineCpu } from './procstat.js';
import type { RedisUnderTest } from './redis-server.js';
import { BODY, CONNECTIONS, HEADERS, PATH, WRK_THREADS, rawRequest, type Generator } from './settings.js';
import { startWrk } from './wrk.js';

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
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function cannon(port: number, opts: { duration: number; connections: number; body?: string; samples?: number[] }): PromiseLike<autocannon.Result> {
  const inst = autocannon({
    url: `http://127.0.0.1:${port}${PATH}`,
    method: 'POST',
    headers: HEADERS,
    body: opts.body ?? BODY,
    connections: opts.connections,
    pipelining: 1,
    duration: opts.duration,
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

/** autocannon with the short body, and the server's own CPU per request (bench/ab.ts, threads.ts, young-gc.ts). */
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
    cpuUsPerRequest: cpu0 !== null && cpu1 !== null && r['2xx'] > 0 ? ((cpu1 - cpu0) * 1e6) / r['2xx'] : NaN,
  };
}

/** The processes a round involves besides the generator. */
export interface Parties {
  /** the proxy under test (its descendants too); null for direct, which has none */
  proxy: number | null;
  upstream: number;
  redis: RedisUnderTest | null;
}

/** CPU µs per 2xx response of each process; null where the process is not part of the variant, NaN where unknown. */
export interface CpuPerRequest {
  proxy: number | null;
  redis: number | null;
  upstream: number;
  generator: number;
  total: number;
}

export interface Round extends Omit<Throughput, 'cpuUsPerRequest'> {
  seconds: number;
  cpu: CpuPerRequest;
  /** cores busy on average: our processes, and the whole machine (ours and anything else running) */
  cores: { ours: number; machine: number };
}

interface Load {
  ok: number;
  non2xx: number;
  errors: number;
  seconds: number;
  p50: number;
  p99: number;
  /** the generator's CPU seconds; null when unknown */
  cpu: number | null;
}

async function load(generator: Generator, port: number, body: string, duration: number): Promise<Load> {
  if (generator === 'wrk') {
    const w = await startWrk({ port, body, duration, connections: CONNECTIONS, threads: WRK_THREADS }).done;
    return { ok: w.requests - w.non2xx, non2xx: w.non2xx, errors: w.errors, seconds: w.seconds, p50: w.p50, p99: w.p99, cpu: w.cpuSeconds };
  }
  const samples: number[] = [];
  const own0 = process.cpuUsage();
  const r = await cannon(port, { duration, connections: CONNECTIONS, body, samples });
  const own = process.cpuUsage(own0);
  samples.sort((a, b) => a - b);
  return { ok: r['2xx'], non2xx: r.non2xx, errors: r.errors + r.timeouts, seconds: r.duration, p50: percentile(samples, 50), p99: percentile(samples, 99), cpu: (own.user + own.system) / 1e6 };
}

async function snapshot(p: Parties) {
  return { proxy: p.proxy === null ? null : cpuSeconds(p.proxy), upstream: cpuSeconds(p.upstream), redis: p.redis ? await p.redis.cpuSeconds() : null, machine: machineCpu(), at: performance.now() };
}

/** One throughput round: `duration` seconds of load, and the CPU every process spent per response. */
export async function measureRound(opts: { generator: Generator; port: number; body: string; duration: number; parties: Parties }): Promise<Round> {
  const a = await snapshot(opts.parties);
  const l = await load(opts.generator, opts.port, opts.body, opts.duration);
  const b = await snapshot(opts.parties);
  const wall = (b.at - a.at) / 1000;
  const us = (x0: number | null, x1: number | null) => (x0 === null || x1 === null || l.ok === 0 ? NaN : ((x1 - x0) * 1e6) / l.ok);
  const cpu: CpuPerRequest = {
    proxy: opts.parties.proxy === null ? null : us(a.proxy, b.proxy),
    redis: opts.parties.redis === null ? null : us(a.redis, b.redis),
    upstream: us(a.upstream, b.upstream),
    generator: l.cpu === null || l.ok === 0 ? NaN : (l.cpu * 1e6) / l.ok,
    total: NaN,
  };
  cpu.total = (cpu.proxy ?? 0) + (cpu.redis ?? 0) + cpu.upstream + cpu.generator;
  return {
    rps: l.ok / l.seconds,
    ok: l.ok,
    non2xx: l.non2xx,
    errors: l.errors,
    p50: l.p50,
    p99: l.p99,
    seconds: l.seconds,
    cpu,
    cores: {
      ours: (cpu.total * l.ok) / 1e6 / wall,
      machine: a.machine && b.machine ? (b.machine.busy - a.machine.busy) / wall : NaN,
    },
  };
}

/** Latency at `rate` requests a second, evenly paced (paced.ts), from each request's scheduled time. */
export async function latencyPaced(port: number, rate: number, duration: number, body = BODY): Promise<Latency> {
  const r = await paced({ host: '127.0.0.1', port, request: rawRequest(body), rate, durationMs: duration * 1000 });
  const s = r.latencies.sort((a, b) => a - b);
  return { rate, achieved: r.latencies.length / duration, p50: percentile(s, 50), p99: percentile(s, 99), samples: s.length, non2xx: r.non2xx, errors: r.errors };
}

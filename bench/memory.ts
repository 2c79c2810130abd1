/**
 * Memory benchmark (`npm run bench:memory`): resident set size (RSS, from /proc) of the
 * server under test, idle and under two loads, each reported as +MB over its idle figure:
 *   streams  MEM_STREAMS (1,000) concurrent SSE streams held open through it; the upstream
 *            (bench/servers/slow-upstream.ts) sends one event at once and one a second
 *   upload   one MEM_UPLOAD_MIB (1,024 MiB) multipart upload to POST /v1/files, generated
 *            as it is sent (nothing on disk), peak RSS while it streams through
 * Servers: bare http-proxy-3 (the reference) and keyward with Redis limits (every stream
 * holds a concurrency slot whose lease is refreshed), or the in-process limiter without Redis;
 * keyward twice, as Node starts it and with its young generation capped (YOUNG_CAP).
 * Each server runs in its own process, started fresh for each of the two loads.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { redisAvailable } from './lib/servers.js';
import { generateKey } from '../src/auth/keyformat.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const STREAMS = Number(process.env.MEM_STREAMS) || 1_000;
const UPLOAD_MIB = Number(process.env.MEM_UPLOAD_MIB) || 1_024;
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
/**
 * The young generation capped at Node 22's size (docs/operations.md, "Memory"): from Node
 * 24 V8 lets it grow to 64 MB semi-spaces under load, most of what the streams add to RSS.
 */
const YOUNG_CAP = ['--max-semi-space-size=16'];
const KEY = generateKey();
const log = (line: string) => process.stderr.write(`${line}\n`);
const MB = 1024 * 1024;

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGTERM');
});

function start(script: string, args: string[], nodeArgs: readonly string[] = []): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', join(root, 'bench', 'servers', script), ...args], {
    cwd: root,
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, KW_BENCH_KEY: KEY },
  });
  children.add(child);
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`${script} exited early with ${code}`)));
    createInterface({ input: child.stdout! }).once('line', (line) => resolve({ child, port: Number((JSON.parse(line) as { port: number }).port) }));
  });
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.stdin?.end();
  });
}

/** RSS in bytes, from /proc/PID/status */
function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Highest RSS seen every 100 ms while `work` runs. */
async function peakDuring<T>(pid: number, work: Promise<T>): Promise<{ peak: number; result: T }> {
  let peak = rss(pid);
  const timer = setInterval(() => (peak = Math.max(peak, rss(pid))), 100);
  try {
    const result = await work;
    return { peak: Math.max(peak, rss(pid)), result };
  } finally {
    clearInterval(timer);
  }
}

const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
const headers = { authorization: `Bearer ${KEY}` };

function post(port: number, path: string, body: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path, agent, headers: { ...headers, 'content-type': 'application/json' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Opens one SSE stream; resolves once its first event has arrived. */
function openStream(port: number): Promise<http.ClientRequest> {
  const body = JSON.stringify({ model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 16 });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', agent, headers: { ...headers, 'content-type': 'application/json' } }, (res) => {
      if (res.statusCode !== 200) return reject(new Error(`stream answered ${res.statusCode}`));
      res.once('data', () => resolve(req));
      res.on('error', () => undefined);
    });
    req.on('error', (err) => reject(err));
    req.end(body);
  });
}

/** A multipart upload of `bytes` file bytes, generated chunk by chunk; resolves with the upstream's byte count. */
function upload(port: number, bytes: number): Promise<number> {
  const boundary = 'kwbench0123456789';
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  const chunk = Buffer.alloc(64 * 1024, 'x');
  async function* body() {
    yield head;
    for (let left = bytes; left > 0; left -= chunk.length) yield left >= chunk.length ? chunk : chunk.subarray(0, left);
    yield tail;
  }
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1', port, method: 'POST', path: '/v1/files', agent,
        headers: { ...headers, 'content-type': `multipart/form-data; boundary=${boundary}`, 'content-length': head.length + bytes + tail.length },
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => {
          if (res.statusCode !== 200) return reject(new Error(`upload answered ${res.statusCode}: ${Buffer.concat(parts).toString()}`));
          resolve((JSON.parse(Buffer.concat(parts).toString()) as { bytes: number }).bytes);
        });
      },
    );
    req.on('error', reject);
    Readable.from(body()).pipe(req);
  });
}

interface Row {
  name: string;
  idleMb: number;
  streamsMb: number;
  uploadPeakMb: number;
  uploadMbPerS: number;
}

/** Starts the server fresh, warms it, lets it settle and reads its idle RSS. */
async function fresh(script: string, args: string[], nodeArgs: readonly string[]): Promise<{ child: ChildProcess; port: number; pid: number; idle: number }> {
  const server = await start(script, args, nodeArgs);
  // warm the code paths, then let the process settle
  for (let i = 0; i < 200; i++) await post(server.port, '/v1/chat/completions', JSON.stringify({ model: 'gpt-4o-mini', messages: [] })).catch(() => 0);
  await pause(1_000);
  return { ...server, pid: server.child.pid!, idle: rss(server.child.pid!) };
}

/** Each load on a fresh process, so what one leaves behind is not charged to the other. */
async function measure(name: string, script: string, args: string[], nodeArgs: readonly string[] = []): Promise<Row> {
  const a = await fresh(script, args, nodeArgs);
  log(`${name}: idle ${(a.idle / MB).toFixed(1)} MB; opening ${STREAMS} streams`);
  const streams: http.ClientRequest[] = [];
  for (let i = 0; i < STREAMS; i += 100) streams.push(...(await Promise.all(Array.from({ length: Math.min(100, STREAMS - i) }, () => openStream(a.port)))));
  // two seconds with every stream open (each gets two more events), highest figure
  const { peak: withStreams } = await peakDuring(a.pid, pause(2_000));
  log(`${name}: ${streams.length} streams open: ${(withStreams / MB).toFixed(1)} MB`);
  for (const s of streams) s.destroy();
  await stop(a.child);

  const b = await fresh(script, args, nodeArgs);
  log(`${name}: idle ${(b.idle / MB).toFixed(1)} MB; uploading ${UPLOAD_MIB} MiB`);
  const t0 = process.hrtime.bigint();
  const { peak: duringUpload, result: received } = await peakDuring(b.pid, upload(b.port, UPLOAD_MIB * MB));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  if (received < UPLOAD_MIB * MB) throw new Error(`${name}: the upstream received ${received} bytes of the upload`);
  log(`${name}: ${UPLOAD_MIB} MiB upload in ${seconds.toFixed(1)} s, peak ${(duringUpload / MB).toFixed(1)} MB`);
  await stop(b.child);
  return {
    name,
    idleMb: a.idle / MB,
    streamsMb: (withStreams - a.idle) / MB,
    uploadPeakMb: (duringUpload - b.idle) / MB,
    uploadMbPerS: UPLOAD_MIB / seconds,
  };
}


async function main(): Promise<void> {
  const started = Date.now();
  const upstream = await start('slow-upstream.ts', []);
  const url = `http://127.0.0.1:${upstream.port}`;
  const withRedis = await redisAvailable(REDIS_URL);
  const [name, args] = withRedis ? ['keyward-redis', [url, 'redis', REDIS_URL]] : ['keyward', [url, 'memory']];
  const rows = [
    await measure('bare', 'bare.ts', [url]),
    await measure(name, 'keyward.ts', args),
    await measure(`${name} ${YOUNG_CAP.join(' ')}`, 'keyward.ts', args, YOUNG_CAP),
  ];
  await stop(upstream.child);
  const f = (n: number) => n.toFixed(1);
  const width = Math.max(16, ...rows.map((r) => r.name.length + 2));
  const verdict = (r: Row) => `${r.name}: streams ${r.streamsMb <= 64 ? 'ok' : 'MISSED'}, upload ${r.uploadPeakMb <= 64 ? 'ok' : 'MISSED'}`;
  const out = [
    '',
    `keyward memory benchmark — node ${process.version}; RSS of the server process; ${STREAMS} SSE streams held open; one ${UPLOAD_MIB} MiB multipart upload (generated)`,
    '',
    `${'variant'.padEnd(width)}${'idle MB'.padStart(10)}${`+MB ${STREAMS} streams`.padStart(20)}${'+MB upload peak'.padStart(18)}${'upload MB/s'.padStart(13)}`,
    ...rows.map((r) => `${r.name.padEnd(width)}${f(r.idleMb).padStart(10)}${f(r.streamsMb).padStart(20)}${f(r.uploadPeakMb).padStart(18)}${f(r.uploadMbPerS).padStart(13)}`),
    '',
    `targets (issue): streams +MB ≤ 64, upload +MB ≤ 64 — ${verdict(rows[1]!)}; ${verdict(rows[2]!)}`,
    `took ${((Date.now() - started) / 1000).toFixed(0)} s`,
  ];
  process.stdout.write(`${out.join('\n')}\n`);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench:memory failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);

/**
 * What one `npm run bench` run measures and how (bench/run.ts has the overview): settings
 * from the environment, the one request every variant is sent, and the variants.
 */
import { spawnSync } from 'node:child_process';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateKey } from '../../src/auth/keyformat.js';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** A positive number from the environment, else `def`. */
export const env = (name: string, def: number) => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : def;
};
export const ROUNDS = env('BENCH_ROUNDS', 3);
export const DURATION = env('BENCH_DURATION', 5);
export const WARMUP = env('BENCH_WARMUP', 3);
export const CONNECTIONS = env('BENCH_CONNECTIONS', 32);
export const RATE_CONNECTIONS = env('BENCH_RATE_CONNECTIONS', 8);
export const RATE_FRACTION = env('BENCH_RATE_FRACTION', 0.5);
export const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
export const PROFILE = process.env.BENCH_PROFILE === '1';
/** comma-separated subset of variants to run (bare always runs: it is the baseline) */
export const ONLY = process.env.BENCH_VARIANTS ? process.env.BENCH_VARIANTS.split(',').map((v) => v.trim()) : null;
export const PIN = process.env.BENCH_PIN === '1' && cpus().length >= 2 && spawnSync('taskset', ['-V']).status === 0;

export const PATH = '/v1/chat/completions';
/** One key for every variant, so that all of them get byte-identical requests. */
export const KEY = generateKey();
export const BODY = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Hello, how are you today?' }], max_tokens: 16 });
export const HEADERS = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
/** The same request as bytes on the wire, for the paced generator (paced.ts). */
export const RAW_REQUEST = Buffer.from(
  `POST ${PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: ${HEADERS.authorization}\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(BODY)}\r\nconnection: keep-alive\r\n\r\n${BODY}`,
);

export type Variant = 'direct' | 'bare' | 'keyward' | 'keyward-redis' | 'keyward-redis-budgets' | 'keyward-redis-w2';
export const VARIANTS: Variant[] = ['direct', 'bare', 'keyward', 'keyward-redis', 'keyward-redis-budgets', 'keyward-redis-w2'];
/** measured for throughput only: the fixed-rate latency section keeps to one process per variant, for time */
export const THROUGHPUT_ONLY = new Set<Variant>(['keyward-redis-w2']);
export const wanted = (v: Variant): boolean => ONLY === null || ONLY.includes(v);

export const log = (line: string): void => void process.stderr.write(`${line}\n`);

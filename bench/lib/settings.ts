/**
 * What one `npm run bench` run measures and how (bench/run.ts has the overview): settings
 * from the environment, the requests every variant is sent, generators and variants.
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
export const RATE_FRACTION = env('BENCH_RATE_FRACTION', 0.5);
export const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
/** whether BENCH_REDIS_URL names the Redis to use; else `npm run bench` starts a private redis-server when it can */
export const REDIS_URL_GIVEN = process.env.BENCH_REDIS_URL !== undefined;
export const PROFILE = process.env.BENCH_PROFILE === '1';
/** comma-separated subset of variants to run (bare always runs: it is the baseline) */
export const ONLY = process.env.BENCH_VARIANTS ? process.env.BENCH_VARIANTS.split(',').map((v) => v.trim()) : null;
export const PIN = process.env.BENCH_PIN === '1' && cpus().length >= 2 && spawnSync('taskset', ['-V']).status === 0;

export const PATH = '/v1/chat/completions';
/** One key for every variant, so that all of them get byte-identical requests. */
export const KEY = generateKey();
/** The short request the other scripts in bench/ send (their figures in README were taken with it). */
export const BODY = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Hello, how are you today?' }], max_tokens: 16 });
/**
 * A typical chat prompt, about 1 KB: a system message and a user message. keyward reads the
 * body (model, token estimate) where a bare proxy only streams it, so the body's size is part
 * of what the benchmark compares.
 */
export const CHAT_BODY = JSON.stringify({
  model: 'gpt-4o-mini',
  messages: [
    {
      role: 'system',
      content:
        'You are a careful assistant for an engineering team. Answer in plain English, keep answers short, and say when you are unsure. ' +
        'When the user pastes code, point at the line you mean and explain why it matters before proposing a change. ' +
        'Never invent APIs: if a function is not in the documentation you were given, say so. Prefer the tools the team already runs over new ones.',
    },
    {
      role: 'user',
      content:
        'Our service proxies requests to a model gateway and we see latency spikes every few minutes. The spikes last about two seconds, ' +
        'affect every route at once, and line up with a cron job that compacts a SQLite file on the same host. CPU on the host stays under ' +
        'sixty percent during the spikes, but disk utilisation reaches one hundred percent. What should we check first, and how would you ' +
        'confirm that the compaction is the cause without turning it off in production? Please list the steps in order, shortest first.',
    },
  ],
  temperature: 0.2,
  max_tokens: 256,
});
export type BodyName = 'chat-1k' | 'small';
/** The main column first. */
export const BODIES: Record<BodyName, string> = { 'chat-1k': CHAT_BODY, small: BODY };
export const BODY_NAMES = (process.env.BENCH_BODIES?.split(',').map((b) => b.trim()) ?? ['chat-1k', 'small']).filter((b): b is BodyName => b in BODIES);
export const HEADERS = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
/** A request as bytes on the wire, for the paced generator (paced.ts). */
export const rawRequest = (body: string): Buffer =>
  Buffer.from(
    `POST ${PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: ${HEADERS.authorization}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\nconnection: keep-alive\r\n\r\n${body}`,
  );
export const RAW_REQUEST = rawRequest(BODY);

export type Generator = 'wrk' | 'autocannon';
/** wrk first: it is what an outside harness runs. */
export const GENERATORS = (process.env.BENCH_GENERATORS?.split(',').map((g) => g.trim()) ?? ['wrk', 'autocannon']).filter((g): g is Generator => g === 'wrk' || g === 'autocannon');
export const WRK_THREADS = env('BENCH_WRK_THREADS', 1);

export type Variant = 'direct' | 'bare' | 'keyward' | 'keyward-redis' | 'keyward-redis-budgets' | 'keyward-redis-w2';
export const VARIANTS: Variant[] = ['direct', 'bare', 'keyward', 'keyward-redis', 'keyward-redis-budgets', 'keyward-redis-w2'];
export const wanted = (v: Variant): boolean => ONLY === null || ONLY.includes(v);

export const log = (line: string): void => void process.stderr.write(`${line}\n`);

/**
 * `limits.leaseMs` on a live reload (DESIGN section 12): a real `keyward serve` with Redis
 * limits, its config file rewritten while a stream holds a concurrency slot. The slot in
 * Redis moves to the new term at its next refresh, which comes within the new refresh
 * period; the next slot is granted for the new term; nothing is named as needing a restart.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { configMetrics, scrape } from '../helpers/instance.js';
import { chatUpstream, importKeys, logLines, nextReload } from '../helpers/reload.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const secret = `sk-conc-${randomBytes(8).toString('hex')}`;
const prefix = `kwlt${randomBytes(4).toString('hex')}`;
/** the key's concurrency lease set (DESIGN section 6: everything of one key under one hash tag) */
const slots = `{${prefix}:k:k_conc}:conc`;

let dir: string;
let file: string;
let up: FakeUpstream;
let kw: SidecarProcess;
let redis: Redis;

const yaml = (leaseMs: number) =>
  [
    'server: { port: 0 }',
    'admin: { port: 0 }',
    `upstreams: { default: { url: ${up.url} } }`,
    `replica: { path: ${join(dir, 'replica.sqlite')} }`,
    `redis: { url: ${TEST_REDIS_URL}, prefix: ${prefix}, timeoutMs: 1000, onError: closed }`,
    `limits: { leaseMs: ${leaseMs} }`,
    '',
  ].join('\n');

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-lease-'));
  up = await startFakeUpstream(chatUpstream('A'));
  await importKeys(dir, join(dir, 'replica.sqlite'), { k_conc: { secret, concurrency: 4 } });
  kw = await spawnSidecar({ dir, name: 'lease', yaml: yaml(30_000) });
  file = join(dir, 'lease.yaml');
  redis = new Redis(TEST_REDIS_URL);
});

after(async () => {
  await kw?.stop('SIGKILL');
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
  await up?.close();
  rmSync(dir, { recursive: true, force: true });
});

/**
 * A slow stream (about 5.5 s) that holds one of the key's slots until it ends or is aborted.
 * It is read as it comes: a response body left unread may be cancelled once collected.
 */
async function openStream(): Promise<{ abort(): Promise<void> }> {
  const client = new OpenAI({ apiKey: secret, baseURL: `${kw.url}/v1`, maxRetries: 0, timeout: 20_000 });
  const stream = await client.chat.completions.create({ model: 'slow', stream: true, messages: [{ role: 'user', content: 'hi' }] });
  const read = (async () => {
    for await (const chunk of stream) void chunk;
  })().catch(() => undefined);
  return {
    abort: () => {
      stream.controller.abort();
      return read;
    },
  };
}

/** Each slot's time left in Redis (its expiry against Redis' clock), by lease id. */
async function timeLeft(): Promise<Map<string, number>> {
  const [[, scores], [, time]] = (await redis.multi().zrange(slots, '0', '-1', 'WITHSCORES').time().exec()) as [[null, string[]], [null, [string, string]]];
  const now = Number(time[0]) * 1000 + Math.floor(Number(time[1]) / 1000);
  const left = new Map<string, number>();
  for (let i = 0; i < scores.length; i += 2) left.set(scores[i]!, Number(scores[i + 1]) - now);
  return left;
}

test('a new leaseMs reaches a slot in flight at its next refresh and every slot granted after it; nothing needs a restart', { timeout: 30_000 }, async () => {
  const first = await openStream();
  const [[id, left]] = [...(await timeLeft())] as [[string, number]];
  assert.ok(left > 20_000 && left <= 30_000, `granted for 30 s: ${left} ms left`);

  const before = configMetrics(await scrape(kw));
  writeFileSync(file, yaml(3_000));
  await nextReload(kw, before, 'ok');
  assert.deepEqual(logLines(kw).filter((l) => l.level === 'warn' || l.needs_restart), [], 'no setting needs a restart');

  // The keeper refreshes within the new period (1 s), not the old one (10 s), and tells Redis 3 s.
  const reloaded = performance.now();
  for (;;) {
    const now = (await timeLeft()).get(id);
    assert.ok(now !== undefined, `the slot in flight is still held: ${JSON.stringify([...(await timeLeft())])}`);
    if (now <= 3_000) break;
    assert.ok(performance.now() - reloaded < 4_000, `the slot still had ${now} ms left 4 s after the reload`);
    await new Promise((r) => setTimeout(r, 100));
  }

  const second = await openStream();
  const granted = [...(await timeLeft())].filter(([lease]) => lease !== id);
  assert.equal(granted.length, 1);
  assert.ok(granted[0]![1] > 0 && granted[0]![1] <= 3_000, `granted for 3 s: ${granted[0]![1]} ms left`);
  await Promise.all([first.abort(), second.abort()]);
});

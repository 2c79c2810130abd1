/**
 * The spend-hold guarantee (DESIGN section 6, Money) end to end over HTTP: with R left on
 * a budget and 20 concurrent requests whose cost estimate is exactly R/2.5, at most two
 * reach the upstream — whatever instance they arrive at — and the rest are 402 with the
 * code of the holder that ran out. For a key budget, a project budget and a wallet, on two
 * `keyward serve` processes sharing one Redis (replicas fed by `keyward import`), and on
 * one in-process sidecar with the memory limiter.
 *
 * The upstream holds every response until all 20 requests are decided: a settled request
 * would give back part of its hold, and the guarantee is about requests whose usage is not
 * known yet. Once settled, a hold becomes the request's actual cost, input and output priced,
 * on the holder it drew on.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { generateKey } from '../../src/auth/keyformat.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import type { SyncRecord } from '../../src/protocol/records.js';
import { startFakeUpstream, type FakeUpstream, type Received } from '../helpers/upstream.js';
import { keyRecord, startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { KEYWARD_ARGS, spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const REDIS = TEST_REDIS_URL;
const prefix = `kwmoney${randomBytes(4).toString('hex')}`;
const CONCURRENT = 20;

// R = 5 on every holder. Price 1 per 1000 tokens in and out; a body of exactly 400 bytes
// (100 prompt tokens) naming max_tokens 1900 holds (100 + 1900) / 1000 = 2 = R / 2.5.
const LEFT = 5;
const HOLD = 2;
const BODY_BYTES = 400;
const MAX_TOKENS = 1900;
const PRICE = { type: 'price', model: 'gpt-4o*', input: 1, output: 1, per: 1000 } as const;

const secrets = { k_kb: generateKey(), k_pb: generateKey(), k_w: generateKey() };
const hash = makeKeyHasher({ hash: 'sha256' });
const RECORDS: SyncRecord[] = [
  PRICE,
  { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 },
  { type: 'project', id: 'p_tight', status: 'enabled', budget: 10, spent: 10 - LEFT },
  { type: 'wallet', user: 'u_w', balance: LEFT },
  keyRecord('k_kb', { project: 'p_free', budget: 10, spent: 10 - LEFT }, hash(secrets.k_kb)),
  keyRecord('k_pb', { project: 'p_tight' }, hash(secrets.k_pb)),
  keyRecord('k_w', { user: 'u_w' }, hash(secrets.k_w)),
];
const CASES = [
  { holder: 'key budget', key: 'k_kb', code: 'key_budget_exhausted' },
  { holder: 'project budget', key: 'k_pb', code: 'project_budget_exhausted' },
  { holder: 'wallet', key: 'k_w', code: 'insufficient_balance' },
] as const;

/** A chat request of exactly BODY_BYTES bytes. */
function chatBody(): string {
  const shape = (content: string) => JSON.stringify({ model: 'gpt-4o-mini', max_tokens: MAX_TOKENS, messages: [{ role: 'user', content }] });
  const body = shape('x'.repeat(BODY_BYTES - shape('').length));
  assert.equal(Buffer.byteLength(body), BODY_BYTES);
  return body;
}

let up: FakeUpstream;
let release: () => void = () => {};
let gate: Promise<void> = Promise.resolve();
/** called when the upstream has read a request whole (it is in `up.received` by then) */
let onReceived: () => void = () => {};
let dir: string;
let redis: Redis;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-money-'));
  redis = new Redis(REDIS);
  up = await startFakeUpstream(async (_req, res) => {
    onReceived();
    await gate;
    const text = JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o-mini', choices: [], usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 } });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
});
after(async () => {
  release();
  await up.close();
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

/**
 * Sends CONCURRENT requests for `key`, spread over `urls`, and waits until every one is
 * either answered or being held at the upstream; then lets the upstream answer.
 */
async function burst(urls: string[], key: string): Promise<{ reached: number; statuses: number[]; codes: (string | null)[] }> {
  gate = new Promise((r) => (release = r));
  const auth = `Bearer ${key}`;
  const isOurs = (rec: Received) => rec.headers.authorization === auth;
  const reachedBefore = up.received.filter(isOurs).length;
  let answered = 0;
  let check = () => {};
  onReceived = () => check();
  const body = chatBody();
  const calls = Array.from({ length: CONCURRENT }, (_, i) =>
    fetch(`${urls[i % urls.length]}/v1/chat/completions`, { method: 'POST', headers: { authorization: auth, 'content-type': 'application/json' }, body }).then(async (r) => {
      await r.arrayBuffer();
      answered++;
      check();
      return { status: r.status, code: r.headers.get('x-keyward-error') };
    }),
  );
  try {
    // Every request decided: answered (refused), or at the upstream (whose answer waits on the gate).
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`undecided: ${answered} answered, ${up.received.filter(isOurs).length - reachedBefore} at the upstream`)), 20_000);
      check = () => {
        if (answered + up.received.filter(isOurs).length - reachedBefore >= CONCURRENT) {
          clearTimeout(timer);
          resolve();
        }
      };
      check();
    });
  } finally {
    onReceived = () => {};
  }
  const reached = up.received.filter(isOurs).length - reachedBefore;
  release();
  const results = await Promise.all(calls);
  return { reached, statuses: results.map((r) => r.status), codes: results.map((r) => r.code) };
}

function assertAtMostTwo(r: Awaited<ReturnType<typeof burst>>, code: string): void {
  assert.ok(r.reached <= 2, `${r.reached} requests reached the upstream; holds of ${HOLD} on ${LEFT} left allow 2`);
  assert.equal(r.reached, 2, 'both requests that fit were admitted');
  assert.equal(r.statuses.filter((s) => s === 200).length, r.reached);
  const refused = r.statuses.map((s, i) => ({ s, code: r.codes[i] })).filter((x) => x.s !== 200);
  assert.equal(refused.length, CONCURRENT - r.reached);
  for (const x of refused) assert.deepEqual(x, { s: 402, code });
}

describe('spend holds across two sidecar processes sharing Redis', () => {
  let a: SidecarProcess;
  let b: SidecarProcess;

  before(async () => {
    const snapshot = join(dir, 'snapshot.ndjson');
    writeFileSync(snapshot, [{ type: 'meta', version: 1 }, ...RECORDS].map((r) => JSON.stringify(r)).join('\n') + '\n');
    const yaml = (name: string) =>
      `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${join(dir, `${name}.sqlite`)} }\n` +
      `redis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 1000 }\nlogging: { level: info }\n`;
    // Each instance has its own replica, fed the same snapshot by `keyward import`.
    for (const name of ['a', 'b']) {
      const out = await promisify(execFile)(process.execPath, [...KEYWARD_ARGS, 'import', '--replica', join(dir, `${name}.sqlite`), snapshot]);
      assert.match(out.stdout, /imported version 1: 3 keys, 2 projects, 1 wallets/);
    }
    const started = await Promise.all(['a', 'b'].map((name) => spawnSidecar({ dir, name, yaml: yaml(name) })));
    a = started[0]!;
    b = started[1]!;
  });
  after(async () => {
    await Promise.all([a?.stop(), b?.stop()]);
  });

  for (const c of CASES) {
    test(`${c.holder}: ${CONCURRENT} concurrent requests holding R/2.5 each, over two instances -> at most 2 reach the upstream, the rest 402 ${c.code}`, { timeout: 40_000 }, async () => {
      assertAtMostTwo(await burst([a.url, b.url], secrets[c.key]), c.code);
    });
  }
});

describe('spend holds on one instance with the in-process limiter', () => {
  let h: Harness;
  before(async () => {
    h = await startHarness({
      upstream: up.url,
      keys: {
        k_kb: { project: 'p_free', budget: 10, spent: 10 - LEFT, secret: secrets.k_kb },
        k_pb: { project: 'p_tight', secret: secrets.k_pb },
        k_w: { user: 'u_w', secret: secrets.k_w },
        k_settle: { project: 'p_free', budget: 100, spent: 0 },
        k_settle_w: { user: 'u_settle' },
      },
      records: [
        ...RECORDS.filter((r) => r.type !== 'key'),
        { type: 'wallet', user: 'u_settle', balance: 50 },
        // input and output priced apart, so a cost missing either part shows
        { type: 'price', model: 'settle-model', input: 10, output: 100, per: 1000 },
      ],
    });
  });
  after(async () => {
    await h?.close();
  });

  for (const c of CASES) {
    test(`${c.holder}: ${CONCURRENT} concurrent requests holding R/2.5 each -> at most 2 reach the upstream, the rest 402 ${c.code}`, { timeout: 40_000 }, async () => {
      assertAtMostTwo(await burst([h.url], secrets[c.key]), c.code);
    });
  }

  /** One settled request for `key` (the upstream reports 100 input and 10 output tokens), then the key's own view. */
  async function settledView(key: string): Promise<{ budget: { spent: number } | null; balance: number | null }> {
    const body = JSON.stringify({ model: 'settle-model', max_tokens: 5, messages: [] });
    const r = await fetch(`${h.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body });
    assert.equal(r.status, 200);
    const id = r.headers.get('x-request-id');
    await r.arrayBuffer();
    await waitForLine(h, (l) => l.msg === 'request' && l.req_id === id);
    const me = await fetch(`${h.url}/v1/key`, { headers: { authorization: `Bearer ${key}` } });
    return (await me.json()) as { budget: { spent: number } | null; balance: number | null };
  }

  // 100 input at 10/1000 plus 10 output at 100/1000
  const COST = 2;

  test("a settled request's cost, input and output, is the key budget's live spend", async () => {
    assert.equal((await settledView(h.keys.k_settle!)).budget?.spent, COST);
  });

  test("a settled request's cost, input and output, comes off the wallet's live balance", async () => {
    assert.equal((await settledView(h.keys.k_settle_w!)).balance, 50 - COST);
  });
});

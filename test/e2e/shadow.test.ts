/**
 * Shadow limits (DESIGN section 12) as a client and an operator see them, through
 * `keyward serve` processes and the official openai client:
 *  - `limits.shadow: [rpm]`: an RPM-2 key's four requests are all answered by the upstream,
 *    unchanged; the third and fourth carry `x-keyward-shadow: rpm_exceeded` and the RPM
 *    figures of an enforced limit (remaining 0), their access lines say `"shadow"`, and
 *    `keyward_shadow_denials_total{code="rpm_exceeded"}` counts them; taken out of the list
 *    and reloaded, the limit refuses the next request at once;
 *  - the same without shadow: the third is the client's RateLimitError, a 429 carrying the
 *    key's x-ratelimit-* figures (DESIGN section 11) besides Retry-After;
 *  - a key whose console record shadows `budget`, on a wallet at 0: forwarded, and billed
 *    (the usage event reaches the console, which charges the wallet); a key of the same
 *    wallet without it is refused 402.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { generateKey } from '../../src/auth/keyformat.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { accessOf, configMetrics, importReplica, readyz, scrape, untilScraped } from '../helpers/instance.js';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { keyRecord } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

const ANSWER = {
  id: 'chatcmpl-shadow', object: 'chat.completion', created: 1, model: 'gpt-4o-mini',
  choices: [{ index: 0, message: { role: 'assistant', content: 'from the upstream', refusal: null }, finish_reason: 'stop', logprobs: null }],
  usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 },
};

let up: FakeUpstream;
let dir: string;
const secret = generateKey();
const running: SidecarProcess[] = [];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-shadow-e2e-'));
  up = await startFakeUpstream((_req, res) => {
    const text = JSON.stringify(ANSWER);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  const snapshot = join(dir, 'snapshot.ndjson');
  const records = [
    { type: 'meta', version: 1 },
    { type: 'wallet', user: 'u_default', balance: 10 },
    keyRecord('k_rpm2', { rpm: 2 }, makeKeyHasher({ hash: 'sha256' })(secret)),
  ];
  writeFileSync(snapshot, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  for (const name of ['shadowed', 'enforced']) await importReplica(snapshot, join(dir, `${name}.sqlite`));
});
after(async () => {
  await Promise.all(running.map((p) => p.stop('SIGKILL')));
  await up?.close();
  rmSync(dir, { recursive: true, force: true });
});

const yaml = (lines: string[]): string => ['server: { port: 0 }', 'admin: { port: 0 }', `upstreams: { default: { url: ${up.url} } }`, 'logging: { level: info }', ...lines, ''].join('\n');

async function serve(name: string, lines: string[]): Promise<SidecarProcess> {
  const p = await spawnSidecar({ dir, name, yaml: yaml(lines) });
  running.push(p);
  return p;
}

const client = (p: SidecarProcess, key: string) => new OpenAI({ apiKey: key, baseURL: `${p.url}/v1`, maxRetries: 0, timeout: 10_000 });
const ask = (p: SidecarProcess, key: string) =>
  client(p, key).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20 }).withResponse();

describe('limits.shadow: [rpm] through keyward serve and the openai client', () => {
  test('an RPM-2 key makes 4 requests: all answered by the upstream; the 3rd and 4th say rpm_exceeded in the header, the access line and the metric', async () => {
    const p = await serve('shadowed', [`replica: { path: ${join(dir, 'shadowed.sqlite')} }`, 'limits: { shadow: [rpm] }']);
    const reached = up.received.length;
    const rs: Awaited<ReturnType<typeof ask>>[] = [];
    for (let i = 0; i < 4; i++) rs.push(await ask(p, secret));
    assert.equal(up.received.length - reached, 4, 'every request was forwarded');
    for (const r of rs) assert.deepEqual(r.data, ANSWER, "the upstream's answer, unchanged");
    const header = (i: number, name: string) => rs[i]!.response.headers.get(name);
    assert.deepEqual([0, 1, 2, 3].map((i) => header(i, 'x-keyward-shadow')), [null, null, 'rpm_exceeded', 'rpm_exceeded']);
    // The shadowed limit's own figures, as for an enforced one.
    assert.deepEqual([0, 1, 2, 3].map((i) => header(i, 'x-ratelimit-remaining-requests')), ['1', '0', '0', '0']);
    for (let i = 0; i < 4; i++) assert.equal(header(i, 'x-ratelimit-limit-requests'), '2');

    const ids = rs.map((r) => r.response.headers.get('x-request-id')!);
    const lines = await accessOf(p, ids);
    const byId = new Map(lines.map((l) => [l.req_id, l as unknown as Record<string, unknown>]));
    assert.deepEqual(ids.map((id) => byId.get(id)!.status), [200, 200, 200, 200]);
    assert.deepEqual(ids.map((id) => byId.get(id)!.shadow), [undefined, undefined, ['rpm_exceeded'], ['rpm_exceeded']]);
    const metrics = await scrape(p);
    assert.equal(metrics.get('keyward_shadow_denials_total{code="rpm_exceeded"}'), 2);

    // GET /v1/key shows the shadowed limit as an enforced one: nothing left this minute.
    const view = (await (await fetch(`${p.url}/v1/key`, { headers: { authorization: `Bearer ${secret}` } })).json()) as { limits: { rpm: number }; remaining: { requests: number } };
    assert.deepEqual([view.limits.rpm, view.remaining.requests], [2, 0]);

    // Enforce it: out of the shadow list, and a reload. The shadowed requests took no token,
    // so the bucket is where the first two left it and the next request is refused at once,
    // its wait one token's (30 s at 2 a minute), not three.
    const before = configMetrics(await scrape(p));
    writeFileSync(join(dir, 'shadowed.yaml'), yaml([`replica: { path: ${join(dir, 'shadowed.sqlite')} }`]));
    p.child.kill('SIGHUP');
    await untilScraped(p, (m) => configMetrics(m).ok > before.ok, 'the reload');
    const err = await ask(p, secret).then(() => null, (e: unknown) => e);
    assert.ok(err instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${String(err)}`);
    assert.equal(err.headers!.get('x-keyward-shadow'), null);
    assert.equal(err.headers!.get('x-ratelimit-remaining-requests'), '0');
    assert.ok(Number(err.headers!.get('retry-after-ms')) <= 30_000, `retry after ${err.headers!.get('retry-after-ms')} ms`);
    assert.equal(up.received.length - reached, 4, 'the refused request did not reach the upstream');
  });

  test('the same without shadow: the 3rd request is a 429 the client sees, with the key\'s x-ratelimit-* figures', async () => {
    const p = await serve('enforced', [`replica: { path: ${join(dir, 'enforced.sqlite')} }`]);
    for (let i = 0; i < 2; i++) assert.equal((await ask(p, secret)).response.status, 200);
    const reached = up.received.length;
    for (let i = 0; i < 2; i++) {
      const err = await ask(p, secret).then(() => null, (e: unknown) => e);
      assert.ok(err instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${String(err)}`);
      const h = err.headers!;
      assert.equal(h.get('x-keyward-error'), 'rpm_exceeded');
      assert.equal(h.get('x-keyward-shadow'), null);
      assert.equal(h.get('x-ratelimit-limit-requests'), '2');
      assert.equal(h.get('x-ratelimit-remaining-requests'), '0');
      assert.match(h.get('x-ratelimit-reset-requests') ?? '', /^\d+(\.\d+)?s$/);
      assert.ok(Number(h.get('retry-after')) >= 1);
      assert.equal(h.get('x-ratelimit-limit-tokens'), null, 'the key has no TPM limit');
    }
    assert.equal(up.received.length, reached, 'no refused request reached the upstream');
    assert.equal((await scrape(p)).get('keyward_shadow_denials_total{code="rpm_exceeded"}'), undefined);
  });
});

describe("a key record's shadow list from the console: budget", () => {
  let fx: ConsoleFixture;
  before(async () => {
    fx = await startConsoleFixture();
  });
  after(async () => fx?.close());

  test('a wallet at 0: the key shadowing budget is forwarded and billed, the wallet charged; its sibling key is refused 402', async () => {
    assert.equal((await fx.api('PUT', '/admin/v1/wallets/zoe', { body: { balance: 0 } })).status, 200);
    const make = async (body: Record<string, unknown>) => (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'zoe', ...body } })).body as { key: { id: string }; secret: string };
    const shadowed = await make({ shadow: ['budget'] });
    const enforced = await make({});
    const p = await serve('console', [`replica: { path: ${join(dir, 'console.sqlite')} }`, `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }`]);
    while ((await readyz(p)) !== 200) await new Promise((r) => setTimeout(r, 20));

    const ok = await ask(p, shadowed.secret);
    assert.deepEqual(ok.data, ANSWER);
    assert.equal(ok.response.headers.get('x-keyward-shadow'), 'insufficient_balance');
    const refused = await ask(p, enforced.secret).then(() => null, (e: unknown) => e);
    assert.ok(refused instanceof OpenAI.APIError && refused.status === 402, `expected 402, got ${String(refused)}`);
    assert.equal(refused.headers!.get('x-keyward-error'), 'insufficient_balance');

    const [line] = await accessOf(p, [ok.response.headers.get('x-request-id')!]);
    assert.deepEqual((line as unknown as Record<string, unknown>).shadow, ['insufficient_balance']);
    assert.equal((await scrape(p)).get('keyward_shadow_denials_total{code="insufficient_balance"}'), 1);
    // SIGTERM pushes the usage left; the console prices it (1000 in at 0.15/M, 100 out at 0.6/M).
    assert.equal(await p.stop('SIGTERM'), 0);
    const usage = (await fx.api('GET', `/admin/v1/keys/${shadowed.key.id}/usage`)).body.usage as { inputTokens: number; outputTokens: number }[];
    assert.deepEqual(usage.map((u) => [u.inputTokens, u.outputTokens]), [[1000, 100]]);
    const balance = (await fx.api('GET', '/admin/v1/wallets/zoe')).body.wallet.balance as number;
    assert.equal(+balance.toFixed(9), -0.00021, 'shadow never makes a request free');
  });
});

/**
 * Live reload (DESIGN section 12) of a real `keyward serve` process, its config file
 * rewritten on disk between steps, through the official openai client: a reload never
 * refills a limit and a changed limit applies to the state it finds; an invalid file
 * changes nothing and is reported once with every problem; restart-only settings keep
 * their running values and are named as needing a restart.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { configMetrics, scrape, untilLogged } from '../helpers/instance.js';
import { chatUpstream, importKeys, logLines, nextReload } from '../helpers/reload.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { configHash } from '../../src/config/file.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const secrets = { k_route: `sk-route-${randomBytes(8).toString('hex')}`, k_free: `sk-free-${randomBytes(8).toString('hex')}`, k_rpm: `sk-rpm-${randomBytes(8).toString('hex')}` };

let dir: string;
let replica: string;
let up: FakeUpstream;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-'));
  replica = join(dir, 'replica.sqlite');
  up = await startFakeUpstream(chatUpstream('A'));
  await importKeys(dir, replica, { k_route: { secret: secrets.k_route, routing: 'tight' }, k_free: { secret: secrets.k_free }, k_rpm: { secret: secrets.k_rpm, rpm: 1000 } });
});

after(async () => {
  await up?.close();
  rmSync(dir, { recursive: true, force: true });
});

const client = (kw: SidecarProcess, key: string) => new OpenAI({ apiKey: key, baseURL: `${kw.url}/v1`, maxRetries: 0, timeout: 10_000 });
const ask = (kw: SidecarProcess, key: string) => client(kw, key).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] });

/** Resolves with the SDK error a call fails with (and fails the test if it succeeds). */
async function refusal(call: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  const err = await call.then(
    () => assert.fail('expected a refusal'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof OpenAI.APIError, String(err));
  return err;
}

/** A config file: `server` and `upstreams` as given (by default port 0 and the fake upstream), then `extra` lines. */
const configYaml = (o: { server?: string; upstreams?: string; extra?: string[] } = {}) =>
  [`server: { port: 0${o.server ? `, ${o.server}` : ''} }`, 'admin: { port: 0 }', o.upstreams ?? `upstreams: { default: { url: ${up.url} } }`, `replica: { path: ${replica} }`, ...(o.extra ?? []), ''].join('\n');

describe('a reload never refills a limit', () => {
  let kw: SidecarProcess;
  let file: string;
  const yaml = (rpm: number, extra: string[]) => configYaml({ upstreams: `upstreams: { default: { url: ${up.url} }, tight: { url: ${up.url}, capacity: { rpm: ${rpm} } } }`, extra });

  before(async () => {
    kw = await spawnSidecar({ dir, name: 'refill', yaml: yaml(3, ['logging: { level: info }']) });
    file = join(dir, 'refill.yaml');
  });
  after(() => kw?.stop('SIGKILL'));

  test('RPM 3 used up stays refused across a reload of other settings; raising it lets the next request through', async () => {
    for (let i = 0; i < 3; i++) assert.equal((await ask(kw, secrets.k_route)).choices[0]!.message.content, 'A');
    const first = await refusal(ask(kw, secrets.k_route));
    assert.equal(first.status, 429);
    assert.equal(first.code, 'route_capacity_exceeded');

    // Another route and another log level: the upstream's RPM bucket is left as it was.
    let before = configMetrics(await scrape(kw));
    writeFileSync(file, yaml(3, ['logging: { level: debug }', 'routes: [ { path: /v1/rerank, methods: [POST], class: model } ]']));
    await nextReload(kw, before, 'ok');
    const still = await refusal(ask(kw, secrets.k_route));
    assert.equal(still.status, 429, 'the reload did not refill the bucket');
    assert.equal(still.code, 'route_capacity_exceeded');
    // the new route is in force (it was 404 not_found)
    const rerank = await fetch(`${kw.url}/v1/rerank`, { method: 'POST', headers: { authorization: `Bearer ${secrets.k_free}`, 'content-type': 'application/json' }, body: '{"model":"m"}' });
    assert.equal(rerank.status, 200);

    // The limit raised: it applies to the bucket as it stands, which refills at the new rate.
    before = configMetrics(await scrape(kw));
    writeFileSync(file, yaml(60_000, ['logging: { level: debug }']));
    await nextReload(kw, before, 'ok');
    assert.equal((await ask(kw, secrets.k_route)).choices[0]!.message.content, 'A');
  });
});

describe('an invalid file', () => {
  let kw: SidecarProcess;
  let file: string;
  const valid = (maxJson: number) => configYaml({ server: `maxJsonBodyBytes: ${maxJson}` });

  before(async () => {
    kw = await spawnSidecar({ dir, name: 'invalid', yaml: valid(1_000_000) });
    file = join(dir, 'invalid.yaml');
  });
  after(() => kw?.stop('SIGKILL'));

  test('keeps the running config, logs one error naming every problem, counts it; a valid file afterwards is taken up', async () => {
    const start = configMetrics(await scrape(kw));
    assert.deepEqual({ ok: start.ok, error: start.error, hashes: start.hashes }, { ok: 0, error: 0, hashes: [configHash(valid(1_000_000))] });
    assert.ok(Math.abs(start.lastSuccess - Date.now() / 1000) < 60, 'the last success is the start');

    writeFileSync(file, 'server: { port: 0, colour: blue, maxJsonBodyBytes: 10 }\nadmin: { port: nine }\nupstreams: { default: { url: ftp://x } }\nlimitz: {}\n');
    const { metrics } = await nextReload(kw, start, 'error');
    assert.equal(metrics.error, 1);
    assert.equal(metrics.ok, 0);
    assert.deepEqual(metrics.hashes, [start.hashes[0]], 'keyward_config_info still shows the file in force');
    assert.equal(metrics.lastSuccess, start.lastSuccess);
    await untilLogged(kw, () => logLines(kw).some((l) => l.level === 'error'), 'the error line');
    const errors = logLines(kw).filter((l) => l.level === 'error');
    assert.equal(errors.length, 1, 'one error line');
    const problems = errors[0]!.problems as string[];
    for (const p of [/^server\.colour: unknown key/, /^admin\.port: /, /^upstreams\.default\.url: /, /^limitz: unknown key/]) {
      assert.ok(problems.some((x) => p.test(x)), `${p} in ${problems.join(' | ')}`);
      assert.match(errors[0]!.msg as string, new RegExp(p.source.slice(1)));
    }
    // Still the old config: a 2 kB body is under the running 1 MB limit, not the refused file's 10 bytes.
    const big = { model: 'gpt-4o-mini', messages: [{ role: 'user' as const, content: 'x'.repeat(2000) }] };
    assert.equal((await client(kw, secrets.k_free).chat.completions.create(big)).choices[0]!.message.content, 'A');

    writeFileSync(file, valid(1000));
    const ok = await nextReload(kw, metrics, 'ok');
    assert.deepEqual({ ok: ok.metrics.ok, error: ok.metrics.error, hashes: ok.metrics.hashes }, { ok: 1, error: 1, hashes: [configHash(valid(1000))] });
    assert.ok(ok.metrics.lastSuccess > start.lastSuccess);
    const tooBig = await refusal(client(kw, secrets.k_free).chat.completions.create(big));
    assert.equal(tooBig.status, 413);
    assert.equal(tooBig.code, 'body_too_large');
  });
});

describe('restart-only settings', () => {
  const prefix = `kwrl${randomBytes(4).toString('hex')}`;
  const otherDb = `${TEST_REDIS_URL.replace(/\/\d*$/, '')}/7`;
  let kw: SidecarProcess;
  let file: string;
  let redis: Redis;
  let other: Redis;
  const yaml = (o: { port: number; redis: string; maxJson: number }) =>
    configYaml({ extra: [`redis: { url: ${o.redis}, prefix: ${prefix}, timeoutMs: 1000, onError: closed }`] }).replace('port: 0 }', `port: ${o.port}, maxJsonBodyBytes: ${o.maxJson} }`);

  before(async () => {
    kw = await spawnSidecar({ dir, name: 'restart', yaml: yaml({ port: 0, redis: TEST_REDIS_URL, maxJson: 1_000_000 }) });
    file = join(dir, 'restart.yaml');
    redis = new Redis(TEST_REDIS_URL);
    other = new Redis(otherDb);
  });
  after(async () => {
    await kw?.stop('SIGKILL');
    const keys = await redis.keys(`{${prefix}:*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
    other.disconnect();
  });

  test('server.port and redis.url keep their running values with one "needs a restart" warning; the rest of the file applies', async () => {
    // A port another server holds (the fake upstream's): no free port is picked and left to race.
    const taken = Number(new URL(up.url).port);
    const before = configMetrics(await scrape(kw));
    writeFileSync(file, yaml({ port: taken, redis: otherDb, maxJson: 1000 }));
    await nextReload(kw, before, 'ok');
    await untilLogged(kw, () => logLines(kw).some((l) => l.level === 'warn'), 'the warning');
    const warnings = logLines(kw).filter((l) => l.level === 'warn');
    assert.equal(warnings.length, 1);
    assert.deepEqual(warnings[0]!.needs_restart, ['server.port', 'redis.url']);
    assert.match(warnings[0]!.msg as string, /server\.port needs a restart, redis\.url needs a restart/);
    assert.equal((await scrape(kw)).get('keyward_config_restart_pending'), 2, 'the metric says the file in force is not all running');

    // The proxy still listens where it did.
    assert.equal((await ask(kw, secrets.k_rpm)).choices[0]!.message.content, 'A');
    // keyward did not move there: the port still answers as the upstream (keyward would want a key).
    assert.equal((await fetch(`http://127.0.0.1:${taken}/v1/models`)).status, 200);
    // The limiter still uses the Redis it started with.
    assert.ok((await redis.keys(`{${prefix}:*`)).length > 0, 'the key\'s buckets are in the running Redis');
    assert.deepEqual(await other.keys(`{${prefix}:*`), [], 'nothing in the Redis the file names now');
    // The reloadable part of the same file is in force.
    const big = await refusal(client(kw, secrets.k_free).chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(2000) }] }));
    assert.equal(big.status, 413);
  });
});

/**
 * `serve --workers 2` writes one stdout from three processes: every line arrives whole.
 * Requests with 8 KiB paths, attribution headers and version headers, and models full of
 * escapes, go to both workers at once; every stdout line must parse as JSON and stay
 * under the atomic pipe-write size, and a line that had to be cut says so. (The client's
 * fields are bounded before they reach a line; test/unit/logger-shared.test.ts shows the
 * cut itself on lines over the bound.)
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { KEYWARD_ARGS } from '../helpers/process.js';
import { bearer, send } from '../helpers/http.js';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const secret = `sk-lines-${randomBytes(8).toString('hex')}`;
let dir: string;
let up: FakeUpstream;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-lines-'));
  up = await startFakeUpstream(echoJson);
});
after(async () => {
  await up.close();
  rmSync(dir, { recursive: true, force: true });
});

test('two workers sharing stdout: with 8 KiB paths and app names, every line is whole JSON', { timeout: 60_000 }, async (t) => {
  const replica = join(dir, 'replica.sqlite');
  const snap = join(dir, 'snap.ndjson');
  const key = { type: 'key', id: 'k1', hash: makeKeyHasher({ hash: 'sha256' })(secret), kind: 'personal', user: 'u1', project: null, status: 'active', budget: null, spent: 0, models: null, routing: null, rpm: null, tpm: null, concurrency: null };
  writeFileSync(snap, [JSON.stringify({ type: 'meta', version: 1 }), JSON.stringify({ type: 'wallet', user: 'u1', balance: 100 }), JSON.stringify(key)].join('\n') + '\n');
  assert.equal(spawnSync(process.execPath, [...KEYWARD_ARGS, 'import', snap, '--replica', replica], { encoding: 'utf8' }).status, 0);
  const cfg = join(dir, 'kw.yaml');
  writeFileSync(cfg, `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${replica} }\nredis: { url: ${TEST_REDIS_URL}, prefix: kwl${randomBytes(3).toString('hex')}, timeoutMs: 1000 }\n`);

  const child = spawn(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, '--workers', '2'], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  const lines: string[] = [];
  const rl = createInterface({ input: child.stdout! });
  let onLine: (() => void) | null = null;
  rl.on('line', (l) => {
    lines.push(l);
    onLine?.();
  });
  const waitFor = (cond: () => boolean) =>
    new Promise<void>((resolve) => {
      if (cond()) return resolve();
      onLine = () => cond() && resolve();
    });
  const parsed = () => lines.flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
  await waitFor(() => parsed().some((l) => l.msg === 'keyward listening'));
  const url = parsed().find((l) => l.msg === 'keyward listening')!.listen as string;

  const long = (c: string, n = 8192) => c.repeat(n);
  const N = 45;
  // Node's parser takes a head of 16 KiB at most: one 8 KiB field per request.
  const kinds = [
    () => send(url, { method: 'GET', path: `/v1/models/${long('m', 8000)}`, headers: { ...bearer(secret), 'x-app-name': long('é', 2000) } }),
    () => send(url, { method: 'GET', path: '/v1/models', headers: { ...bearer(secret), 'x-app-name': long('é'), 'x-app-url': long('ü', 3000) } }),
    () => send(url, { method: 'GET', path: '/v1/models', headers: { ...bearer(secret), 'keyward-version': long('ñ'), 'x-app-url': long('ü', 3000) } }),
    () =>
      send(url, {
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { ...bearer(secret), 'content-type': 'application/json', 'x-app-name': long('é', 4000), 'x-app-url': long('ü', 4000) },
        body: JSON.stringify({ model: '\u0001'.repeat(250), messages: [] }),
      }),
    () => send(url, { method: 'POST', path: `/v1/chat/${long('%E2%80%A5', 900)}`, headers: { ...bearer(secret), 'x-app-name': long('é', 4000) } }),
  ];
  const rs = await Promise.all(Array.from({ length: N }, (_, i) => kinds[i % kinds.length]!()));
  assert.ok(rs.every((r) => r.status >= 200 && r.status < 500), rs.map((r) => r.status).join(','));
  await waitFor(() => parsed().filter((l) => l.msg === 'request').length >= N);
  child.kill('SIGTERM');
  await new Promise((r) => child.once('close', r));

  const broken = lines.filter((l) => {
    try {
      JSON.parse(l);
      return false;
    } catch {
      return true;
    }
  });
  assert.deepEqual(broken.map((l) => l.slice(0, 120)), [], 'every stdout line parses as JSON');
  const access = parsed().filter((l) => l.msg === 'request');
  const cut = access.filter((l) => l.truncated === true).length;
  t.diagnostic(`${lines.length} lines, the longest ${Math.max(...lines.map((l) => Buffer.byteLength(l)))} bytes, ${cut} access lines cut to fit`);
  assert.equal(access.length, N);
  assert.equal(new Set(access.map((l) => l.worker)).size, 2, 'both workers wrote lines');
  for (const l of lines) assert.ok(Buffer.byteLength(l) < 4096, `a line of ${Buffer.byteLength(l)} bytes`);
  for (const l of access) {
    if (l.truncated === true) assert.ok(Object.values(l).some((v) => typeof v === 'string' && v.endsWith('\u2026')), 'a cut line marks the cut field');
  }
});

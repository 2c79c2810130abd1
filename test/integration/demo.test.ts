/**
 * `npm start`: the demo's printed curl lines answer what they promise; a demo that cannot
 * start cleans up after itself.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { runDemo } from '../../src/app/demo.js';
import { send } from '../helpers/http.js';

test('the demo shows a 200, a 401, a 402 and a 403, with keys made through the console', async () => {
  const lines: string[] = [];
  const demo = await runDemo({ port: 0, adminPort: 0, consolePort: 0, log: (l) => lines.push(l) });
  try {
    const chat = (key: string, model: string) =>
      send(demo.sidecar.url, {
        method: 'POST', path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
      });
    assert.equal((await chat(demo.keys.ok, 'demo-model')).status, 200);
    assert.equal((await send(demo.sidecar.url, { path: '/v1/models', headers: { authorization: 'Bearer not-a-real-key' } })).status, 401);
    assert.equal((await chat(demo.keys.broke, 'demo-model')).status, 402);
    assert.equal((await chat(demo.keys.scoped, 'gpt-4o')).status, 403);
    for (const status of ['200', '401', '402', '403']) assert.ok(lines.some((l) => l.trimStart().startsWith(`${status}  curl`)), status);
    assert.ok(lines.some((l) => l.includes(demo.keys.ok)), 'the demo prints its keys');
    assert.ok(lines.some((l) => /admin token: \S{20,}\)/.test(l)), 'and the console\'s admin token, named as such');
  } finally {
    await demo.close();
  }
});

test('the demo\'s ports taken (another program on 8080 or 9090): it falls back to free ones and works', { timeout: 20_000 }, async () => {
  const held = await Promise.all([0, 1].map(async () => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1');
    await once(s, 'listening');
    return s;
  }));
  const [port, adminPort] = held.map((s) => (s.address() as AddressInfo).port);
  const demo = await runDemo({ port: port!, adminPort: adminPort!, consolePort: 0, log: () => undefined });
  try {
    assert.notEqual(demo.sidecar.port, port);
    const r = await send(demo.sidecar.url, { path: '/v1/models', headers: { authorization: `Bearer ${demo.keys.ok}` } });
    assert.equal(r.status, 200);
  } finally {
    await demo.close();
    for (const s of held) s.close();
  }
});

const demoDirs = () => readdirSync(tmpdir()).filter((f) => f.startsWith('keyward-demo-')).sort();

test('a demo that cannot start stops what it started and leaves no directory behind', async () => {
  const before = demoDirs();
  await assert.rejects(runDemo({ port: 70_000, adminPort: 0, consolePort: 0, log: () => undefined }));
  assert.deepEqual(demoDirs(), before);
});

test('the demo asked for the admin listener\'s usual port gives the admin listener another', async () => {
  const demo = await runDemo({ port: 9090, consolePort: 0, log: () => undefined });
  try {
    assert.notEqual(demo.sidecar.adminPort, Number(new URL(demo.sidecar.url).port));
    assert.equal((await send(demo.sidecar.url, { path: '/v1/models', headers: { authorization: 'Bearer not-a-real-key' } })).status, 401);
  } finally {
    await demo.close();
  }
});

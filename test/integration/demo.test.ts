/** `npm start`: the demo's printed curl lines answer what they promise. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
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
  } finally {
    await demo.close();
  }
});

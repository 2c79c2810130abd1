/**
 * A connection remembers the hash of the last key it presented (auth/hash.ts): every
 * request on one keep-alive connection is still judged by its own key, and a change to
 * the key's record applies to the next request on that connection.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { keyRecord, startHarness, type Harness } from '../helpers/sidecar.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { parseChangeBatch } from '../../src/protocol/records.js';

let up: FakeUpstream;
let h: Harness;
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_a: {}, k_b: {}, k_gone: { status: 'deleted' } } });
});
after(async () => {
  agent.destroy();
  await h.close();
  await up.close();
});

/** GET /v1/models with `key` on the agent's one connection: the status, and whether the connection was reused. */
function models(key: string): Promise<{ status: number; reused: boolean; code: string | null }> {
  return new Promise((resolve, reject) => {
    const req = http.get(`${h.url}/v1/models`, { agent, headers: { authorization: `Bearer ${key}` } }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => {
        const code = res.statusCode === 200 ? null : (JSON.parse(Buffer.concat(parts).toString()) as { error: { code: string } }).error.code;
        resolve({ status: res.statusCode!, reused: req.reusedSocket, code });
      });
    });
    req.on('error', reject);
  });
}

test('each request on one connection is judged by its own key', async () => {
  const seen = [];
  for (const key of [h.keys.k_a!, 'sk-unknown-0123456789', h.keys.k_gone!, h.keys.k_b!, h.keys.k_a!, `${h.keys.k_a!}x`, h.keys.k_a!]) {
    seen.push(await models(key));
  }
  assert.deepEqual(
    seen.map((s) => [s.status, s.code]),
    [[200, null], [401, 'invalid_api_key'], [401, 'api_key_deleted'], [200, null], [200, null], [401, 'invalid_api_key'], [200, null]],
  );
  assert.deepEqual(seen.map((s) => s.reused), [false, true, true, true, true, true, true]);
});

test('a key deleted between two requests of one connection is refused on the second', async () => {
  assert.equal((await models(h.keys.k_b!)).status, 200);
  const hash = makeKeyHasher({ hash: 'sha256' })(h.keys.k_b!);
  const batch = parseChangeBatch({ version: 2, changes: [{ op: 'upsert', ...keyRecord('k_b', { status: 'deleted' }, hash) }] });
  assert.ok(batch.ok);
  assert.ok(h.replica.applyChanges(batch.value, 'test'));
  const after = await models(h.keys.k_b!);
  assert.deepEqual([after.status, after.code, after.reused], [401, 'api_key_deleted', true]);
});

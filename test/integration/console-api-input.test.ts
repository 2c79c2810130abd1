/**
 * The console's admin API against what people paste into it: names and tags with control
 * characters, a key where an id or glob belongs (refused, and kept out of the request
 * log), and the audit trail that names who called and from where.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { startConsole } from '../../src/app/console.js';
import { makeConsoleConfig, startConsoleFixture, tok, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture();
});
after(async () => {
  await fx.close();
});

test('names and routing tags with control characters are refused; a user cannot tell a project that does not exist from one it is not in', async () => {
  for (const body of [{ name: 'laptop\x1b]0;owned\x07' }, { name: 'a\rb' }, { routing: 'batch\x9b' }]) {
    const r = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', ...body } });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.match(JSON.stringify(r.body), /control characters/);
  }
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', name: 'alice laptop (ünïcode ok)' } })).status, 201);
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_secret_plan' } });
  const real = await fx.api('GET', '/admin/v1/projects/p_secret_plan', { token: fx.tokens.bob });
  const none = await fx.api('GET', '/admin/v1/projects/p_no_such', { token: fx.tokens.bob });
  assert.deepEqual([real.status, none.status], [403, 403]);
  assert.equal((await fx.api('GET', '/admin/v1/projects/p_no_such')).status, 404, 'an admin is told');
});

test('the audit trail tells admin tokens apart and names where each call came from', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-audit-'));
  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const second = tok('admin2');
  const lines: Record<string, unknown>[] = [];
  const log = { debug() {}, info: (o: object, msg?: string) => void lines.push({ ...o, msg }), warn() {}, error() {} };
  const config = makeConsoleConfig({ dir, tokens, overrides: { auth: { syncTokens: [tokens.sync], adminTokens: [tokens.admin, second], users: [] } } });
  const c = await startConsole({ config, env: { TEST_MASTER_KEY: randomBytes(32).toString('hex') }, log });
  try {
    const call = (token: string, path: string, body?: unknown) =>
      fetch(`${c.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}) }).then((r) => r.json() as Promise<{ key: { id: string } }>);
    const made = await call(tokens.admin, '/admin/v1/keys', { kind: 'personal', user: 'alice' });
    await call(second, `/admin/v1/keys/${made.key.id}/reveal`);
    const audits = lines.filter((l) => l.audit !== undefined).map((l) => [l.audit, l.by, l.remote_addr]);
    assert.deepEqual(audits, [['key.create', 'admin#1', '127.0.0.1'], ['key.reveal', 'admin#2', '127.0.0.1']]);
    const requests = lines.filter((l) => l.msg === 'request');
    assert.ok(requests.length >= 2 && requests.every((l) => l.remote_addr === '127.0.0.1'));
    assert.ok(!JSON.stringify(lines).includes(second) && !JSON.stringify(lines).includes(tokens.admin), 'no token in any line');
  } finally {
    await c.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a key pasted where an id, a name or a glob belongs: refused, and kept out of the request log', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-console-keyshaped-'));
  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const lines: string[] = [];
  const log = { debug() {}, info: (o: object) => void lines.push(JSON.stringify(o)), warn: (o: object) => void lines.push(JSON.stringify(o)), error: (o: object) => void lines.push(JSON.stringify(o)) };
  const running = await startConsole({ config: makeConsoleConfig({ dir, tokens }), env: { TEST_MASTER_KEY: randomBytes(32).toString('hex') }, log });
  try {
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(`http://127.0.0.1:${running.port}${path}`, { method, headers: { authorization: `Bearer ${tokens.admin}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}) });
      return { status: res.status, text: await res.text() };
    };
    const secret = JSON.parse((await call('POST', '/admin/v1/keys', { kind: 'personal', user: 'alice' })).text).secret as string;
    assert.equal((await call('GET', `/admin/v1/keys/${secret}`)).status, 404);
    assert.equal((await call('DELETE', `/admin/v1/keys/${secret}`)).status, 404);
    for (const body of [{ kind: 'personal', user: secret }, { kind: 'personal', user: 'bob', name: `mine ${secret}` }, { kind: 'personal', user: 'bob', models: [secret] }, { kind: 'personal', user: 'bob', routing: secret }]) {
      const res = await call('POST', '/admin/v1/keys', body);
      assert.equal(res.status, 400, JSON.stringify(Object.keys(body)));
      assert.match(res.text, /looks like a keyward key/);
      assert.ok(!res.text.includes(secret));
    }
    // a wallet's or a member's user id goes to every replica too
    const project = 'p1';
    assert.equal((await call('POST', '/admin/v1/projects', { id: project })).status, 201);
    for (const [method, path, body] of [['POST', `/admin/v1/wallets/${secret}/credit`, { amount: 5 }], ['PUT', `/admin/v1/wallets/${secret}`, { balance: 5 }], ['PUT', `/admin/v1/projects/${project}/members/${secret}`]] as const) {
      const res = await call(method, path, body);
      assert.equal(res.status, 400, path);
      assert.match(res.text, /looks like a keyward key/);
    }
    assert.ok(!(await call('GET', '/admin/v1/wallets')).text.includes(secret), 'no wallet under the key');
    assert.ok(lines.some((l) => l.includes('/admin/v1/keys/[redacted]')), 'the requests are logged');
    assert.ok(!lines.join('\n').includes(secret.slice(3, 30)), lines.join('\n'));
  } finally {
    await running.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * The console's web page as HTTP sees it (the browser test drives it for real): strict
 * headers, only its own files, nothing from another origin; and the per-key usage endpoint
 * the page reads, under the caller's permissions.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';

const WEB = join(import.meta.dirname, '../../src/console/web');
let fx: ConsoleFixture;
const ids: Record<string, string> = {};

before(async () => {
  fx = await startConsoleFixture();
  await fx.api('PUT', '/admin/v1/wallets/alice', { body: { balance: 5 } });
  for (const user of ['alice', 'bob']) {
    ids[user] = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user } })).body.key.id;
  }
  // Usage as a sidecar reports it: two events for alice's key.
  const events = [1, 2].map((i) => JSON.stringify({ request_id: `r${i}`, key_id: ids.alice, model: 'gpt-4o', input_tokens: 1000 * i, output_tokens: 10, status: 200, at: new Date(Date.UTC(2026, 0, 1, 0, i)).toISOString() }));
  const res = await fetch(`${fx.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${fx.tokens.sync}`, 'content-type': 'application/x-ndjson' }, body: events.join('\n') + '\n' });
  assert.equal(res.status, 200);
});
after(() => fx.close());

test('the page is served at / with a strict Content-Security-Policy and no inline code', async () => {
  const res = await fetch(`${fx.url}/`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type')!, /^text\/html/);
  const csp = res.headers.get('content-security-policy')!;
  for (const d of ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "form-action 'none'"]) assert.ok(csp.includes(d), d);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/);
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
  assert.equal(res.headers.get('referrer-policy'), 'no-referrer');
  const html = await res.text();
  assert.match(html, /<label for="token">Token<\/label>/);
  assert.match(html, /<button type="submit" class="primary">Sign in<\/button>/);
  assert.doesNotMatch(html, /<script>|<style|style=|\son[a-z]+=/i, 'no inline script, style or handler');
});

test('every asset is same-origin: no URL to another host in the page files', async () => {
  for (const name of readdirSync(WEB)) {
    const text = readFileSync(join(WEB, name), 'utf8');
    assert.doesNotMatch(text, /(src|href)=["'](https?:)?\/\//, `${name} loads nothing from elsewhere`);
    assert.doesNotMatch(text, /@import|url\(\s*["']?(https?:)?\/\//, `${name} imports nothing from elsewhere`);
    assert.doesNotMatch(text, /localStorage|document\.cookie|innerHTML/, `${name}: no persistent token storage, no markup injection`);
    const served = await fetch(`${fx.url}${name === 'index.html' ? '/' : `/${name}`}`);
    assert.equal(served.status, 200, name);
    assert.equal(await served.text(), text);
  }
  assert.equal((await fetch(`${fx.url}/index.html`)).status, 404);
  assert.equal((await fetch(`${fx.url}/../config.ts`)).status, 404);
  assert.equal((await fetch(`${fx.url}/`, { method: 'POST', body: 'token=x' })).status, 404, 'no form post is accepted');
});

test('/healthz answers without a token', async () => {
  const res = await fetch(`${fx.url}/healthz`);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { status: 'ok' });
});

test('a key\'s recent usage: newest first, visible to whoever may see the key', async () => {
  const admin = await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage`);
  assert.equal(admin.status, 200);
  assert.deepEqual(admin.body.usage.map((u: any) => [u.requestId, u.inputTokens, u.model]), [['r2', 2000, 'gpt-4o'], ['r1', 1000, 'gpt-4o']]);
  assert.equal(admin.body.usage[0].at, '2026-01-01T00:02:00.000Z');
  assert.ok(admin.body.usage[0].cost > 0);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage?limit=1`)).body.usage.length, 1);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage?limit=0`)).status, 400);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage`, { token: fx.tokens.alice })).status, 200);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage`, { token: fx.tokens.bob })).status, 403);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${ids.alice}/usage`, { token: null })).status, 401);
  assert.deepEqual((await fx.api('GET', `/admin/v1/keys/${ids.bob}/usage`, { token: fx.tokens.bob })).body, { usage: [] });
  assert.equal((await fx.api('GET', '/admin/v1/keys/k_missing/usage')).status, 404);
});

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { isWellFormedKey } from '../../src/auth/keyformat.js';
import { keyDetails, keysTable } from '../../src/console/cli-format.js';
import type { KeyView } from '../../src/console/db.js';
import { runConsoleCli } from '../helpers/console-cli.js';
import { startConsoleFixture, tok, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
let cli: (...argv: string[]) => ReturnType<typeof runConsoleCli>;
before(async () => {
  fx = await startConsoleFixture();
  cli = (...argv) => runConsoleCli(argv, { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin, KEYWARD_CONSOLE_URL: fx.url } });
});
after(async () => {
  await fx.close();
});

const keyIn = (text: string) => /\bkw_[0-9A-Za-z]{43}_[0-9A-Za-z]{6}\b/.exec(text)?.[0];

test('keys create / reveal / list / show / update with tables and --json', async () => {
  const made = await cli('keys', 'create', '--personal', 'alice', '--models', 'gpt-4o*,claude-*', '--rpm', '60', '--name', 'laptop');
  assert.equal(made.code, 0, made.stderr);
  const secret = keyIn(made.stdout)!;
  assert.ok(secret && isWellFormedKey(secret));
  const id = /key (k_[0-9a-f]+)/.exec(made.stdout)![1]!;

  const revealed = await cli('keys', 'reveal', id);
  assert.equal(revealed.stdout.trim(), secret);

  const list = await cli('keys', 'list');
  assert.match(list.stdout, /^ID\s+KIND\s+OWNER/);
  assert.ok(list.stdout.includes(id) && list.stdout.includes('user:alice') && list.stdout.includes('gpt-4o*,claude-*'));
  assert.ok(!list.stdout.includes(secret));

  const json = JSON.parse((await cli('keys', 'show', id, '--json')).stdout);
  assert.equal(json.key.rpm, 60);
  assert.equal(json.key.name, 'laptop');

  const upd = await cli('keys', 'update', id, '--rpm', 'none', '--models', 'all', '--concurrency', '2');
  assert.equal(upd.code, 0, upd.stderr);
  assert.match(upd.stdout, /models\s+all/);
  assert.match(upd.stdout, /concurrency\s+2/);
  assert.match(upd.stdout, /rpm\s+-/);

  const bad = await cli('keys', 'update', id, '--rpm', 'fast');
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /--rpm must be a whole number/);
});

test('keys rotate prints the new key and the old key\'s last use; delete then refuses reveal', async () => {
  assert.equal((await cli('projects', 'create', 'p_cli', '--budget', '50', '--member', 'bob')).code, 0);
  const made = await cli('keys', 'create', '--team', 'p_cli', '--budget', '5', '--tpm', '1000', '--json');
  const first = JSON.parse(made.stdout);
  const rot = await cli('keys', 'rotate', first.key.id);
  assert.equal(rot.code, 0, rot.stderr);
  const next = keyIn(rot.stdout)!;
  assert.ok(next && next !== first.secret);
  assert.match(rot.stdout, new RegExp(`old key ${first.key.id} stays active; last used: never`));
  assert.match(rot.stdout, new RegExp(`keyward keys delete ${first.key.id}`));

  const del = await cli('keys', 'delete', first.key.id);
  assert.match(del.stdout, /deleted key/);
  const again = await cli('keys', 'reveal', first.key.id);
  assert.equal(again.code, 1);
  assert.match(again.stderr, /410 key_deleted/);
  const listed = await cli('keys', 'list', '--project', 'p_cli', '--all', '--json');
  assert.deepEqual(JSON.parse(listed.stdout).keys.map((k: { status: string }) => k.status).sort(), ['active', 'deleted']);
});

test('projects and wallets verbs', async () => {
  await cli('projects', 'create', 'p_w');
  assert.match((await cli('projects', 'disable', 'p_w')).stdout, /p_w\s+disabled/);
  assert.match((await cli('projects', 'budget', 'p_w', '12.5')).stdout, /p_w\s+disabled\s+12\.5/);
  assert.match((await cli('projects', 'enable', 'p_w')).stdout, /p_w\s+enabled/);
  assert.match((await cli('projects', 'add-member', 'p_w', 'alice')).stdout, /alice/);
  assert.match((await cli('projects', 'list')).stdout, /^ID\s+STATUS\s+BUDGET/);
  assert.match((await cli('wallets', 'credit', 'frank', '10')).stdout, /frank\s+10/);
  assert.match((await cli('wallets', 'set', 'frank', '2.25')).stdout, /frank\s+2\.25/);
  assert.equal(JSON.parse((await cli('wallets', 'show', 'frank', '--json')).stdout).wallet.balance, 2.25);
});

test('errors: no token, a wrong token, an unknown key, an unreachable console', async () => {
  const none = await runConsoleCli(['keys', 'list', '--console', fx.url], { env: {} });
  assert.equal(none.code, 1);
  assert.match(none.stderr, /set KEYWARD_ADMIN_TOKEN/);
  const wrong = 'not-the-token-0123456789';
  const denied = await runConsoleCli(['keys', 'list', '--console', fx.url], { env: { KEYWARD_ADMIN_TOKEN: wrong } });
  assert.equal(denied.code, 1);
  assert.match(denied.stderr, /401 unauthorized/);
  assert.ok(!denied.stderr.includes(wrong));
  assert.match((await cli('keys', 'show', 'k_nope')).stderr, /404 not_found: key k_nope does not exist/);
  const away = await runConsoleCli(['keys', 'list', '--console', 'http://127.0.0.1:1'], { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin } });
  assert.match(away.stderr, /cannot reach the console/);
  const both = await cli('keys', 'create', '--personal', 'a', '--team', 'b');
  assert.match(both.stderr, /exactly one of --personal USER or --team PROJECT/);
});

test('a console URL with user-info is refused before any call, and the password is never printed', async () => {
  const env = { KEYWARD_ADMIN_TOKEN: fx.tokens.admin };
  const withUser = fx.url.replace('://', '://admin:Pa55word@');
  for (const [argv, e] of [
    [['keys', 'list', '--console', withUser], env],
    [['keys', 'list'], { ...env, KEYWARD_CONSOLE_URL: withUser }],
  ] as const) {
    const r = await runConsoleCli([...argv], { env: e });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /must not carry user-info/);
    assert.ok(!r.stderr.includes('Pa55word'), r.stderr);
  }
  // a URL that does not parse is not quoted either: it may hold a password too
  const broken = await runConsoleCli(['keys', 'list', '--console', 'http://admin:Pa55word@127.0.0.1:99999'], { env });
  assert.equal(broken.code, 1);
  assert.match(broken.stderr, /not a valid URL/);
  assert.ok(!broken.stderr.includes('Pa55word'), broken.stderr);
});

test('`keyward console --config FILE` starts, serves, and exits 0 on SIGTERM without logging secrets', async () => {
  const admin = tok('admin');
  const master = randomBytes(32).toString('hex');
  const file = join(fx.dir, 'console.yaml');
  writeFileSync(file, `
listen: { host: 127.0.0.1, port: 0 }
store: { path: ${join(fx.dir, 'cli-console.sqlite')} }
auth:
  syncTokens: ["\${SYNC_TOKEN}"]
  adminTokens: ["\${ADMIN_TOKEN}"]
pricing:
  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }
`);
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/console-cli-main.ts', 'console', '--config', file], {
    env: { ...process.env, KEYWARD_MASTER_KEY: master, SYNC_TOKEN: tok('sync'), ADMIN_TOKEN: admin },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  child.stdout.setEncoding('utf8');
  const listening = new Promise<string>((resolve) => {
    child.stdout.on('data', (d: string) => {
      stdout += d;
      const m = /"url":"(http:\/\/[^"]+)"/.exec(stdout);
      if (m) resolve(m[1]!);
    });
  });
  const url = await listening;
  const made = await runConsoleCli(['keys', 'create', '--personal', 'zed', '--json', '--console', url], { env: { KEYWARD_ADMIN_TOKEN: admin } });
  const secret = JSON.parse(made.stdout).secret as string;
  // A SIGHUP (sidecars reload on it) leaves the console running, and says so.
  const warned = new Promise<void>((resolve) => child.stdout.on('data', () => stdout.includes('does not reload') && resolve()));
  child.kill('SIGHUP');
  await warned;
  assert.equal((await fetch(`${url}/healthz`)).status, 200, 'still serving after SIGHUP');
  child.kill('SIGTERM');
  const [code] = await once(child, 'exit');
  assert.equal(code, 0);
  for (const s of [secret, master, admin]) assert.ok(!stdout.includes(s), 'a secret reached the log');
  assert.match(stdout, /console shutting down/);

  const missing = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/console-cli-main.ts', 'console', '--config', file], {
    env: { ...process.env, KEYWARD_MASTER_KEY: '', SYNC_TOKEN: tok('sync'), ADMIN_TOKEN: admin },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  missing.stderr.on('data', (d) => (stderr += d));
  const [exit] = await once(missing, 'exit');
  assert.equal(exit, 1);
  assert.match(stderr, /KEYWARD_MASTER_KEY is not set/);
});

test('keys list follows the console\'s pages to the last', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_cli_pages' } });
  const made = [];
  for (let i = 0; i < 3; i++) made.push(/key (k_[0-9a-f]+)/.exec((await cli('keys', 'create', '--team', 'p_cli_pages')).stdout)?.[1]);
  // A console that pages by 1: the CLI must still print every key.
  const onePerPage: typeof fetch = (input, init) => {
    const url = new URL(String(input));
    if (url.pathname === '/admin/v1/keys' && (init?.method ?? 'GET') === 'GET') url.searchParams.set('limit', '1');
    return fetch(url, init);
  };
  const r = await runConsoleCli(['keys', 'list', '--project', 'p_cli_pages', '--json'], { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin, KEYWARD_CONSOLE_URL: fx.url }, fetch: onePerPage });
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout).keys.map((k: { id: string }) => k.id), made);
});

test('the CLI shows control characters in a key\'s text escaped, not sent to the terminal', () => {
  const k = { id: 'k_1', name: 'x\x1b[2K\rdeleted\x07', kind: 'personal', user: 'u', project: null, status: 'active', models: null, routing: 'r\x9b', rpm: null, tpm: null, concurrency: null, budget: null, period: null, resetsAt: null, spent: 0, ips: null, allowBrowser: false, modelLimits: null, shadow: [], epoch: 0, createdAt: '2026-01-01T00:00:00.000Z', lastUsedAt: null, deletedAt: null } as unknown as KeyView;
  for (const text of [keysTable([k]), keyDetails(k)]) {
    assert.doesNotMatch(text, /[\x00-\x09\x0b-\x1f\x7f-\x9f]/, 'no control character but the line ends'); // eslint-disable-line no-control-regex
    assert.ok(text.includes('x\\x1b[2K\\x0ddeleted\\x07') && text.includes('r\\x9b'), text);
  }
});

/**
 * A key pasted where its id belongs (`keyward keys delete <the leaked key>`, the first thing
 * someone does about a leaked key) is refused 404 without the key in the answer: the CLI
 * prints the answer's message on a terminal or a CI log, and the console's request log
 * already keeps such a path out (server.ts). Ids that are not keys are still named.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { runConsoleCli } from '../helpers/console-cli.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
let secret: string;
const cli = (...argv: string[]) => runConsoleCli(argv, { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin, KEYWARD_CONSOLE_URL: fx.url } });

before(async () => {
  fx = await startConsoleFixture();
  const made = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } });
  assert.equal(made.status, 201);
  secret = made.body.secret as string;
});
after(async () => {
  await fx.close();
});

test('the admin API answers a key used as an id without quoting it', async () => {
  for (const [method, path] of [['GET', ''], ['PATCH', ''], ['DELETE', ''], ['POST', '/reveal'], ['POST', '/rotate']] as const) {
    const res = await fx.api(method, `/admin/v1/keys/${secret}${path}`, method === 'PATCH' ? { body: { rpm: 1 } } : {});
    assert.equal(res.status, 404, `${method} ${path}`);
    const text = JSON.stringify(res.body);
    assert.ok(!text.includes(secret.slice(0, 8)) && !text.includes(secret.slice(8, 16)), `${method} ${path}: ${text}`);
  }
});

test('what is left of a key that lost a character or its prefix is not quoted either', async () => {
  for (const damaged of [secret.slice(0, -1), secret.slice(1), secret.slice(3)]) {
    const res = await fx.api('GET', `/admin/v1/keys/${damaged}`);
    assert.equal(res.status, 404);
    const text = JSON.stringify(res.body);
    assert.ok(!text.includes(secret.slice(8, 16)) && !text.includes(secret.slice(30, 38)), text);
  }
});

test('what is left of a key is refused as a model, a name or a user, as a whole key is: it would reach every replica', async () => {
  for (const body of [{ models: [secret.slice(1)] }, { name: `laptop ${secret.slice(0, -1)}` }, { user: secret.slice(0, -2) }, { models: [secret.slice(3, -3)] }]) {
    const res = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', ...body } });
    assert.equal(res.status, 400, JSON.stringify(res.body));
    assert.match(res.body.error.message, /looks like a keyward key/);
  }
  const fine = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', name: 'kw_laptop', models: ['gpt-4o*', 'ft:gpt-4o-mini:acme::9pq3abcd'] } });
  assert.equal(fine.status, 201, 'names and globs that only start alike are no keys');
});

test('the CLI does not print a key given as an id; an id that is no key is still named', async () => {
  for (const verb of ['show', 'delete', 'reveal']) {
    const out = await cli('keys', verb, secret);
    assert.equal(out.code, 1);
    assert.match(out.stderr, /404 not_found/);
    assert.ok(!out.stderr.includes(secret.slice(0, 8)) && !out.stderr.includes(secret.slice(8, 16)), `keys ${verb}: ${out.stderr}`);
  }
  assert.match((await cli('keys', 'show', 'k_nope')).stderr, /404 not_found: key k_nope does not exist/);
});

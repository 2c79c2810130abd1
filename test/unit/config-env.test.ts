/**
 * What the config takes from the environment besides `${VAR}` (DESIGN section 2 gives
 * `console.token` as `${KEYWARD_SYNC_TOKEN}` and `keys.pepper` as `${KEYWARD_KEY_PEPPER}`),
 * URLs whose user-info would reach a log line through fetch's error, and an unknown key
 * reported even when its value names a variable that is not set.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

const PEPPER = 'p'.repeat(24);

test('console.token and keys.pepper left out of their blocks come from the environment', () => {
  const c = parse(`${MINIMAL}console: { url: http://127.0.0.1:7000 }\nkeys: { hash: hmac-sha256 }\n`, { KEYWARD_SYNC_TOKEN: 'tok-1', KEYWARD_KEY_PEPPER: PEPPER });
  assert.equal(c.console?.token, 'tok-1');
  assert.equal(c.keys.pepper, PEPPER);
  // a value in the file wins; without the block nothing is made up
  assert.equal(parse(`${MINIMAL}console: { token: from-file }\n`, { KEYWARD_SYNC_TOKEN: 'tok-1' }).console?.token, 'from-file');
  assert.equal(parse(MINIMAL, { KEYWARD_SYNC_TOKEN: 'tok-1' }).console, undefined);
});

test('KEYWARD_KEY_PEPPER is taken only where the hash uses a pepper', () => {
  const c = parse(`${MINIMAL}keys: { hash: sha256, format: any }\n`, { KEYWARD_KEY_PEPPER: 'short' });
  assert.equal(c.keys.pepper, undefined);
});

test('without the file\'s value or the variable, the problem says what is required', () => {
  const list = problems(`${MINIMAL}console: { url: http://127.0.0.1:7000 }\nkeys: { hash: hmac-sha256 }\n`);
  hasProblem(list, 'console.token', /required.*KEYWARD_SYNC_TOKEN/);
  hasProblem(list, 'keys.pepper', /KEYWARD_KEY_PEPPER/);
});

test('console.url and alerts.webhookUrl with user-info are refused; the secret is never echoed', () => {
  const list = problems(`${MINIMAL}console: { url: "http://ops:hunter2@127.0.0.1:7000", token: t }\nalerts: { webhookUrl: "https://hook:s3cret@ops.example/h" }\n`);
  hasProblem(list, 'console.url', /user-info/);
  hasProblem(list, 'alerts.webhookUrl', /user-info/);
  assert.ok(!list.join('\n').includes('hunter2') && !list.join('\n').includes('s3cret'), list.join('\n'));
});

test('an unknown key is reported even when its value names a variable that is not set', () => {
  const list = problems(`${MINIMAL}console:\n  token: t\n  tokne: \${NOT_SET_ANYWHERE}\n`);
  hasProblem(list, 'console.tokne', /environment variable NOT_SET_ANYWHERE/);
  hasProblem(list, 'console.tokne', /unknown key/);
});

test('text that looks like a reference\'s internal placeholder stays as written', () => {
  const c = parse(
    `server: { port: 0 }\nupstreams: { default: { url: "http://h/__KWENV0__" }, __KWENVX1__: { url: "http://h/b" } }\nmessages: { vendor: \${V:-keyward} }\n`,
    { V: 'x-vendor' },
  );
  assert.equal(c.upstreams.default!.url, 'http://h/__KWENV0__');
  assert.ok('__KWENVX1__' in c.upstreams);
  assert.equal(c.messages.vendor, 'x-vendor');
});

test('a default holding another reference is a problem, not the literal text `${B}`', () => {
  const list = problems(`${MINIMAL}console: { url: http://127.0.0.1:7000, token: "\${KW_A:-\${KW_B}}" }\n`, { KW_B: 'from-b' });
  hasProblem(list, 'console.token', /nested references/);
});

test('an unknown YAML tag is a problem, not the text after it', () => {
  const list = problems(`${MINIMAL}console: { url: http://127.0.0.1:7000, token: !env KEYWARD_SYNC_TOKEN }\n`);
  assert.ok(list.some((p) => /^YAML: .*tag/i.test(p)), list.join('\n'));
});

test('an alias to no anchor is a ConfigError naming the file', () => {
  const list = problems(`${MINIMAL}console: { url: http://127.0.0.1:7000, token: *nope }\n`);
  assert.ok(list.some((p) => /^YAML: .*alias/i.test(p)), list.join('\n'));
});

test('a key named by a reference: a clash with a written key is a problem; an unset one hides nothing', () => {
  const clash = problems(`upstreams:\n  default: { url: http://127.0.0.1:4000 }\n  \${KW_MODE}: { url: http://10.9.9.9:1 }\n`, { KW_MODE: 'default' });
  // named as written: a name a reference gives may be a secret
  hasProblem(clash, 'upstreams.${KW_MODE}', /named twice/);
  // the written key after the reference's, too
  const after = problems(`upstreams:\n  default: { url: http://127.0.0.1:4000 }\n  \${KW_MODE}: { url: http://10.9.9.9:1 }\n  batch: { url: http://127.0.0.1:4001 }\n`, { KW_MODE: 'batch' });
  hasProblem(after, 'upstreams.${KW_MODE}', /named twice/);
  // only that key: the same name elsewhere in the tree is named as it is written there
  const elsewhere = problems(`upstreams:\n  default: { url: http://127.0.0.1:4000, timeoutMs: -1 }\n  \${KW_MODE}: { url: http://127.0.0.1:4001 }\n`, { KW_MODE: 'timeoutMs' });
  hasProblem(elsewhere, 'upstreams.default.timeoutMs', /./);
  assert.ok(!elsewhere.some((p) => p.includes('default.${KW_MODE}')), elsewhere.join('\n'));
  const unset = problems(`upstreams:\n  \${KW_MODE}: { url: http://127.0.0.1:4000, timeoutMs: \${KW_T} }\n`);
  hasProblem(unset, 'upstreams', /KW_MODE/);
  hasProblem(unset, 'upstreams.${KW_MODE}.timeoutMs', /KW_T/);
  assert.ok(unset.some((p) => /default/.test(p) && !/KW_MODE/.test(p)), `the missing default upstream is reported too:\n${unset.join('\n')}`);
});

test('a key a reference gave is named as written, never by its value: `token:${VAR}` (no space) is one key', () => {
  const env = { KEYWARD_SYNC_TOKEN: 'synctok-LEAK-1234567890', REDIS_URL: 'redis://:pw-LEAK-0987654321@127.0.0.1:6379/0' };
  const list = problems(`${MINIMAL}console: { url: "http://127.0.0.1:7000", token:\${KEYWARD_SYNC_TOKEN} }\nredis: { url:\${REDIS_URL} }\n`, env);
  const text = list.join('\n');
  assert.ok(!text.includes('LEAK'), text);
  assert.ok(list.includes('console.token:${KEYWARD_SYNC_TOKEN}: unknown key'), text);
  assert.ok(list.includes('redis.url:${REDIS_URL}: unknown key'), text);
  // A literal key with a colon in it is shown up to the colon.
  const literal = problems(`${MINIMAL}console: { url: "http://127.0.0.1:7000", token:synctok-LEAK-2 }\n`);
  assert.ok(!literal.join('\n').includes('LEAK'), literal.join('\n'));
  assert.ok(literal.some((p) => p.startsWith("console.token:… (a space missing after ':'?)")), literal.join('\n'));
});

/**
 * `${VAR}` references in the config file (DESIGN section 2): the forms taken, where a
 * reference ends, and what an unset, empty or unsupported one reports.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Config } from '../../src/config/schema.js';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

// [yaml, env, check]
const EXPANSION: [string, string, Record<string, string>, (c: Config) => void][] = [
  ['${VAR} in a string', `${MINIMAL}replica: { path: "\${DIR}/r.sqlite" }\n`, { DIR: '/var/kw' }, (c) => assert.equal(c.replica.path, '/var/kw/r.sqlite')],
  ['${VAR:-default} unset', `${MINIMAL}replica: { path: "\${DIR:-/tmp}/r.sqlite" }\n`, {}, (c) => assert.equal(c.replica.path, '/tmp/r.sqlite')],
  ['${VAR:-default} set', `${MINIMAL}replica: { path: "\${DIR:-/tmp}/r.sqlite" }\n`, { DIR: '/srv' }, (c) => assert.equal(c.replica.path, '/srv/r.sqlite')],
  ['empty variable falls back to the default', `${MINIMAL}replica: { path: "\${DIR:-/tmp}" }\n`, { DIR: '' }, (c) => assert.equal(c.replica.path, '/tmp')],
  ['number from a default', `${MINIMAL}server:\n  port: \${PORT:-8081}\n`, {}, (c) => assert.equal(c.server.port, 8081)],
  ['number from the environment', `${MINIMAL}server:\n  port: \${PORT:-8081}\n`, { PORT: '9000' }, (c) => assert.equal(c.server.port, 9000)],
  ['number without default', 'upstreams:\n  default:\n    url: http://u\n    timeoutMs: ${T}\n', { T: '1500' }, (c) => assert.equal(c.upstreams.default?.timeoutMs, 1500)],
  ['several variables in one value', 'upstreams:\n  default:\n    url: http://${H:-localhost}:${P}/base\n', { P: '4000' }, (c) => assert.equal(c.upstreams.default?.url, 'http://localhost:4000/base')],
  ['secret token', `${MINIMAL}console:\n  url: http://c\n  token: \${KEYWARD_SYNC_TOKEN}\n`, { KEYWARD_SYNC_TOKEN: 'tok-abc' }, (c) => assert.equal(c.console?.token, 'tok-abc')],
  ['pepper', `${MINIMAL}keys:\n  hash: hmac-sha256\n  pepper: \${KEYWARD_KEY_PEPPER}\n`, { KEYWARD_KEY_PEPPER: 'p'.repeat(32) }, (c) => assert.equal(c.keys.pepper, 'p'.repeat(32))],
];

for (const [name, text, env, check] of EXPANSION) {
  test(`expansion: ${name}`, () => check(parse(text, env)));
}

test('expansion: an unsupported reference form is a problem, not literal text', () => {
  const list = problems(`${MINIMAL}console:\n  url: http://c\n  token: \${KEYWARD_SYNC_TOKEN:?must be set}\nkeys: { hash: hmac-sha256, pepper: "\${PEPPER-x}" }\n`, { KEYWARD_SYNC_TOKEN: 'tok', PEPPER: 'p'.repeat(32) });
  hasProblem(list, 'console.token', /supported reference/);
  hasProblem(list, 'keys.pepper', /supported reference/);
});

test('expansion: a reference ends on its line; an unclosed one takes no later line with it, a comment\'s neither', () => {
  // Before, the default ran to the next `}` anywhere in the file: these lines vanished unreported.
  const later = 'limits: { shadow: [rpm, tpm] }\nserver: { maxJsonBodyBytes: 1000 }\n';
  hasProblem(problems(`${MINIMAL}console:\n  url: http://c\n  token: \${KEYWARD_SYNC_TOKEN:-change-me\n${later}`, { KEYWARD_SYNC_TOKEN: 'tok' }), 'console.token', /supported reference/);
  const c = parse(`${MINIMAL}# set \${KEYWARD_SYNC_TOKEN:-a default, see the runbook\n${later}`, { KEYWARD_SYNC_TOKEN: 'tok' });
  assert.deepEqual([c.limits.shadow, c.server.maxJsonBodyBytes], [['rpm', 'tpm'], 1000]);
});

test('expansion: an unset variable without default is one problem naming the variable and the key', () => {
  const list = problems(`${MINIMAL}console:\n  url: http://c\n  token: \${KEYWARD_SYNC_TOKEN}\n`);
  assert.equal(list.length, 1, list.join('\n'));
  hasProblem(list, 'console.token', /KEYWARD_SYNC_TOKEN/);
});

test('expansion: a variable set to the empty string is named as empty, not as unset', () => {
  const list = problems(`${MINIMAL}server: { host: \${HOST} }\n`, { HOST: '' });
  assert.equal(list.length, 1, list.join('\n'));
  hasProblem(list, 'server.host', /HOST is empty/);
});

test('expansion: a quoted "${VAR}" stays a string even when the value is all digits', () => {
  const c = parse(`${MINIMAL}console:\n  url: http://c\n  token: "\${TOK}"\nredis:\n  url: redis://r\n  prefix: "\${P}"\n`, { TOK: '123456789012345678901234', P: '7' });
  assert.equal(c.console?.token, '123456789012345678901234');
  assert.equal(c.redis?.prefix, '7');
});

test(
  'expansion: an unquoted ${VAR} secret (as DESIGN writes it) stays a string when the value is all digits',
  () => {
    const c = parse(`${MINIMAL}console:\n  url: http://c\n  token: \${TOK}\n`, { TOK: '98765432109876543210' });
    assert.equal(c.console?.token, '98765432109876543210');
  },
);

/**
 * The console's config checks every problem in one run as the sidecar's does: the checks
 * that compare fields (one token per role, one price per glob, one user per id) run
 * beside problems elsewhere, and its listener's host is checked as the sidecar's are.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { consoleConfigSchema } from '../../src/console/config.js';
import { ConfigError, parseConfigText } from '../../src/config/load.js';
import { configSchema } from '../../src/config/schema.js';
import { loadConsoleConfig } from '../../src/app/config-files.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function consoleProblems(text: string): string[] {
  try {
    parseConfigText({ text, file: 'console.yaml', schema: consoleConfigSchema, env: {} });
  } catch (e) {
    assert.ok(e instanceof ConfigError, String(e));
    return e.problems;
  }
  assert.fail('expected a ConfigError');
}

const has = (list: string[], start: string) => assert.ok(list.some((p) => p.startsWith(start)), `expected ${start} in:\n${list.join('\n')}`);

const SHARED = 'shared-token-aaaaaaaaaaaa';
const BASE = `
auth:
  syncTokens: ["${SHARED}"]
  adminTokens: ["${SHARED}"]
  users: [ { id: alice, token: "user-token-bbbbbbbbbbbb" }, { id: alice, token: "other-token-cccccccccccc" } ]
pricing:
  models: [ { match: "gpt*", inputPerMillion: 1, outputPerMillion: 1 }, { match: "gpt*", inputPerMillion: 1, outputPerMillion: 1 } ]
  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }
`;

test('the cross-field checks are reported beside a problem elsewhere in the file', () => {
  const list = consoleProblems(`${BASE}logging: { level: loud }\nsync: { maxBatch: 1.5 }\n`);
  has(list, 'logging.level:');
  has(list, 'sync.maxBatch: expected a whole number');
  has(list, 'auth.adminTokens.0: same token as auth.syncTokens.0');
  has(list, 'auth.users.1.id: user alice is listed twice');
  has(list, 'pricing.models.1.match: gpt* is priced twice');
});

test('the cross-field checks read fields of the wrong type without failing', () => {
  const list = consoleProblems(`
auth:
  syncTokens: "${SHARED}"
  adminTokens: [7, "${SHARED}", "${SHARED}"]
  users: [ null, { id: 5 }, { token: "${SHARED}" } ]
pricing:
  models: [ null, { match: 3 }, "gpt*" ]
  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }
`);
  has(list, 'auth.syncTokens:');
  has(list, 'auth.adminTokens.0:');
  has(list, 'auth.adminTokens.2: same token as auth.adminTokens.1');
  has(list, 'auth.users.2.token: same token as auth.adminTokens.1');
  has(list, 'pricing.models.0:');
});

test('the console\'s listen.host is checked as the sidecar\'s hosts are', () => {
  has(consoleProblems(`${BASE.replace(SHARED, 'sync-token-dddddddddddd')}listen: { host: "not a host!" }\n`), 'listen.host: expected an IP address or a host name');
  const ok = `
listen: { host: "[::1]", port: 0 }
auth: { syncTokens: [sync-token-dddddddddddd], adminTokens: [admin-token-eeeeeeeeeeee] }
pricing: { unpriced: { inputPerMillion: 0, outputPerMillion: 0 } }
`;
  assert.equal(parseConfigText({ text: ok, file: 'console.yaml', schema: consoleConfigSchema, env: {} }).listen.host, '::1');
});

test('a token no HTTP header can carry (a space, a trailing newline) is a problem, in the console\'s config and the sidecar\'s', () => {
  const text = (admin: string) => `auth:\n  syncTokens: ["sync-token-aaaaaaaaaaaa"]\n  adminTokens: [${JSON.stringify(admin)}]\npricing:\n  models: []\n  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }\n`;
  for (const bad of ['admin-token-bbbbbbbbbbbb\n', 'admin token bbbbbbbbbbbb', 'admin-token-bbbbbbbbbbbé']) {
    has(consoleProblems(text(bad)), 'auth.adminTokens.0: expected visible ASCII characters without spaces');
  }
  assert.deepEqual(consoleProblemsOrNone(text('admin-token-bbbbbbbbbbbb')), []);
  const sidecar = configSchema.safeParse({ upstreams: { default: { url: 'http://127.0.0.1:1' } }, console: { url: 'http://127.0.0.1:7000', token: 'sync-token\n' } });
  assert.ok(!sidecar.success && sidecar.error.issues.some((i) => i.path.join('.') === 'console.token' && /visible ASCII/.test(i.message)));
});

function consoleProblemsOrNone(text: string): string[] {
  try {
    parseConfigText({ text, file: 'console.yaml', schema: consoleConfigSchema, env: { TEST_MASTER_KEY: '00'.repeat(32) } });
    return [];
  } catch (e) {
    return e instanceof ConfigError ? e.problems : [String(e)];
  }
}

test('the console takes its pepper from KEYWARD_KEY_PEPPER when keys leaves it out, as the sidecar does', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-console-pepper-'));
  try {
    const file = join(dir, 'console.yaml');
    writeFileSync(file, `auth:\n  syncTokens: ["sync-token-aaaaaaaaaaaa"]\n  adminTokens: ["admin-token-bbbbbbbbbbbb"]\nkeys: { hash: hmac-sha256 }\npricing:\n  models: []\n  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }\n`);
    assert.equal(loadConsoleConfig({ file, env: { KEYWARD_KEY_PEPPER: 'pepper-from-the-env-0123' } }).keys.pepper, 'pepper-from-the-env-0123');
    assert.throws(() => loadConsoleConfig({ file, env: {} }), (e: Error) => e instanceof ConfigError && /pepper/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

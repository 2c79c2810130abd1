/**
 * Config promises operators read in the docs: the documented defaults of the
 * server's timers, strictness in every block (all unknown keys named at once, by path),
 * the pepper's documented minimum, both listeners on port 0, the hash keyward_config_info
 * shows computed apart from the code under test, and docs/configuration.md's "applies"
 * column matching what a reload actually keeps for a restart.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../src/config/file.js';
import { RESTART_ONLY } from '../../src/config/reload-plan.js';
import { lineColOf } from '../../src/config/yaml-problems.js';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

const DOC = fileURLToPath(new URL('../../docs/configuration.md', import.meta.url));

test('server.bodyIdleTimeoutMs and server.shutdownGraceMs default to the documented 60000 and 30000', () => {
  const c = parse(MINIMAL);
  assert.equal(c.server.bodyIdleTimeoutMs, 60_000);
  assert.equal(c.server.shutdownGraceMs, 30_000);
});

test('an unknown key is refused in every block, and every one is named by its path in one ConfigError', () => {
  const text = [
    'bogus0: 1',
    'server: { bogus1: 1 }',
    'admin: { bogus2: 1 }',
    'upstreams: { default: { url: http://127.0.0.1:4000, bogus3: 1, capacity: { bogus4: 1 } } }',
    'replica: { bogus5: 1 }',
    'console: { token: t, bogus6: 1 }',
    'redis: { bogus7: 1, lease: { bogus8: 1 } }',
    'limits: { bogus9: 1 }',
    'keys: { bogus10: 1 }',
    'messages: { bogus11: 1 }',
    'logging: { bogus12: 1 }',
    'routes: [ { path: /v1/rerank, class: model, bogus13: 1 } ]',
    'tracing: { bogus14: 1 }',
    'alerts: { webhookUrl: https://ops.example/h, bogus15: 1 }',
    '',
  ].join('\n');
  const list = problems(text);
  const paths = [
    'bogus0', 'server.bogus1', 'admin.bogus2', 'upstreams.default.bogus3', 'upstreams.default.capacity.bogus4', 'replica.bogus5',
    'console.bogus6', 'redis.bogus7', 'redis.lease.bogus8', 'limits.bogus9', 'keys.bogus10', 'messages.bogus11', 'logging.bogus12',
    'routes.0.bogus13', 'tracing.bogus14', 'alerts.bogus15',
  ];
  for (const p of paths) hasProblem(list, p, /unknown key/);
  assert.equal(list.length, paths.length, list.join('\n'));
});

test('keys.pepper shorter than the documented 16 characters is refused; 16 is taken', () => {
  hasProblem(problems(`${MINIMAL}keys: { hash: hmac-sha256, pepper: '${'p'.repeat(15)}' }\n`), 'keys.pepper', /16/);
  assert.equal(parse(`${MINIMAL}keys: { hash: hmac-sha256, pepper: '${'p'.repeat(16)}' }\n`).keys.pepper, 'p'.repeat(16));
});

test('the proxy and admin listeners may both ask for port 0 on one host (each gets its own port)', () => {
  const c = parse(`${MINIMAL}server: { port: 0 }\nadmin: { port: 0 }\n`);
  assert.deepEqual([c.server.port, c.admin.port], [0, 0]);
});

test('the hash of the file in force is the first 12 hex digits of the sha256 of its bytes', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-config-promises-'));
  try {
    const file = join(dir, 'keyward.yaml');
    const text = `${MINIMAL}logging: { level: debug }\n`;
    writeFileSync(file, text);
    const want = createHash('sha256').update(text).digest('hex').slice(0, 12);
    assert.equal(loadConfig(file).hash, want);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('every key docs/configuration.md marks "restart" is one a reload keeps, and no key marked "reload" is', () => {
  const rows = [...readFileSync(DOC, 'utf8').matchAll(/^\| `([a-zA-Z.<>]+)` \|.*\| (reload|restart)[^|]*\|$/gm)].map((m) => ({ key: m[1]!, applies: m[2]! }));
  assert.ok(rows.length > 20, `found ${rows.length} rows`);
  const keptByReload = (key: string) => RESTART_ONLY.some((r) => key === r || key.startsWith(`${r}.`));
  for (const { key, applies } of rows) assert.equal(keptByReload(key) ? 'restart' : 'reload', applies, key);
});

test('redis.timeoutMs of 0 is refused (documented as an integer > 0); 1 is taken', () => {
  hasProblem(problems(`${MINIMAL}redis: { timeoutMs: 0 }\n`), 'redis.timeoutMs');
  assert.equal(parse(`${MINIMAL}redis: { timeoutMs: 1 }\n`).redis?.timeoutMs, 1);
});

test('server.trustedProxies takes CIDRs and single addresses, and names an entry that is neither', () => {
  assert.deepEqual(parse(`${MINIMAL}server: { trustedProxies: [10.0.0.0/8, '2001:db8::/32', 192.0.2.7] }\n`).server.trustedProxies, ['10.0.0.0/8', '2001:db8::/32', '192.0.2.7']);
  hasProblem(problems(`${MINIMAL}server: { trustedProxies: [10.0.0.0/8, proxy.internal] }\n`), 'server.trustedProxies.1', /CIDR/);
});

test('server.maxJsonBodyBytes of 0 is refused (documented as an integer > 0)', () => {
  hasProblem(problems(`${MINIMAL}server: { maxJsonBodyBytes: 0 }\n`), 'server.maxJsonBodyBytes');
});

test('a YAML problem at the end of a line is placed on that line, columns counted from 1', () => {
  assert.deepEqual(lineColOf('ab\ncd\n', 2), { line: 1, col: 3 });
  assert.deepEqual(lineColOf('ab\ncd\n', 3), { line: 2, col: 1 });
});

test('YAML problems are listed in the order of their lines, warnings (an unknown tag) among the errors', () => {
  const text = `${MINIMAL}logging: { level: !env LEVEL }\nmessages: { vendor: a }\nmessages: { vendor: b }\n`;
  const lines = problems(text).filter((p) => p.startsWith('YAML: ')).map((p) => Number(/^YAML: line (\d+),/.exec(p)?.[1]));
  assert.deepEqual(lines, [4, 6]);
});

test('a console config given to the sidecar (listen and store, no pricing) is named as the console\'s', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-config-promises-'));
  try {
    const file = join(dir, 'console.yaml');
    writeFileSync(file, 'listen: { port: 7000 }\nstore: { path: ./console.sqlite }\n');
    assert.throws(() => loadConfig(file), (e: Error) => /this looks like the console's config/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

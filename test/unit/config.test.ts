import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createServer } from 'node:http';
import { listen } from '../../src/app/listen.js';
import { ConfigError } from '../../src/config/load.js';
import { loadConsoleConfig } from '../../src/app/config-files.js';
import { loadConfigFile } from '../../src/config/file.js';
import { configSchema } from '../../src/config/schema.js';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

test('defaults are the ones in DESIGN section 2', () => {
  const c = parse(MINIMAL);
  assert.equal(c.server.host, '127.0.0.1');
  assert.equal(c.server.port, 8080);
  assert.equal(c.server.maxJsonBodyBytes, 33_554_432);
  assert.equal(c.server.maxUploadBytes, 0);
  assert.deepEqual(c.server.trustedProxies, []);
  assert.equal(c.server.refuseBrowsers, true);
  assert.deepEqual(c.admin, { host: '127.0.0.1', port: 9090 });
  assert.deepEqual(c.upstreams, { default: { url: 'http://127.0.0.1:4000', timeoutMs: 600_000, capacity: { concurrency: 0, rpm: 0 } } });
  assert.deepEqual(c.replica, { path: './data/replica.sqlite' });
  assert.equal(c.console, undefined);
  assert.equal(c.redis, undefined);
  assert.deepEqual(c.keys, { hash: 'sha256', format: 'any' });
  assert.deepEqual(c.messages, { vendor: 'keyward' });
  assert.deepEqual(c.logging, { level: 'info' });
  assert.deepEqual(c.routes, []);
  assert.deepEqual(c.limits, { leaseMs: 30_000, defaultOutputTokens: 1024, shadow: [] });
});

test('limits.shadow: a list of the checks DESIGN section 12 names, anything else refused with the names listed', () => {
  assert.deepEqual(parse(`${MINIMAL}limits: { shadow: [rpm, budget] }\n`).limits.shadow, ['rpm', 'budget']);
  hasProblem(problems(`${MINIMAL}limits: { shadow: [rpm, speed] }\n`), 'limits.shadow.1', /rpm.*tpm.*concurrency.*route.*model.*budget/);
  hasProblem(problems(`${MINIMAL}limits: { shadow: rpm }\n`), 'limits.shadow');
});

test('the URLs DESIGN section 2 lists are the defaults of the default upstream, the console and Redis', () => {
  const c = parse('upstreams:\n  default: { timeoutMs: 5 }\nconsole: { token: t }\nredis: { prefix: x }\n');
  assert.equal(c.upstreams.default!.url, 'http://127.0.0.1:4000');
  assert.equal(c.console?.url, 'http://127.0.0.1:7000');
  assert.equal(c.redis?.url, 'redis://127.0.0.1:6379');
});

test('defaults inside optional sections', () => {
  const c = parse(`${MINIMAL}redis:\n  url: redis://127.0.0.1:6379\nconsole:\n  url: http://127.0.0.1:7000\n  token: sync-token\n`);
  assert.deepEqual(c.redis, { url: 'redis://127.0.0.1:6379', prefix: 'kw', timeoutMs: 100, onError: 'open', lease: { enabled: true, sliceMs: 1000 } });
  assert.deepEqual(c.console, { url: 'http://127.0.0.1:7000', token: 'sync-token', waitMs: 25_000 });
  const partial = parse('upstreams:\n  default:\n    url: http://u\n    capacity: { rpm: 60 }\n  batch:\n    url: https://b\n    timeoutMs: 5\n');
  assert.deepEqual(partial.upstreams.default?.capacity, { concurrency: 0, rpm: 60 });
  assert.deepEqual(partial.upstreams.batch, { url: 'https://b', timeoutMs: 5, capacity: { concurrency: 0, rpm: 0 } });
});

test('alerts: optional; thresholds default to [0.8, 0.95, 1]; values from the environment', () => {
  assert.equal(parse(MINIMAL).alerts, undefined);
  assert.deepEqual(parse(`${MINIMAL}alerts: { webhookUrl: https://ops.example/hooks/keyward }\n`).alerts, { webhookUrl: 'https://ops.example/hooks/keyward', thresholds: [0.8, 0.95, 1] });
  const c = parse(`${MINIMAL}alerts:\n  webhookUrl: \${HOOK}\n  thresholds: [0.5, \${HIGH}, 1]\n  secret: \${ALERT_SECRET}\n`, { HOOK: 'http://127.0.0.1:8099/h', HIGH: '0.9', ALERT_SECRET: '12345' });
  assert.deepEqual(c.alerts, { webhookUrl: 'http://127.0.0.1:8099/h', thresholds: [0.5, 0.9, 1], secret: '12345' });
});

test('explicit values override defaults; operator routes get their defaults', () => {
  const c = parse(`${MINIMAL}server: { host: 0.0.0.0, port: 8443 }\nkeys: { hash: hmac-sha256, pepper: pepper-0123456789abcdef, format: keyward }\nlogging: { level: debug }\nroutes:\n  - { path: /v1/rerank, class: model }\n`);
  assert.equal(c.server.host, '0.0.0.0');
  assert.equal(c.server.port, 8443);
  assert.deepEqual(c.keys, { hash: 'hmac-sha256', pepper: 'pepper-0123456789abcdef', format: 'keyward' });
  assert.equal(c.logging.level, 'debug');
  assert.deepEqual(c.routes, [{ path: '/v1/rerank', class: 'model', credentials: 'bearer', style: 'openai', countTokens: false, modelRequired: false }]);
});

test('a __proto__ key is an unknown key, never the members of the part around it', () => {
  const list = problems(`${MINIMAL}  __proto__: { url: "not a url" }\nserver:\n  __proto__: { port: 7 }\n__proto__: { logging: { level: debug } }\n`);
  hasProblem(list, 'server.__proto__', /unknown key/);
  hasProblem(list, 'upstreams.__proto__', /routing mode name/);
  hasProblem(list, '__proto__', /unknown key/);
});

test('the bounds refused below are just past what is taken: a one-second lease, redis.lease spelled right', () => {
  assert.equal(parse(`${MINIMAL}limits: { leaseMs: 1000 }\n`).limits.leaseMs, 1000);
  assert.deepEqual(parse(`${MINIMAL}redis: { lease: { enabled: false, sliceMs: 500 } }\n`).redis!.lease, { enabled: false, sliceMs: 500 });
});

// [yaml, path, matcher]
const SINGLE: [string, string, string, RegExp?][] = [
  ['unknown root key', `${MINIMAL}bogus: 1\n`, 'bogus', /unknown key/],
  ['unknown server key', `${MINIMAL}server: { prot: 1 }\n`, 'server.prot', /unknown key/],
  ['unknown key in an upstream', 'upstreams:\n  default: { url: http://u, timeout: 5 }\n', 'upstreams.default.timeout', /unknown key/],
  ['unknown key in capacity', 'upstreams:\n  default: { url: http://u, capacity: { burst: 1 } }\n', 'upstreams.default.capacity.burst', /unknown key/],
  ['unknown key in a route', `${MINIMAL}routes:\n  - { path: /x, class: model, color: red }\n`, 'routes.0.color', /unknown key/],
  ['unknown key in redis', `${MINIMAL}redis: { url: redis://r, cluster: true }\n`, 'redis.cluster', /unknown key/],
  ['unknown key in redis.lease', `${MINIMAL}redis: { lease: { enabled: true, sliceMS: 500 } }\n`, 'redis.lease.sliceMS', /unknown key/],
  ['unknown key in admin', `${MINIMAL}admin: { bind: x }\n`, 'admin.bind', /unknown key/],
  ['unknown key in replica', `${MINIMAL}replica: { file: x }\n`, 'replica.file', /unknown key/],
  ['unknown key in console', `${MINIMAL}console: { url: http://c, token: t, secret: s }\n`, 'console.secret', /unknown key/],
  ['unknown key in keys', `${MINIMAL}keys: { salt: x }\n`, 'keys.salt', /unknown key/],
  ['unknown key in messages', `${MINIMAL}messages: { version: x }\n`, 'messages.version', /unknown key/],
  ['unknown key in logging', `${MINIMAL}logging: { format: json }\n`, 'logging.format', /unknown key/],
  ['port is a string', `${MINIMAL}server: { port: abc }\n`, 'server.port', /number/],
  ['port out of range', `${MINIMAL}server: { port: 70000 }\n`, 'server.port'],
  ['port not an integer', `${MINIMAL}admin: { port: 90.5 }\n`, 'admin.port'],
  ['negative body limit', `${MINIMAL}server: { maxJsonBodyBytes: -1 }\n`, 'server.maxJsonBodyBytes'],
  // slots would expire under a response still streaming
  ['lease under a second', `${MINIMAL}limits: { leaseMs: 999 }\n`, 'limits.leaseMs'],
  ['lease of 0', `${MINIMAL}limits: { leaseMs: 0 }\n`, 'limits.leaseMs'],
  // an empty path would open a temporary database that no worker or restart sees
  ['empty replica path', `${MINIMAL}replica: { path: "" }\n`, 'replica.path'],
  ['timeout as a string', 'upstreams:\n  default: { url: http://u, timeoutMs: "10s" }\n', 'upstreams.default.timeoutMs'],
  ['upstream url not http', 'upstreams:\n  default: { url: ftp://u }\n', 'upstreams.default.url', /http/],
  ['upstream url missing on a mode other than default', 'upstreams:\n  default: { url: http://u }\n  batch: { timeoutMs: 5 }\n', 'upstreams.batch.url'],
  ['redis onError', `${MINIMAL}redis: { url: redis://r, onError: maybe }\n`, 'redis.onError', /open/],
  ['redis url scheme', `${MINIMAL}redis: { url: http://r }\n`, 'redis.url', /redis/],
  ['hash algorithm', `${MINIMAL}keys: { hash: md5 }\n`, 'keys.hash'],
  ['key format', `${MINIMAL}keys: { format: uuid }\n`, 'keys.format'],
  ['hmac without pepper', `${MINIMAL}keys: { hash: hmac-sha256 }\n`, 'keys.pepper', /pepper/],
  ['log level', `${MINIMAL}logging: { level: loud }\n`, 'logging.level'],
  ['console without token', `${MINIMAL}console: { url: http://c }\n`, 'console.token'],
  ['console waitMs too large', `${MINIMAL}console: { url: http://c, token: t, waitMs: 120000 }\n`, 'console.waitMs'],
  ['vendor with upper case', `${MINIMAL}messages: { vendor: Acme }\n`, 'messages.vendor'],
  ['route class', `${MINIMAL}routes:\n  - { path: /x, class: other }\n`, 'routes.0.class'],
  ['route path', `${MINIMAL}routes:\n  - { path: x, class: model }\n`, 'routes.0.path'],
  ['upstream URL with user-info', 'upstreams:\n  default: { url: "http://user:secret@127.0.0.1:4000" }\n', 'upstreams.default.url', /user-info/],
  ['upstream URL with a fragment', 'upstreams:\n  default: { url: "http://127.0.0.1:4000/base#x" }\n', 'upstreams.default.url', /fragment/],
  ['route path with a trailing slash', `${MINIMAL}routes:\n  - { path: /v1/rerank/, class: model }\n`, 'routes.0.path', /could match/],
  ['route path with an empty segment', `${MINIMAL}routes:\n  - { path: /v1//a, class: model }\n`, 'routes.0.path', /could match/],
  ['route path with a dot segment', `${MINIMAL}routes:\n  - { path: /v1/../admin/*, class: model }\n`, 'routes.0.path', /dot segments/],
  ['route path with an encoded dot', `${MINIMAL}routes:\n  - { path: /v1/%2e/x, class: model }\n`, 'routes.0.path', /encoded/],
  ['route path outside ASCII', `${MINIMAL}routes:\n  - { path: /v1/ré, class: model }\n`, 'routes.0.path', /ASCII/],
  ['route path with an inner *', `${MINIMAL}routes:\n  - { path: /v1/x/*/y, class: model }\n`, 'routes.0.path', /only end a path/],
  ['route on /v1/key', `${MINIMAL}routes:\n  - { path: /v1/key, class: listing }\n`, 'routes.0.path', /keyward's own/],
  ['route the built-in table answers', `${MINIMAL}routes:\n  - { path: /v1/chat/completions, class: files }\n`, 'routes.0.path', /built-in route chat\.completions already answers every method/],
  ['route on built-in methods only', `${MINIMAL}routes:\n  - { path: /v1/messages, methods: [POST], class: model }\n`, 'routes.0.path', /built-in route messages already answers these methods/],
  ['route method Node never parses', `${MINIMAL}routes:\n  - { path: /v1/x, methods: [GETX], class: model }\n`, 'routes.0.methods.0', /expected one of GET/],
  ['upstreams missing', 'server: { port: 8080 }\n', 'upstreams'],
  ['upstreams.default missing', 'upstreams:\n  batch: { url: http://b }\n', 'upstreams', /upstreams\.default/],
  ['empty file', '', 'upstreams'],
  ['admin shares the proxy port', `${MINIMAL}server: { port: 9000 }\nadmin: { port: 9000 }\n`, 'admin.port'],
  ['unknown key in alerts', `${MINIMAL}alerts: { webhookUrl: http://h, retries: 3 }\n`, 'alerts.retries', /unknown key/],
  ['alerts without a webhook', `${MINIMAL}alerts: { thresholds: [0.5] }\n`, 'alerts.webhookUrl'],
  ['alerts webhook not http', `${MINIMAL}alerts: { webhookUrl: ftp://h }\n`, 'alerts.webhookUrl', /http/],
  ['alert threshold of 0', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [0, 0.5] }\n`, 'alerts.thresholds.0', /above 0/],
  ['alert threshold over 1', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [0.5, 1.2] }\n`, 'alerts.thresholds.1', /at most 1/],
  ['alert threshold not a number', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [high] }\n`, 'alerts.thresholds.0'],
  ['alert thresholds out of order', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [0.95, 0.8] }\n`, 'alerts.thresholds', /ascending/],
  ['alert threshold repeated', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [0.8, 0.8, 1] }\n`, 'alerts.thresholds', /each once/],
  ['no alert thresholds', `${MINIMAL}alerts: { webhookUrl: http://h, thresholds: [] }\n`, 'alerts.thresholds', /at least one/],
  ['empty alert secret', `${MINIMAL}alerts: { webhookUrl: http://h, secret: "" }\n`, 'alerts.secret'],
];

for (const [name, text, path, re] of SINGLE) {
  test(`invalid: ${name} -> ${path}`, () => hasProblem(problems(text), path, re));
}

test('a route with an empty methods list: that one problem, not also a built-in route of no name', () => {
  const list = problems(`${MINIMAL}routes:\n  - { path: /v1/rerank, methods: [], class: model }\n`);
  hasProblem(list, 'routes.0.methods');
  assert.equal(list.length, 1, list.join('\n'));
});

test(
  'the admin listener may not share the proxy port when either host is a wildcard',
  () => {
    hasProblem(problems(`${MINIMAL}server: { host: 0.0.0.0, port: 9000 }\nadmin: { port: 9000 }\n`), 'admin.port');
  },
);

test('operator routes: a catch-all `/*` and prefixes are accepted', () => {
  const c = parse(`${MINIMAL}routes:\n  - { path: /v2/*, class: model }\n  - { path: /*, class: files }\n`);
  assert.deepEqual(c.routes.map((r) => r.path), ['/v2/*', '/*']);
});

test('tracing: an empty block sends to a collector beside keyward (DESIGN section 2 default); a query on an upstream URL is kept', () => {
  const c = parse(`${MINIMAL}tracing: {}\n`);
  assert.deepEqual(c.tracing, { otlpUrl: 'http://127.0.0.1:4318', sampleRatio: 1, propagate: true });
  assert.equal(parse('upstreams:\n  default: { url: "http://127.0.0.1:4000/base?tenant=1" }\n').upstreams.default?.url, 'http://127.0.0.1:4000/base?tenant=1');
});

test('tracing.otlpUrl is a base URL: a query or fragment would come before /v1/traces, and is refused', () => {
  hasProblem(problems(`${MINIMAL}tracing: { otlpUrl: "http://127.0.0.1:4318/?tenant=a" }\n`), 'tracing.otlpUrl', /without \?query or #fragment/);
  hasProblem(problems(`${MINIMAL}tracing: { otlpUrl: "http://127.0.0.1:4318/t#x" }\n`), 'tracing.otlpUrl', /without \?query or #fragment/);
  assert.equal(parse(`${MINIMAL}tracing: { otlpUrl: "http://collector:4318/tenant-a" }\n`).tracing?.otlpUrl, 'http://collector:4318/tenant-a');
});

test('a bracketed IPv6 host is kept in the form a listener binds', async () => {
  const c = parse(`${MINIMAL}server: { host: "[::1]", port: 0 }\nadmin: { host: "[::1]" }\n`);
  assert.equal(c.server.host, '::1');
  assert.equal(c.admin.host, '::1');
  const server = createServer();
  try {
    const port = await listen(server, c.server.port, c.server.host);
    assert.ok(port > 0);
  } finally {
    server.close();
  }
});

test('every problem is reported together in one ConfigError', () => {
  const text = [
    'bogus: 1',
    'server:',
    '  port: "abc"',
    '  extra: 2',
    'upstreams:',
    '  batch:',
    '    url: ftp://x',
    '    capacity: { burst: 1 }',
    'keys: { hash: hmac-sha256 }',
    'redis: { url: redis://x, onError: maybe }',
    'console: { url: http://x, token: "${NOPE}" }',
    'routes:',
    '  - { path: /v1/x, class: model, extra: 1 }',
    '',
  ].join('\n');
  const list = problems(text);
  for (const path of ['bogus', 'server.port', 'server.extra', 'upstreams.batch.url', 'upstreams.batch.capacity.burst', 'upstreams', 'keys.pepper', 'redis.onError', 'console.token', 'routes.0.extra']) {
    hasProblem(list, path);
  }
  assert.ok(list.length >= 10, list.join('\n'));
});

test('checks that compare fields are reported beside problems elsewhere in the same part', () => {
  // zod skips a refinement once its value has another problem; these run regardless.
  const ports = problems(`${MINIMAL}server: { port: 9000 }\nadmin: { port: 9000 }\nlogging: { level: loud }\n`);
  hasProblem(ports, 'admin.port', /share the proxy port/);
  hasProblem(ports, 'logging.level');
  const pepper = problems(`${MINIMAL}keys: { hash: hmac-sha256, format: bad }\n`);
  hasProblem(pepper, 'keys.pepper', /pepper/);
  hasProblem(pepper, 'keys.format');
  const upstreams = problems('upstreams:\n  batch: { url: http://b, timeoutMs: abc }\n');
  hasProblem(upstreams, 'upstreams', /upstreams\.default/);
  hasProblem(upstreams, 'upstreams.batch.timeoutMs');
});

test('redis.lease.enabled comes from the environment like every other boolean', () => {
  const c = parse(`${MINIMAL}redis: { url: redis://r, lease: { enabled: \${LEASE_ON:-true} } }\n`, { LEASE_ON: 'false' });
  assert.equal(c.redis?.lease.enabled, false);
});

test('YAML syntax errors and duplicate keys are ConfigErrors', () => {
  assert.ok(problems('server: [unclosed\n').some((p) => p.startsWith('YAML')));
  assert.ok(problems(`${MINIMAL}server: { port: 1 }\nserver: { port: 2 }\n`).some((p) => p.startsWith('YAML')));
});

test('loadConfigFile reads a file and names it in errors; a missing file is a ConfigError', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-config-'));
  try {
    const good = join(dir, 'good.yaml');
    writeFileSync(good, `${MINIMAL}server:\n  port: \${PORT:-8181}\n`);
    assert.equal(loadConfigFile({ file: good, schema: configSchema, env: {} }).server.port, 8181);
    assert.equal(loadConfigFile({ file: good, schema: configSchema, env: { PORT: '8282' } }).server.port, 8282);
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'upstreams: {}\nextra: 1\n');
    assert.throws(
      () => loadConfigFile({ file: bad, schema: configSchema, env: {} }),
      (e: unknown) => e instanceof ConfigError && e.file === bad && e.message.startsWith(`${bad}:`) && e.problems.length === 2,
    );
    const missing = join(dir, 'nope.yaml');
    assert.throws(
      () => loadConfigFile({ file: missing, schema: configSchema, env: {} }),
      (e: unknown) => e instanceof ConfigError && e.file === missing && e.message.includes(missing) && /ENOENT/.test(e.message),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'the DESIGN section 2 block, as written (flow mappings with ${VAR}), loads',
  () => {
    const design = [
      'server:   { host: 127.0.0.1, port: 8080, maxJsonBodyBytes: 33554432 }',
      'admin:    { host: 127.0.0.1, port: 9090 }',
      'upstreams:',
      '  default: { url: http://127.0.0.1:4000, timeoutMs: 600000, capacity: { concurrency: 0, rpm: 0 } }',
      'replica:  { path: ./data/replica.sqlite }',
      'console:  { url: http://127.0.0.1:7000, token: ${KEYWARD_SYNC_TOKEN}, waitMs: 25000 }',
      'redis:    { url: redis://127.0.0.1:6379, prefix: kw, timeoutMs: 100, onError: open }',
      'keys:     { hash: sha256, format: any }',
      'messages: { vendor: keyward }',
      'logging:  { level: info }',
      '',
    ].join('\n');
    const c = parse(design, { KEYWARD_SYNC_TOKEN: 'sync-token-0123456789' });
    assert.equal(c.console?.token, 'sync-token-0123456789');
  },
);

const EXAMPLE = fileURLToPath(new URL('../../config/keyward.example.yaml', import.meta.url));

test('config/keyward.example.yaml is valid', { skip: !existsSync(EXAMPLE) && 'no example config yet' }, () => {
  const env = { KEYWARD_SYNC_TOKEN: 'sync-token-0123456789', KEYWARD_KEY_PEPPER: 'pepper-0123456789abcdef0123' };
  const c = loadConfigFile({ file: EXAMPLE, schema: configSchema, env });
  assert.ok(c.upstreams.default);
  assert.deepEqual([c.server.host, c.admin.host], ['127.0.0.1', '127.0.0.1']);
  // the image's environment (the Dockerfile's last ENV) puts both listeners on every
  // interface, so the ports it publishes answer
  const dockerfile = readFileSync(fileURLToPath(new URL('../../Dockerfile', import.meta.url)), 'utf8');
  const imageEnv = Object.fromEntries([...dockerfile.matchAll(/^ENV (.+)$/gm)].at(-1)![1]!.split(/\s+/).map((pair) => pair.split('=') as [string, string]));
  const image = loadConfigFile({ file: EXAMPLE, schema: configSchema, env: { ...env, ...imageEnv } });
  assert.deepEqual([image.server.host, image.admin.host], ['0.0.0.0', '0.0.0.0']);
  // the health check reads KEYWARD_ADMIN_PORT: the config moves with it
  assert.equal(loadConfigFile({ file: EXAMPLE, schema: configSchema, env: { ...env, KEYWARD_ADMIN_PORT: '9191' } }).admin.port, 9191);
  assert.equal(c.admin.port, 9090);
  // the console verb the image runs listens where the image publishes it
  const tokens = { KEYWARD_SYNC_TOKEN: 's'.repeat(20), KEYWARD_ADMIN_TOKEN: 'a'.repeat(20) };
  const consoleConfig = loadConsoleConfig({ file: fileURLToPath(new URL('../../config/console.example.yaml', import.meta.url)), env: { ...tokens, ...imageEnv } });
  assert.deepEqual([consoleConfig.listen.host, consoleConfig.listen.port], ['0.0.0.0', 7000]);
  assert.match(dockerfile, /^EXPOSE .*\b7000\b/m);
});

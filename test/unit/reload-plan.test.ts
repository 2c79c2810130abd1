/**
 * What a reload takes up (DESIGN section 12), as the pure plan decides it: the config to
 * put in force keeps every restart-only setting at its running value and takes everything
 * else from the file, and the plan names each restart-only key the file changed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseConfigText } from '../../src/config/load.js';
import { changedSettings, planReload, RESTART_ONLY } from '../../src/config/reload-plan.js';
import { configSchema, type Config } from '../../src/config/schema.js';

const parse = (text: string): Config => parseConfigText({ text, file: 'k.yaml', schema: configSchema, env: {} });

const RUNNING = parse(`
server: { host: 127.0.0.1, port: 8080, maxJsonBodyBytes: 1000, shutdownGraceMs: 30000 }
admin: { port: 9090 }
upstreams: { default: { url: http://127.0.0.1:4000 } }
replica: { path: /var/lib/keyward/replica.sqlite }
redis: { url: redis://127.0.0.1:6379, prefix: kw }
keys: { hash: sha256 }
limits: { leaseMs: 30000, defaultOutputTokens: 1024 }
logging: { level: info }
`);

test('a file that changes only reloadable settings is put in force as it is, and nothing needs a restart', () => {
  const next = parse(`
server: { host: 127.0.0.1, port: 8080, maxJsonBodyBytes: 2000, refuseBrowsers: false, trustedProxies: [10.0.0.0/8], bodyIdleTimeoutMs: 5000, shutdownGraceMs: 10000 }
admin: { port: 9090 }
upstreams: { default: { url: http://127.0.0.1:4001, capacity: { rpm: 5 } }, big: { url: http://127.0.0.1:4002 } }
replica: { path: /var/lib/keyward/replica.sqlite }
redis: { url: redis://127.0.0.1:6379, prefix: kw }
keys: { hash: sha256 }
limits: { leaseMs: 5000, defaultOutputTokens: 99 }
messages: { vendor: acme }
logging: { level: debug }
routes: [ { path: /v1/rerank, class: model } ]
tracing: { otlpUrl: http://collector:4318 }
`);
  const plan = planReload(RUNNING, next);
  assert.deepEqual(plan.needsRestart, []);
  assert.deepEqual(plan.config, next);
  assert.deepEqual(changedSettings(RUNNING, plan.config), [
    'limits.defaultOutputTokens', 'limits.leaseMs', 'logging.level', 'messages.vendor', 'routes',
    'server.bodyIdleTimeoutMs', 'server.maxJsonBodyBytes', 'server.refuseBrowsers', 'server.shutdownGraceMs', 'server.trustedProxies',
    'tracing', 'upstreams.big', 'upstreams.default.capacity.rpm', 'upstreams.default.url',
  ]);
});

test('restart-only settings keep their running values, each changed key is named, the rest applies', () => {
  const next = parse(`
server: { host: 0.0.0.0, port: 8081, maxJsonBodyBytes: 5 }
admin: { host: 0.0.0.0, port: 9191 }
upstreams: { default: { url: http://127.0.0.1:4000 } }
replica: { path: /tmp/other.sqlite }
redis: { url: redis://10.0.0.1:6379, prefix: kw2 }
console: { url: http://console:7000, token: t }
keys: { hash: hmac-sha256, pepper: a-pepper-of-16-chars }
limits: { leaseMs: 5000, defaultOutputTokens: 1024 }
logging: { level: warn }
`);
  const plan = planReload(RUNNING, next);
  assert.deepEqual(plan.needsRestart, [
    'server.host', 'server.port', 'admin.host', 'admin.port', 'replica.path', 'redis.prefix', 'redis.url', 'console', 'keys.hash', 'keys.pepper',
  ]);
  // every restart-only path holds its running value...
  for (const dotted of RESTART_ONLY) {
    const at = (c: Config) => dotted.split('.').reduce<unknown>((v, k) => (v as Record<string, unknown> | undefined)?.[k], c);
    assert.deepEqual(at(plan.config), at(RUNNING), dotted);
  }
  assert.equal(plan.config.console, undefined, 'a console block added by the file waits for a restart');
  // ...and the reloadable neighbours of those keys come from the file
  assert.equal(plan.config.server.maxJsonBodyBytes, 5);
  assert.equal(plan.config.logging.level, 'warn');
  assert.equal(plan.config.limits.defaultOutputTokens, 1024);
  // the running config is not changed by planning
  assert.equal(RUNNING.server.port, 8080);
  assert.equal(RUNNING.server.maxJsonBodyBytes, 1000);
});

test('a restart-only block removed by the file is named whole and stays', () => {
  const next = parse(`
server: { host: 127.0.0.1, port: 8080, maxJsonBodyBytes: 1000, shutdownGraceMs: 30000 }
admin: { port: 9090 }
upstreams: { default: { url: http://127.0.0.1:4000 } }
replica: { path: /var/lib/keyward/replica.sqlite }
keys: { hash: sha256 }
logging: { level: info }
`);
  const plan = planReload(RUNNING, next);
  assert.deepEqual(plan.needsRestart, ['redis']);
  assert.deepEqual(plan.config.redis, RUNNING.redis);
  assert.deepEqual(changedSettings(RUNNING, plan.config), []);
});

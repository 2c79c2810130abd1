import { test } from 'node:test';
import assert from 'node:assert/strict';
import { consoleConfigSchema } from '../../src/console/config.js';
import { loadConsoleConfig } from '../../src/app/config-files.js';
import { parseConfigText, ConfigError } from '../../src/config/load.js';

test('the example console config is valid', () => {
  const c = loadConsoleConfig({ file: 'config/console.example.yaml', env: { KEYWARD_SYNC_TOKEN: 's'.repeat(20), KEYWARD_ADMIN_TOKEN: 'a'.repeat(20) } });
  assert.equal(c.keys.hash, 'sha256');
  assert.equal(c.masterKeyEnv, 'KEYWARD_MASTER_KEY');
  assert.ok(c.pricing.models.length > 0);
  assert.throws(() => loadConsoleConfig({ file: 'config/console.example.yaml', env: {} }), /KEYWARD_SYNC_TOKEN is not set/);
});

const minimal = `
auth:
  syncTokens: ["\${SYNC:-sync-token-0123456789}"]
  adminTokens: [admin-token-0123456789]
pricing:
  unpriced: { inputPerMillion: 0, outputPerMillion: 0 }
`;

test('console config: defaults, and every problem reported together', () => {
  const cfg = parseConfigText({ text: minimal, file: 'c.yaml', schema: consoleConfigSchema, env: {} });
  assert.equal(cfg.listen.port, 7000);
  assert.equal(cfg.masterKeyEnv, 'KEYWARD_MASTER_KEY');
  assert.equal(cfg.keys.hash, 'sha256');
  assert.equal(cfg.sync.retainChanges, 100_000);
  const bad = `
listen: { port: "x" }
keys: { hash: hmac-sha256 }
auth:
  syncTokens: [short]
  adminTokens: [admin-token-0123456789]
  extra: 1
pricing: { models: [] }
`;
  assert.throws(
    () => parseConfigText({ text: bad, file: 'c.yaml', schema: consoleConfigSchema, env: {} }),
    (e: ConfigError) => {
      const text = e.problems.join('\n');
      for (const p of ['listen.port', 'keys.pepper', 'auth.syncTokens.0', 'auth.extra: unknown key', 'pricing.unpriced']) {
        assert.ok(text.includes(p), `expected a problem about ${p} in:\n${text}`);
      }
      return true;
    },
  );
});

test('console config: numbers from the environment, as in the sidecar config', () => {
  const text = `${minimal}listen: { port: \${CPORT:-7001} }\nsync: { maxBatch: \${BATCH} }\n`;
  const cfg = parseConfigText({ text, file: 'c.yaml', schema: consoleConfigSchema, env: { BATCH: '50' } });
  assert.equal(cfg.listen.port, 7001);
  assert.equal(cfg.sync.maxBatch, 50);
});

test('console config: one token, one role', () => {
  const shared = minimal.replace('adminTokens: [admin-token-0123456789]', 'adminTokens: [sync-token-0123456789]');
  assert.throws(
    () => parseConfigText({ text: shared, file: 'c.yaml', schema: consoleConfigSchema, env: {} }),
    (e: ConfigError) => e.problems.some((p) => p.startsWith('auth.adminTokens.0: same token as auth.syncTokens.0')),
  );
});

test('masterKeyEnv holding the master key itself (`${KEYWARD_MASTER_KEY}`) is refused without printing it', () => {
  for (const key of ['a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90', 'Zm9vYmFyYmF6cXV1eDAxMjM0NTY3ODlhYmNkZWZnaGlq']) {
    assert.throws(
      () => parseConfigText({ text: `${minimal}masterKeyEnv: \${MK}\n`, file: 'c.yaml', schema: consoleConfigSchema, env: { MK: key } }),
      (e: ConfigError) => {
        const text = e.problems.join('\n');
        assert.match(text, /masterKeyEnv: holds what looks like the master key itself/);
        assert.ok(!text.includes(key.slice(0, 12)), text);
        return true;
      },
    );
  }
  // long variable names are still names
  const named = parseConfigText({ text: `${minimal}masterKeyEnv: KEYWARD_CONSOLE_MASTER_KEY_FOR_THE_EU_WEST_REGION_2\n`, file: 'c.yaml', schema: consoleConfigSchema, env: {} });
  assert.equal(named.masterKeyEnv, 'KEYWARD_CONSOLE_MASTER_KEY_FOR_THE_EU_WEST_REGION_2');
});

/** Config text parsed as a file would be, and the problems a ConfigError lists. */
import assert from 'node:assert/strict';
import { ConfigError, parseConfigText } from '../../src/config/load.js';
import { configSchema, type Config } from '../../src/config/schema.js';
import { SIDECAR_ENV_DEFAULTS } from '../../src/config/file.js';

export const FILE = 'keyward-test.yaml';
export const MINIMAL = 'upstreams:\n  default:\n    url: http://127.0.0.1:4000\n';
export const parse = (text: string, env: Record<string, string> = {}): Config => parseConfigText({ text, file: FILE, schema: configSchema, env, envDefaults: SIDECAR_ENV_DEFAULTS });

/** Runs `fn`, expects a ConfigError, returns its problems. */
export function problems(text: string, env: Record<string, string> = {}): string[] {
  try {
    parse(text, env);
  } catch (e) {
    assert.ok(e instanceof ConfigError, `expected ConfigError, got ${String(e)}`);
    assert.equal(e.file, FILE);
    assert.ok(e.message.startsWith(`${FILE}:`), e.message);
    for (const p of e.problems) assert.ok(e.message.includes(p));
    return e.problems;
  }
  assert.fail('expected a ConfigError');
}

export const hasProblem = (list: string[], path: string, re?: RegExp) =>
  assert.ok(
    list.some((p) => p.startsWith(`${path}:`) && (!re || re.test(p))),
    `expected a problem at ${path}${re ? ` matching ${re}` : ''} in:\n${list.join('\n')}`,
  );


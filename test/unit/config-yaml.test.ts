/**
 * YAML problems (DESIGN section 2): each names its line and column and never quotes the
 * file, whose text may hold secrets; follow-on errors of one mistake are not listed one
 * by one; a recoverable problem (a key named twice, an unknown tag) is reported beside
 * every problem the schema finds.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { consoleConfigSchema } from '../../src/console/config.js';
import { ConfigError, parseConfigText } from '../../src/config/load.js';
import { MINIMAL, hasProblem, problems } from '../helpers/config-text.js';

const SECRETS = ['hunter2pass', 'whsec-SECRET-value', 'sync-SECRET-token', '__KWENV'];
const noSecrets = (list: string[]) => {
  const text = list.join('\n');
  for (const s of SECRETS) assert.ok(!text.includes(s), `${s} reached a problem:\n${text}`);
};
const yamlOnly = (list: string[]) => list.filter((p) => p.startsWith('YAML'));

test('a YAML syntax error names its line and column and quotes nothing of the file', () => {
  const list = problems(
    [
      'upstreams:',
      '  default: { url: http://127.0.0.1:4000 }',
      'console: { url: http://127.0.0.1:7000 } }',
      'redis: { url: "redis://:hunter2pass@127.0.0.1:6379" }',
      'alerts: { webhookUrl: "${HOOK:-http://h/}", secret: whsec-SECRET-value }',
      '',
    ].join('\n'),
  );
  noSecrets(list);
  assert.match(list[0]!, /^YAML: line 3, column 41: /);
  // one mistake, many follow-on errors: at most one per line and a handful in all
  const lines = list.map((p) => /^YAML: line (\d+),/.exec(p)?.[1]).filter(Boolean);
  assert.equal(new Set(lines).size, lines.length, list.join('\n'));
  assert.ok(list.length <= 6, list.join('\n'));
});

test('an unclosed flow mapping with a secret in it is reported by position only', () => {
  const list = problems('upstreams:\n  default: { url: http://127.0.0.1:4000 }\nconsole: { url: http://127.0.0.1:7000, token: "sync-SECRET-token-123"\nredis:\n  url: redis://:hunter2pass@127.0.0.1:6379\n');
  noSecrets(list);
  assert.ok(list.every((p) => /^YAML: line \d+, column \d+: [^"]+$/.test(p)), list.join('\n'));
});

test('a long cascade is cut to a handful, with a count of the lines left out', () => {
  const text = `${MINIMAL}console: { url: http://c } }\n${Array.from({ length: 12 }, (_v, i) => `k${i}: { a: "s-${i}", b: [1, 2] }\n`).join('')}`;
  const list = problems(text);
  noSecrets(list);
  assert.ok(list.length <= 6, list.join('\n'));
  assert.match(list.at(-1)!, /^YAML: \d+ more lines? with problems/);
  assert.ok(!list.some((p) => /s-\d/.test(p)), list.join('\n'));
});

test('a reference inside quoted text keeps the column of the file as written', () => {
  // the placeholder a reference becomes is longer than `${A}`: the column is the file's own
  const list = problems(`${MINIMAL}logging: { level: \${A}\${B} ] }\n`, { A: 'a', B: 'b' });
  assert.match(list[0]!, /^YAML: line 4, column 28: /, list.join('\n'));
  // a reference ends on its line: an unclosed one is text there, reported on its own line
  assert.match(problems(`${MINIMAL}logging: { level: \${A:-a\nb} ] }\n`)[0]!, /^YAML: line 4, column \d+: /);
});

test('${VAR:?message} inside a flow mapping is the unsupported-reference problem, not a YAML cascade', () => {
  const list = problems(`${MINIMAL}console: { token: \${KW_T:?set it}, waitMs: 0 }\nredis: { prefix: \${KW_P-x} }\n`, { KW_T: 'tok', KW_P: 'p' });
  hasProblem(list, 'console.token', /supported reference.*\$\{VAR\} and \$\{VAR:-default\}/);
  hasProblem(list, 'redis.prefix', /supported reference/);
  assert.deepEqual(yamlOnly(list), [], list.join('\n'));
  // nothing else: the value it left out is not also "required"
  assert.equal(list.length, 2, list.join('\n'));
});

test('an unsupported reference naming a key is reported without a YAML error', () => {
  const list = problems(`upstreams: { default: { url: http://127.0.0.1:4000 }, \${MODE:?x}: { url: http://127.0.0.1:4001 } }\n`);
  assert.deepEqual(yamlOnly(list), [], list.join('\n'));
  assert.ok(list.some((p) => /supported reference/.test(p)), list.join('\n'));
});

test('a key named twice is reported beside the schema\'s problems', () => {
  const list = problems(`${MINIMAL}server: { port: 1 }\nserver: { port: 2 }\nlogging: { level: loud }\n`);
  assert.ok(list.some((p) => /^YAML: line 5, column 1: .*twice/.test(p)), list.join('\n'));
  hasProblem(list, 'logging.level');
});

test('an unknown tag is reported beside the schema\'s problems, in the console config too', () => {
  const list = problems(`${MINIMAL}console: { url: http://127.0.0.1:7000, token: !env KEYWARD_SYNC_TOKEN }\nserver: { bogus: 1 }\n`);
  assert.ok(list.some((p) => /^YAML: line 4, column \d+: .*tag/.test(p)), list.join('\n'));
  hasProblem(list, 'server.bogus', /unknown key/);
  assert.throws(
    () => parseConfigText({ text: 'listen: { host: !host x }\nlogging: { level: loud }\n', file: 'c.yaml', schema: consoleConfigSchema, env: {} }),
    (e: unknown) => e instanceof ConfigError && e.problems.some((p) => /^YAML: .*tag/.test(p)) && e.problems.some((p) => p.startsWith('logging.level:')),
  );
});

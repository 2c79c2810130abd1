/**
 * Problems with mapping keys say what was expected (DESIGN section 2): a key the schema
 * refuses names the rule, and an environment reference stands for a key as it does for
 * a value, with no placeholder of the loader's own in any problem.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

test('a routing mode name the schema refuses says what a name must be, not only that the key is invalid', () => {
  const list = problems(`${MINIMAL}  "a b": { url: http://127.0.0.1:4001 }\n`);
  hasProblem(list, 'upstreams.a b', /routing mode/);
  assert.ok(!list.some((p) => /Invalid key in record/.test(p)), list.join('\n'));
});

test('an environment reference may name a key; one that is not set is reported by its name', () => {
  const c = parse('upstreams:\n  ${MODE:-default}: { url: http://127.0.0.1:4000 }\n  ${EXTRA}: { url: http://127.0.0.1:4001 }\n', { EXTRA: 'batch' });
  assert.deepEqual(Object.keys(c.upstreams).sort(), ['batch', 'default']);
  assert.equal(c.upstreams.batch!.url, 'http://127.0.0.1:4001');
  const list = problems(`${MINIMAL}  \${LATER}: { url: http://127.0.0.1:4001 }\n`);
  hasProblem(list, 'upstreams', /environment variable LATER is not set/);
  assert.ok(!list.some((p) => p.includes('__KWENV')), list.join('\n'));
});

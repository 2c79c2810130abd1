/**
 * Versions in the sync protocol (DESIGN section 7) are integers the sidecar sends back as
 * `after=<int>`. One past 2^53 would print as `1e+21` (or lose digits), the console would
 * refuse that cursor with 400 on every poll, and the replica would stay frozen without a
 * snapshot ever being asked for: such a version is refused as bad data where it is read.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseChangeBatch, parseMeta } from '../../src/protocol/records.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';

test('a change batch whose version is past 2^53 is refused; the largest exact one is taken', () => {
  for (const version of [1e21, Number.MAX_SAFE_INTEGER + 1, 2 ** 64]) {
    const r = parseChangeBatch({ version, changes: [] });
    assert.equal(r.ok, false, `version ${version} taken`);
  }
  const top = parseChangeBatch({ version: Number.MAX_SAFE_INTEGER, changes: [] });
  assert.ok(top.ok && top.value.version === Number.MAX_SAFE_INTEGER);
  assert.equal(String(Number.MAX_SAFE_INTEGER), '9007199254740991', 'sent back digit for digit');
});

test('a snapshot whose meta version is past 2^53 is refused whole', () => {
  assert.equal(parseMeta({ type: 'meta', version: 1e21 }).ok, false);
  assert.throws(() => parseSnapshotText('{"type":"meta","version":100000000000000000000}\n'), /line 1/);
  assert.equal(parseSnapshotText(`{"type":"meta","version":${Number.MAX_SAFE_INTEGER}}\n`).version, Number.MAX_SAFE_INTEGER);
});

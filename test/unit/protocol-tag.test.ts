/**
 * The history tag as the protocol reads it (a v1 addition, DESIGN section 7): optional on
 * the snapshot's meta line and on a change batch, any text of 1 to 64 characters, null
 * meaning none; anything else makes the snapshot or the batch invalid.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MAX_TAG_CHARS, parseChangeBatch } from '../../src/protocol/records.js';
import { parseSnapshotText, SnapshotError } from '../../src/protocol/ndjson.js';

const WALLET = '{"type":"wallet","user":"u_1","balance":1}\n';

test('the meta line: a tag is read, and its absence or null is no tag', () => {
  assert.equal(parseSnapshotText(`{"type":"meta","version":3,"tag":"00ff"}\n${WALLET}`).tag, '00ff');
  assert.equal(parseSnapshotText(`{"type":"meta","version":3,"tag":"${'t'.repeat(MAX_TAG_CHARS)}"}\n`).tag, 't'.repeat(MAX_TAG_CHARS));
  assert.equal(parseSnapshotText(`{"type":"meta","version":3}\n${WALLET}`).tag, null);
  assert.equal(parseSnapshotText(`{"type":"meta","version":3,"tag":null}\n`).tag, null);
});

test('the meta line: an empty, overlong or non-string tag is a bad snapshot', () => {
  for (const tag of ['""', `"${'t'.repeat(MAX_TAG_CHARS + 1)}"`, '5', '["a"]']) {
    assert.throws(() => parseSnapshotText(`{"type":"meta","version":3,"tag":${tag}}\n${WALLET}`), (e: unknown) => e instanceof SnapshotError && e.line === 1, tag);
  }
});

test('a change batch: a tag is read, absence or null is no tag, and a malformed one makes the batch invalid', () => {
  const tagged = parseChangeBatch({ version: 4, tag: 'abc', changes: [] });
  assert.ok(tagged.ok);
  assert.deepEqual(tagged.value, { version: 4, tag: 'abc', changes: [] });
  for (const none of [{ version: 4, changes: [] }, { version: 4, tag: null, changes: [] }]) {
    const r = parseChangeBatch(none);
    assert.ok(r.ok);
    assert.equal(r.value.tag, null);
  }
  for (const tag of ['', 'x'.repeat(MAX_TAG_CHARS + 1), 12, {}]) {
    const r = parseChangeBatch({ version: 4, tag, changes: [] });
    assert.ok(!r.ok, JSON.stringify(tag));
    assert.match(r.error, /^tag must be a string of 1 to 64 characters$/);
  }
});

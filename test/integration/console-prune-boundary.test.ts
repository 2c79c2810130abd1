/**
 * The edge of the console's retained change history (DESIGN section 7: 410 means `after`
 * is too old, take a snapshot). Once the feed has pruned through version P, a cursor at P
 * still needs only changes from P + 1 on, which are kept: it is answered with them. A
 * cursor at P - 1 needs change P, which is gone: it is told to take a snapshot.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { startConsoleFixture, syncGet, type ConsoleFixture } from '../helpers/console-fixture.js';

const RETAIN = 5;
let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture({ overrides: { sync: { retainChanges: RETAIN } } });
});
after(async () => {
  await fx.close();
});

/** Creates projects one write each; returns the version each one's change was given. */
async function createProjects(ids: string[]): Promise<Map<number, string>> {
  const at = new Map<number, string>();
  for (const id of ids) {
    assert.equal((await fx.api('POST', '/admin/v1/projects', { body: { id } })).status, 201);
    at.set(fx.console.store.feed.version(), id);
  }
  return at;
}

/** The project ids a changes answer for `after` carries, or its 410 error code. */
async function answerFor(after: number, tag?: string): Promise<{ status: number; version: number; projects?: string[]; code?: string }> {
  const res = await syncGet(fx, `/sync/v1/changes?after=${after}${tag === undefined ? '' : `&tag=${tag}`}`);
  const body = JSON.parse(res.text) as { version: number; changes?: { type: string; id?: string }[]; error?: { code: string } };
  if (res.status !== 200) return { status: res.status, version: body.version, code: body.error!.code };
  return { status: 200, version: body.version, projects: body.changes!.filter((c) => c.type === 'project').map((c) => c.id!) };
}

test('a cursor exactly at the pruned version gets every retained change; one version older is 410', async () => {
  const at = await createProjects(Array.from({ length: 3 * RETAIN }, (_, i) => `p_edge${i}`));
  const feed = fx.console.store.feed;
  const version = feed.version();
  const pruned = feed.prunedThrough();
  assert.ok(pruned > 0, 'the feed has pruned');
  // The kept history begins right after the pruned version: nothing at or below it, nothing missing above it.
  const oldest = fx.console.store.db.prepare('SELECT MIN(version) FROM changes').pluck().get();
  assert.equal(oldest, pruned + 1);
  const { tag } = parseSnapshotText((await syncGet(fx, '/sync/v1/snapshot')).text);
  assert.ok(tag);

  const newerThan = (cursor: number) => [...at].filter(([v]) => v > cursor).map(([, id]) => id);
  assert.ok(newerThan(pruned).length >= 2, 'the cursors at and above the edge see different changes');
  for (const t of [undefined, tag]) {
    const label = t === undefined ? 'untagged' : 'tagged';
    assert.deepEqual(await answerFor(pruned - 1, t), { status: 410, version, code: 'cursor_gone' }, `${label}: one below the edge`);
    assert.deepEqual(await answerFor(pruned, t), { status: 200, version, projects: newerThan(pruned) }, `${label}: at the edge`);
    assert.deepEqual(await answerFor(pruned + 1, t), { status: 200, version, projects: newerThan(pruned + 1) }, `${label}: one above the edge`);
  }
});

/**
 * The config file's own directory replaced by renames (`mv conf conf.old && mv conf.new
 * conf`, a deploy without symlinks): the replacement is taken up, and so is every later
 * write of the file in the new directory (DESIGN section 12: a write makes `serve` read the
 * file again within a second). A watch left on the old directory would see nothing more.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { configMetrics, scrape } from '../helpers/instance.js';
import { chatUpstream, importKeys, nextReload } from '../helpers/reload.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { configHash } from '../../src/config/file.js';

let dir: string;
let up: FakeUpstream;
let kw: SidecarProcess;
const yaml = (level: string) => `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${join(dir, 'replica.sqlite')} }\nlogging: { level: ${level} }\n`;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-dir-'));
  up = await startFakeUpstream(chatUpstream('A'));
  await importKeys(dir, join(dir, 'replica.sqlite'), { k: { secret: `sk-dir-${randomBytes(8).toString('hex')}` } });
  mkdirSync(join(dir, 'conf'));
  writeFileSync(join(dir, 'conf', 'keyward.yaml'), yaml('info'));
  kw = await spawnSidecar({ dir, name: 'dir', file: join(dir, 'conf', 'keyward.yaml') });
});
after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  rmSync(dir, { recursive: true, force: true });
});

test('after the directory is replaced by renames, a write of the file in the new directory is taken up within a second', async () => {
  let before = configMetrics(await scrape(kw));
  mkdirSync(join(dir, 'conf.new'));
  writeFileSync(join(dir, 'conf.new', 'keyward.yaml'), yaml('debug'));
  renameSync(join(dir, 'conf'), join(dir, 'conf.old'));
  renameSync(join(dir, 'conf.new'), join(dir, 'conf'));
  before = (await nextReload(kw, before, 'ok', 3_000)).metrics;
  assert.deepEqual(before.hashes, [configHash(yaml('debug'))]);

  // The old directory is still there (kept for a rollback): the watch must not stay on it.
  writeFileSync(join(dir, 'conf', 'keyward.yaml'), yaml('warn'));
  const { metrics, ms } = await nextReload(kw, before, 'ok', 3_000);
  assert.ok(ms < 1000, `reloaded after ${ms} ms`);
  assert.deepEqual(metrics.hashes, [configHash(yaml('warn'))]);
});

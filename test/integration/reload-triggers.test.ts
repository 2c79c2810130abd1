/**
 * What makes a real `keyward serve` reload, and what a reload leaves alone: a write in
 * place, a file renamed over the config, a Kubernetes ConfigMap volume's `..data`
 * symlink swap and a swap of a link that a link on the path points to are each taken up
 * within a second (read off the reload metric), and a
 * stream of several seconds in flight across a SIGHUP and a ConfigMap swap arrives whole
 * while the next request already goes where the new config says.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessOf, configMetrics, scrape } from '../helpers/instance.js';
import { ConfigMapVolume } from '../helpers/configmap.js';
import { chatUpstream, importKeys, nextReload, SLOW_PAUSE_MS, SLOW_PIECES } from '../helpers/reload.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { configHash } from '../../src/config/file.js';

const secret = `sk-stream-${randomBytes(8).toString('hex')}`;

let dir: string;
let replica: string;
let upA: FakeUpstream;
let upB: FakeUpstream;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-triggers-'));
  replica = join(dir, 'replica.sqlite');
  upA = await startFakeUpstream(chatUpstream('A'));
  upB = await startFakeUpstream(chatUpstream('B'));
  await importKeys(dir, replica, { k_stream: { secret } });
});

after(async () => {
  await upA?.close();
  await upB?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A config that forwards to `upstream`; `level` tells revisions apart. */
const yaml = (upstream: string, level = 'info') =>
  `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${upstream} } }\nreplica: { path: ${replica} }\nlogging: { level: ${level} }\n`;

const client = (kw: SidecarProcess) => new OpenAI({ apiKey: secret, baseURL: `${kw.url}/v1`, maxRetries: 0, timeout: 30_000 });
const answer = async (kw: SidecarProcess) => (await client(kw).chat.completions.create({ model: 'quick', messages: [{ role: 'user', content: 'hi' }] })).choices[0]!.message.content;

/** Changes the file with `change` and checks the process has taken the new content up within a second. */
async function reloadsWithinASecond(kw: SidecarProcess, content: string, change: () => void): Promise<void> {
  const before = configMetrics(await scrape(kw));
  change();
  const { metrics, ms } = await nextReload(kw, before, 'ok', 3_000);
  assert.ok(ms < 1000, `reloaded after ${ms} ms`);
  assert.deepEqual(metrics.hashes, [configHash(content)]);
  assert.equal(metrics.ok, before.ok + 1, 'one reload per change');
}

describe('triggers', () => {
  let plain: SidecarProcess;
  let mapped: SidecarProcess;
  let volume: ConfigMapVolume;
  const plainFile = () => join(dir, 'plain.yaml');

  before(async () => {
    plain = await spawnSidecar({ dir, name: 'plain', yaml: yaml(upA.url) });
    volume = new ConfigMapVolume(join(dir, 'volume'));
    volume.publish(yaml(upA.url));
    mapped = await spawnSidecar({ dir, name: 'mapped', file: volume.file });
  });
  after(async () => {
    await plain?.stop('SIGKILL');
    await mapped?.stop('SIGKILL');
  });

  test('a symlinked directory on the path, swapped atomically for a link to a new release, is taken up within a second', async () => {
    // conf/current -> release-1 holds the file; the deploy points current at release-2 with a rename.
    const conf = join(dir, 'conf');
    mkdirSync(join(conf, 'release-1'), { recursive: true });
    writeFileSync(join(conf, 'release-1', 'keyward.yaml'), yaml(upA.url, 'info'));
    symlinkSync('release-1', join(conf, 'current'));
    const released = await spawnSidecar({ dir, name: 'released', file: join(conf, 'current', 'keyward.yaml') });
    try {
      const next = yaml(upB.url, 'warn');
      await reloadsWithinASecond(released, next, () => {
        mkdirSync(join(conf, 'release-2'));
        writeFileSync(join(conf, 'release-2', 'keyward.yaml'), next);
        symlinkSync('release-2', join(conf, 'current.next'));
        renameSync(join(conf, 'current.next'), join(conf, 'current'));
      });
      assert.equal(await answer(released), 'B');
    } finally {
      await released.stop('SIGKILL');
    }
  });

  test('a link a link on the path points to, swapped for a new release, is taken up within a second', async () => {
    // etc/keyward -> ../deploy/current -> releases/r1: the deploy swaps only deploy/current.
    const root = join(dir, 'chain');
    mkdirSync(join(root, 'etc'), { recursive: true });
    mkdirSync(join(root, 'deploy', 'releases', 'r1'), { recursive: true });
    writeFileSync(join(root, 'deploy', 'releases', 'r1', 'keyward.yaml'), yaml(upA.url, 'info'));
    symlinkSync('releases/r1', join(root, 'deploy', 'current'));
    symlinkSync('../deploy/current', join(root, 'etc', 'keyward'));
    const chained = await spawnSidecar({ dir, name: 'chained', file: join(root, 'etc', 'keyward', 'keyward.yaml') });
    try {
      const next = yaml(upB.url, 'warn');
      await reloadsWithinASecond(chained, next, () => {
        mkdirSync(join(root, 'deploy', 'releases', 'r2'));
        writeFileSync(join(root, 'deploy', 'releases', 'r2', 'keyward.yaml'), next);
        symlinkSync('releases/r2', join(root, 'deploy', 'current.next'));
        renameSync(join(root, 'deploy', 'current.next'), join(root, 'deploy', 'current'));
      });
      assert.equal(await answer(chained), 'B');
    } finally {
      await chained.stop('SIGKILL');
    }
  });

  test('a write in place is taken up within a second', async () => {
    const next = yaml(upB.url, 'debug');
    await reloadsWithinASecond(plain, next, () => writeFileSync(plainFile(), next));
    assert.equal(await answer(plain), 'B');
  });

  test('a new file renamed over the config is taken up within a second', async () => {
    const next = yaml(upA.url, 'warn');
    await reloadsWithinASecond(plain, next, () => {
      writeFileSync(join(dir, '.plain.yaml.tmp'), next);
      renameSync(join(dir, '.plain.yaml.tmp'), plainFile());
    });
    assert.equal(await answer(plain), 'A');
  });

  test('a ConfigMap volume\'s ..data symlink swap is taken up within a second', async () => {
    const next = yaml(upB.url, 'debug');
    await reloadsWithinASecond(mapped, next, () => volume.publish(next));
    assert.equal(await answer(mapped), 'B');
  });
});

describe('a stream in flight across reloads', () => {
  let kw: SidecarProcess;
  let volume: ConfigMapVolume;

  before(async () => {
    volume = new ConfigMapVolume(join(dir, 'stream-volume'));
    volume.publish(yaml(upA.url));
    kw = await spawnSidecar({ dir, name: 'stream', file: volume.file });
  });
  after(() => kw?.stop('SIGKILL'));

  test('arrives whole across a SIGHUP and a ..data swap, while the next request goes to the new upstream', async () => {
    const receivedByA = upA.received.length;
    const started = Date.now();
    const stream = await client(kw).chat.completions.create({ model: 'slow', messages: [{ role: 'user', content: 'tell me' }], stream: true, stream_options: { include_usage: true } }).withResponse();
    const requestId = stream.response.headers.get('x-request-id')!;
    const chunks = stream.data[Symbol.asyncIterator]();
    const pieces: string[] = [];
    const first = await chunks.next();
    pieces.push(first.value!.choices[0]?.delta.content ?? '');

    // SIGHUP with the file unchanged: a reload all the same.
    let before = configMetrics(await scrape(kw));
    kw.child.kill('SIGHUP');
    before = (await nextReload(kw, before, 'ok')).metrics;
    // The ConfigMap edit: the default upstream is now B, and access lines are off (warn).
    const next = yaml(upB.url, 'warn');
    volume.publish(next);
    const swapped = await nextReload(kw, before, 'ok');
    assert.deepEqual(swapped.metrics.hashes, [configHash(next)]);
    assert.ok(Date.now() - started < SLOW_PIECES * SLOW_PAUSE_MS - 1000, 'both reloads happened while the stream was in flight');
    const after = await client(kw).chat.completions.create({ model: 'quick', messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    assert.equal(after.data.choices[0]!.message.content, 'B', 'a request that arrives after the swap goes to the new upstream');

    let usage: OpenAI.CompletionUsage | null | undefined;
    for (let c = await chunks.next(); !c.done; c = await chunks.next()) {
      if (c.value.choices[0]?.delta.content) pieces.push(c.value.choices[0].delta.content);
      if (c.value.usage) usage = c.value.usage;
    }
    assert.ok(Date.now() - started >= 5000, 'the stream lasted at least 5 s');
    assert.deepEqual(pieces, Array.from({ length: SLOW_PIECES }, (_, i) => `A${i} `), 'every piece, from the upstream it started on');
    assert.equal(usage?.completion_tokens, SLOW_PIECES);
    assert.equal(upA.received.length - receivedByA, 1, 'A served the stream alone');
    // The stream finished under the config it started with, log level included.
    const [line] = await accessOf(kw, [requestId]);
    assert.equal(line!.status, 200);
    const afterId = after.response.headers.get('x-request-id')!;
    assert.ok(!kw.lines.some((l) => l.includes(afterId)), 'the request that arrived under warn wrote no access line');
  });
});

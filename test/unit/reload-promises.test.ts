/**
 * Live-reload promises across reloads, links and workers: a restart-only change stays
 * pending (and named) across later reloads until the file goes back, the watch follows a
 * config file that is a symlink into another directory and a release directory swapped in
 * under it, content that did not change is not a reload, and a `--workers` reload counts
 * as done only once every live worker confirmed it.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Worker } from 'node:cluster';
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { ConfigReloader } from '../../src/app/reload.js';
import { WorkerConfigs } from '../../src/app/worker-configs.js';
import { configHash, loadConfig } from '../../src/config/file.js';
import type { Config } from '../../src/config/schema.js';
import { ConfigWatch } from '../../src/config/watch.js';
import { recordingLog } from '../helpers/log-capture.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-promises-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const yaml = (o: { port?: number; level?: string } = {}) =>
  `server: { port: ${o.port ?? 8080} }\nupstreams: { default: { url: http://127.0.0.1:4000 } }\nlogging: { level: ${o.level ?? 'info'} }\n`;

test('a restart-only change stays pending and named across later reloads, and clears when the file goes back', async () => {
  const file = join(dir, 'pending.yaml');
  writeFileSync(file, yaml());
  const applied: Config[] = [];
  const { lines, log } = recordingLog();
  const reloader = new ConfigReloader({ file, loaded: loadConfig(file), log, apply: async (c) => void applied.push(c) });
  const warnings = () => lines.filter((l) => l.level === 'warn').map((l) => l.fields.needs_restart);

  writeFileSync(file, yaml({ port: 9999 }));
  await reloader.reload('SIGHUP');
  assert.equal(reloader.status().restartPending, 1);

  // Another reload of the same port and a reloadable change: the process still listens on 8080.
  writeFileSync(file, yaml({ port: 9999, level: 'debug' }));
  await reloader.reload('SIGHUP');
  assert.equal(applied[1]!.server.port, 8080, 'apply is given the running port, not the file\'s');
  assert.equal(applied[1]!.logging.level, 'debug');
  assert.equal(reloader.status().restartPending, 1, 'the port still waits for a restart');
  assert.deepEqual(warnings(), [['server.port'], ['server.port']], 'each reload names it again');

  // The file goes back to the running port: nothing waits any more.
  writeFileSync(file, yaml({ level: 'debug' }));
  await reloader.reload('SIGHUP');
  assert.equal(reloader.status().restartPending, 0);
  assert.equal(warnings().length, 2, 'no warning for a file the process runs whole');
  assert.deepEqual(reloader.status().reloads, { ok: 3, error: 0 });
});

/**
 * A watch started on content already read (the constructor's own read finds nothing new),
 * its changes counted; `changed()` resolves at the next one and fails after 3 s.
 */
function watchFrom(file: string, content: string) {
  let count = 0;
  let wake: (() => void) | null = null;
  const watch = new ConfigWatch({
    file, hash: configHash(content), log: recordingLog().log,
    onChange: () => {
      count++;
      wake?.();
    },
  });
  const changed = () =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no change reported within 3 s')), 3_000);
      wake = () => {
        clearTimeout(timer);
        wake = null;
        resolve();
      };
    });
  return { watch, changed, count: () => count };
}

test('a config file that is a symlink into another directory is watched where its content lives: a write in place there is a change', async () => {
  const real = join(dir, 'srv-conf');
  const etc = join(dir, 'etc');
  mkdirSync(real);
  mkdirSync(etc);
  writeFileSync(join(real, 'keyward.yaml'), yaml());
  symlinkSync(join(real, 'keyward.yaml'), join(etc, 'keyward.yaml'));
  const w = watchFrom(join(etc, 'keyward.yaml'), yaml());
  try {
    const seen = w.changed();
    writeFileSync(join(real, 'keyward.yaml'), yaml({ level: 'debug' }));
    await seen;
    assert.equal(w.count(), 1);
  } finally {
    w.watch.close();
  }
});

test('after a release directory is swapped in, a write in place in the new release is a change too', async () => {
  const conf = join(dir, 'conf');
  mkdirSync(join(conf, 'release-1'), { recursive: true });
  writeFileSync(join(conf, 'release-1', 'keyward.yaml'), yaml());
  symlinkSync('release-1', join(conf, 'current'));
  const w = watchFrom(join(conf, 'current', 'keyward.yaml'), yaml());
  try {
    let seen = w.changed();
    mkdirSync(join(conf, 'release-2'));
    writeFileSync(join(conf, 'release-2', 'keyward.yaml'), yaml({ level: 'warn' }));
    symlinkSync('release-2', join(conf, 'current.next'));
    renameSync(join(conf, 'current.next'), join(conf, 'current'));
    await seen;
    seen = w.changed();
    writeFileSync(join(conf, 'release-2', 'keyward.yaml'), yaml({ level: 'error' }));
    await seen;
    assert.equal(w.count(), 2);
  } finally {
    w.watch.close();
  }
});

test('a link with an absolute target on the path: a swap of the link it leads to is a change', async () => {
  // etc/keyward -> <abs>/deploy/current -> releases/r1: the deploy swaps only deploy/current.
  const root = join(dir, 'absolute');
  mkdirSync(join(root, 'etc'), { recursive: true });
  mkdirSync(join(root, 'deploy', 'releases', 'r1'), { recursive: true });
  writeFileSync(join(root, 'deploy', 'releases', 'r1', 'keyward.yaml'), yaml());
  symlinkSync('releases/r1', join(root, 'deploy', 'current'));
  symlinkSync(join(root, 'deploy', 'current'), join(root, 'etc', 'keyward'));
  const w = watchFrom(join(root, 'etc', 'keyward', 'keyward.yaml'), yaml());
  try {
    const seen = w.changed();
    mkdirSync(join(root, 'deploy', 'releases', 'r2'));
    writeFileSync(join(root, 'deploy', 'releases', 'r2', 'keyward.yaml'), yaml({ level: 'warn' }));
    symlinkSync('releases/r2', join(root, 'deploy', 'current.next'));
    renameSync(join(root, 'deploy', 'current.next'), join(root, 'deploy', 'current'));
    await seen;
    assert.equal(w.count(), 1);
  } finally {
    w.watch.close();
  }
});

test('events that leave the content as it was (the same bytes written again, another file in the directory) are not a change', async () => {
  const sub = join(dir, 'quiet');
  mkdirSync(sub);
  const file = join(sub, 'keyward.yaml');
  writeFileSync(file, yaml());
  const w = watchFrom(file, yaml());
  try {
    writeFileSync(file, yaml());
    writeFileSync(join(sub, 'replica.sqlite-wal'), 'x');
    // Nothing is reported for these, so there is no event to await: wait past the longest
    // burst (500 ms) and the quiet time after it before looking.
    await delay(900);
    assert.equal(w.count(), 0, 'no change reported for unchanged content');
    const seen = w.changed();
    writeFileSync(file, yaml({ level: 'debug' }));
    await seen;
    assert.equal(w.count(), 1);
  } finally {
    w.watch.close();
  }
});

/** A worker as WorkerConfigs sees one: an id, a channel that records what it is sent. */
function fakeWorker(id: number) {
  const sent: { generation: number }[] = [];
  const w = { id, isConnected: () => true, send: (msg: { generation: number }, cb: (err: Error | null) => void) => (sent.push(msg), cb(null), true) };
  return { worker: w as unknown as Worker, sent };
}

/** Resolves with `p`'s value, or fails when it takes longer than `ms` (a wait that should already be over). */
const within = <T>(p: Promise<T>, ms: number, what: string): Promise<T> =>
  Promise.race([p, delay(ms, undefined, { ref: false }).then(() => assert.fail(`${what}: still waiting after ${ms} ms`))]);

test('with workers, a reload is done only once every live worker confirmed it; a worker that goes is not waited for', async () => {
  const config = loadConfig((writeFileSync(join(dir, 'w.yaml'), yaml()), join(dir, 'w.yaml'))).config;
  const a = fakeWorker(1);
  const b = fakeWorker(2);
  let live = [a.worker, b.worker];
  const configs = new WorkerConfigs(config, { workers: () => live, log: recordingLog().log });

  let done: number[] | null = null;
  const debug = { ...config, logging: { level: 'debug' as const } };
  const first = configs.distribute(debug, 5_000).then((ids) => (done = ids));
  assert.deepEqual([a.sent.at(-1)?.generation, b.sent.at(-1)?.generation], [2, 2]);
  configs.confirmed(a.worker, 2);
  configs.confirmed(a.worker, 1); // a late answer to the config it was sent at start
  await Promise.resolve();
  assert.equal(done, null, 'not done while worker 2 has not confirmed');
  configs.confirmed(b.worker, 2);
  assert.deepEqual(await within(first, 1_000, 'both confirmed'), []);
  assert.equal(configs.current, debug, 'a worker started now is handed the reloaded config');

  const warn = { ...config, logging: { level: 'warn' as const } };
  const second = configs.distribute(warn, 5_000);
  configs.confirmed(a.worker, 3);
  live = [a.worker];
  configs.gone(b.worker);
  assert.deepEqual(await within(second, 1_000, 'the one live worker confirmed'), []);
});

test('the reload log lines carry what operations.md lists: trigger, hash and changed names; trigger, every problem and the hash in force', async () => {
  const file = join(dir, 'lines.yaml');
  writeFileSync(file, yaml());
  const { lines, log } = recordingLog();
  const reloader = new ConfigReloader({ file, loaded: loadConfig(file), log, apply: async () => {} });
  const before = reloader.status().hash;
  writeFileSync(file, 'server: { port: 8080, colour: blue }\nupstreams: { default: { url: ftp://x } }\n');
  await reloader.reload('file');
  const refused = lines.find((l) => l.level === 'error')!;
  assert.equal(refused.fields.trigger, 'file');
  assert.equal(refused.fields.hash_in_force, before);
  assert.equal((refused.fields.problems as string[]).length, 2, String(refused.fields.problems));
  assert.match(refused.msg, /^config reload refused, .*server\.colour: unknown key.*; .*upstreams\.default\.url/);
  writeFileSync(file, yaml({ level: 'warn' }));
  await reloader.reload('SIGHUP');
  const reloaded = lines.find((l) => l.msg === 'config reloaded')!;
  assert.deepEqual(reloaded.fields, { trigger: 'SIGHUP', hash: configHash(yaml({ level: 'warn' })), changed: ['logging.level'] });
});

// Last in this file: the SIGHUP it emits is also noted by the listener that keeps SIGHUP from ending the process.
test('once reloading is closed (serve draining), a SIGHUP reloads nothing', async () => {
  const file = join(dir, 'closed.yaml');
  writeFileSync(file, yaml());
  const applied: Config[] = [];
  const reloader = new ConfigReloader({ file, loaded: loadConfig(file), log: recordingLog().log, apply: async (c) => void applied.push(c) });
  reloader.start();
  reloader.close();
  writeFileSync(file, yaml({ level: 'debug' }));
  // A listener would read the file and call apply before emit returns (the read is synchronous).
  process.emit('SIGHUP', 'SIGHUP');
  await Promise.resolve();
  assert.deepEqual(applied, []);
  assert.deepEqual(reloader.status().reloads, { ok: 0, error: 0 });
});

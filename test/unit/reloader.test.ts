/**
 * The reloader on a real file, with the function that puts a config in force recording
 * what it is given: reloads run one at a time and triggers that come during one share one
 * more read; a config that cannot be put in force is an error that keeps the hash in force;
 * restart-only settings reach `apply` at their running values.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigReloader, holdSighup } from '../../src/app/reload.js';
import { configHash, loadConfig } from '../../src/config/file.js';
import type { Config } from '../../src/config/schema.js';
import { recordingLog } from '../helpers/log-capture.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reloader-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const yaml = (o: { port?: number; level?: string; url?: string } = {}) =>
  `server: { port: ${o.port ?? 8080} }\nupstreams: { default: { url: ${o.url ?? 'http://127.0.0.1:4000'} } }\nlogging: { level: ${o.level ?? 'info'} }\n`;

test('triggers during a reload share one more read; each read puts the file as it then is in force', async () => {
  const file = join(dir, 'a.yaml');
  writeFileSync(file, yaml());
  const applied: Config[] = [];
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const { log } = recordingLog();
  const reloader = new ConfigReloader({
    file, loaded: loadConfig(file), log,
    apply: async (c) => {
      applied.push(c);
      if (applied.length === 1) await gate; // the first reload is still applying...
    },
  });
  writeFileSync(file, yaml({ level: 'debug' }));
  const first = reloader.reload('SIGHUP');
  // ...while the file changes twice and three more triggers arrive
  writeFileSync(file, yaml({ level: 'warn' }));
  const second = reloader.reload('file');
  writeFileSync(file, yaml({ level: 'error' }));
  const third = reloader.reload('SIGHUP');
  assert.equal(second, third, 'one queued read answers every trigger that came meanwhile');
  release();
  await Promise.all([first, second, third]);
  assert.deepEqual(applied.map((c) => c.logging.level), ['debug', 'error']);
  assert.deepEqual(reloader.status().reloads, { ok: 2, error: 0 });
  assert.equal(reloader.status().hash, configHash(yaml({ level: 'error' })));
});

test('restart-only settings reach apply at their running values; a failed apply keeps the hash in force', async () => {
  const file = join(dir, 'b.yaml');
  writeFileSync(file, yaml());
  const start = loadConfig(file);
  const applied: Config[] = [];
  let fail = false;
  const { lines, log } = recordingLog();
  const reloader = new ConfigReloader({
    file, loaded: start, log, now: () => 42_000,
    apply: async (c) => {
      if (fail) throw new Error('the tracer could not be loaded');
      applied.push(c);
    },
  });
  writeFileSync(file, yaml({ port: 9999, url: 'http://127.0.0.1:4001' }));
  await reloader.reload('file');
  assert.equal(applied[0]!.server.port, 8080, 'the running port');
  assert.equal(applied[0]!.upstreams.default!.url, 'http://127.0.0.1:4001');
  assert.deepEqual(lines.filter((l) => l.level === 'warn').map((l) => l.fields.needs_restart), [['server.port']]);
  assert.deepEqual(lines.find((l) => l.msg === 'config reloaded')?.fields.changed, ['upstreams.default.url']);
  const hash = reloader.status().hash;
  assert.equal(hash, configHash(yaml({ port: 9999, url: 'http://127.0.0.1:4001' })));
  assert.equal(reloader.status().restartPending, 1, 'the file in force has one setting waiting for a restart');

  fail = true;
  writeFileSync(file, yaml({ level: 'debug' }));
  await reloader.reload('SIGHUP');
  assert.deepEqual(reloader.status(), { reloads: { ok: 1, error: 1 }, lastSuccessAt: 42_000, hash, restartPending: 1 });
  assert.deepEqual(lines.filter((l) => l.level === 'error').map((l) => l.fields.problems), [['the tracer could not be loaded']]);
});

/** A reloader whose `apply` hands each config it puts in force to `next()`'s promise. */
function watchedReloader(file: string) {
  const applied: Config[] = [];
  let wake: (() => void) | null = null;
  const { log } = recordingLog();
  const reloader = new ConfigReloader({
    file, loaded: loadConfig(file), log,
    apply: async (c) => {
      applied.push(c);
      wake?.();
    },
  });
  // Bounded: a reload that never comes fails here, not at the suite's timeout.
  const next = () =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no reload applied within 5 s')), 5_000);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  return { reloader, applied, next };
}

test('a SIGHUP that comes while serve starts (before reloading starts) is answered once reloading starts', async () => {
  const file = join(dir, 'c.yaml');
  writeFileSync(file, yaml());
  holdSighup();
  const { reloader, applied, next } = watchedReloader(file);
  writeFileSync(file, yaml({ level: 'warn' }));
  process.emit('SIGHUP', 'SIGHUP');
  assert.equal(applied.length, 0, 'nothing reloads before reloading starts');
  const applying = next();
  reloader.start();
  await applying;
  reloader.close();
  assert.deepEqual(applied.map((c) => c.logging.level), ['warn']);
  assert.deepEqual(reloader.status().reloads, { ok: 1, error: 0 });
});

test('a SIGHUP the entry script held while the modules loaded is answered once reloading starts', async () => {
  const file = join(dir, 'e.yaml');
  writeFileSync(file, yaml());
  // what bin/keyward.mjs leaves for `serve`: its listener, which saw one SIGHUP
  const early = { held: true, listener: () => undefined };
  (globalThis as Record<symbol, unknown>)[Symbol.for('keyward.earlySighup')] = early;
  process.on('SIGHUP', early.listener);
  holdSighup();
  assert.ok(!process.listeners('SIGHUP').includes(early.listener), 'the entry script\'s listener is taken over');
  const { reloader, applied, next } = watchedReloader(file);
  // the file as it was read: only the held SIGHUP makes a reload
  const applying = next();
  reloader.start();
  await applying;
  reloader.close();
  assert.equal(applied.length, 1);
  assert.deepEqual(reloader.status().reloads, { ok: 1, error: 0 });
});

test('a file changed after it was read and before reloading starts is read again once it starts', async () => {
  const file = join(dir, 'd.yaml');
  writeFileSync(file, yaml());
  const { reloader, applied, next } = watchedReloader(file);
  writeFileSync(file, yaml({ level: 'debug' }));
  const applying = next();
  reloader.start();
  await applying;
  reloader.close();
  assert.deepEqual(applied.map((c) => c.logging.level), ['debug']);
});

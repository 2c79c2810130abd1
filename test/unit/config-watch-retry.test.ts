/**
 * The config file's directory replaced by renames with a gap between them (`mv conf
 * conf.old`, then a deploy tool's copy, then `mv conf.new conf`): while nothing stands at
 * the path the directory cannot be watched, and the watch is tried again until it can be,
 * so the new content is still taken up without a SIGHUP (DESIGN section 12). A lost watch
 * is warned of once, and its return logged.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { configHash } from '../../src/config/file.js';
import { ConfigWatch } from '../../src/config/watch.js';
import type { LogSink } from '../../src/log.js';
import { recordingLog, type LoggedLine } from '../helpers/log-capture.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-watch-retry-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const yaml = (level: string) => `server: { port: 8080 }\nupstreams: { default: { url: http://127.0.0.1:4000 } }\nlogging: { level: ${level} }\n`;

const readable = (file: string): string | null => {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return null;
  }
};

/** Resolves at the first logged line `pick` accepts; fails after 5 s. */
function logged(lines: LoggedLine[], log: LogSink, pick: (l: LoggedLine) => boolean): { log: LogSink; seen: Promise<void> } {
  let wake: () => void = () => {};
  const seen = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('not logged within 5 s')), 5_000);
    wake = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  const watched = (level: keyof LogSink): LogSink[keyof LogSink] => (fields, msg) => {
    log[level](fields, msg);
    if (pick(lines.at(-1)!)) wake();
  };
  return { log: { debug: watched('debug'), info: watched('info'), warn: watched('warn'), error: watched('error') }, seen };
}

test('a config directory missing between two renames is watched again once one stands there, and the new content is a change', async () => {
  const conf = join(dir, 'conf');
  mkdirSync(conf);
  writeFileSync(join(conf, 'keyward.yaml'), yaml('info'));
  const { lines, log } = recordingLog();
  const lost = logged(lines, log, (l) => l.level === 'warn');
  // The file's going away is a change too (a reload that fails and keeps the config): wait for the content.
  let waiting: { content: string; resolve: () => void } | null = null;
  const changeTo = (content: string) =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the content was not taken up within 5 s')), 5_000);
      waiting = { content, resolve: () => (clearTimeout(timer), resolve()) };
    });
  const watch = new ConfigWatch({
    file: join(conf, 'keyward.yaml'), hash: configHash(yaml('info')), log: lost.log, retryMs: 50,
    onChange: () => {
      if (waiting !== null && readable(join(conf, 'keyward.yaml')) === waiting.content) waiting.resolve();
    },
  });
  try {
    renameSync(conf, join(dir, 'conf.old'));
    await lost.seen;
    assert.match(lines.find((l) => l.level === 'warn')!.msg, /trying again/);

    mkdirSync(join(dir, 'conf.new'));
    writeFileSync(join(dir, 'conf.new', 'keyward.yaml'), yaml('debug'));
    const debug = changeTo(yaml('debug'));
    renameSync(join(dir, 'conf.new'), conf);
    await debug;
    assert.equal(lines.filter((l) => l.level === 'warn').length, 1, 'the loss is warned of once, not at every try');
    assert.ok(lines.some((l) => l.level === 'info' && /watched again/.test(l.msg)));

    // Watched for good: a later write in place is a change too.
    const warn = changeTo(yaml('warn'));
    writeFileSync(join(conf, 'keyward.yaml'), yaml('warn'));
    await warn;
  } finally {
    watch.close();
  }
});

/**
 * `keyward serve --workers 2` where it meets the rest of a deployment: usage handed to a
 * real console from both workers, a replica file damaged under running workers, a worker
 * that cannot start again, and a fleet of workers without Redis. Real primary and worker
 * processes, the real Redis.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, fstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, renameSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import Database from 'better-sqlite3';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { KEYWARD_ARGS, spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { importReplica, untilLogged } from '../helpers/instance.js';
import { bearer, send } from '../helpers/http.js';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startConsoleFixture } from '../helpers/console-fixture.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const REDIS = TEST_REDIS_URL;
const prefix = `kwtr${randomBytes(4).toString('hex')}`;
let up: FakeUpstream;

before(async () => {
  up = await startFakeUpstream(echoJson);
});

after(async () => {
  await up?.close();
  const redis = new Redis(REDIS);
  const keys = (await Promise.all(['c', 'd', 'l'].map((s) => redis.keys(`{${prefix}${s}:*`)))).flat();
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
});

describe('serve --workers 2: usage to the console, a damaged replica, a worker that cannot start', () => {
  test('usage from both workers reaches the console once each, the last of it on SIGTERM', async () => {
    const fx = await startConsoleFixture();
    const upUsage = await startFakeUpstream((_req, res) => {
      const text = JSON.stringify({ id: 'x', usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 } });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-console-'));
    let proc: SidecarProcess | null = null;
    try {
      await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_w', budget: 100 } });
      const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_w' } })).body as { key: { id: string }; secret: string };
      const yaml =
        `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${upUsage.url} } }\nreplica: { path: ${join(sub, 'replica.sqlite')} }\n` +
        `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }\nredis: { url: ${REDIS}, prefix: ${prefix}c, timeoutMs: 1000 }\nlogging: { level: info }\n`;
      proc = await spawnSidecar({ dir: sub, name: 'workers-console', yaml, args: ['--workers', '2'] });
      const admin = `http://127.0.0.1:${proc.adminPort}`;
      // ready once the primary's first sync has written the replica file
      while ((await send(admin, { path: '/readyz' })).status !== 200);
      const p = proc;
      const rs = await Promise.all(
        Array.from({ length: 6 }, () =>
          send(p.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(created.secret), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [] }) }),
        ),
      );
      assert.deepEqual(rs.map((r) => r.status), Array(6).fill(200));
      assert.equal(await proc.stop('SIGTERM'), 0);
      const workers = new Set(proc.lines.map((l) => JSON.parse(l) as { msg?: string; worker?: number }).filter((l) => l.msg === 'request').map((l) => l.worker));
      assert.equal(workers.size, 2, 'both workers served');
      // 1000 input tokens at 2.5/M and 100 output at 10/M per request: each event charged once
      const spent = (await fx.api('GET', `/admin/v1/keys/${created.key.id}`)).body.key.spent as number;
      assert.equal(+spent.toFixed(9), +(6 * 0.0035).toFixed(9));
    } finally {
      await proc?.stop('SIGKILL');
      await upUsage.close();
      await fx.close();
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('damage a worker meets in the replica file: the primary moves the file aside and fills a new one from the console', { timeout: 60_000 }, async () => {
    const fx = await startConsoleFixture();
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-damage-'));
    const path = join(sub, 'replica.sqlite');
    let proc: SidecarProcess | null = null;
    try {
      await fx.api('POST', '/admin/v1/wallets/u_d/credit', { body: { amount: 100 } });
      const secrets: string[] = [];
      for (let i = 0; i < 300; i++) secrets.push(((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'u_d' } })).body as { secret: string }).secret);
      const yaml =
        `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${path} }\n` +
        `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }\nredis: { url: ${REDIS}, prefix: ${prefix}d, timeoutMs: 1000 }\nlogging: { level: info }\n`;
      const ready = async (p: SidecarProcess) => {
        while ((await send(`http://127.0.0.1:${p.adminPort}`, { path: '/readyz' })).status !== 200);
      };
      proc = await spawnSidecar({ dir: sub, name: 'damage', yaml, args: ['--workers', '2'] });
      const p = proc;
      await ready(p);
      // While it runs: the snapshot folded into the main file, then the pages of the keys past the tables' roots overwritten.
      const db = new Database(path);
      db.pragma('wal_checkpoint(TRUNCATE)');
      const firstData = 1 + Math.max(...db.prepare('SELECT rootpage FROM sqlite_schema').pluck().all() as number[]);
      db.close();
      const fd = openSync(path, 'r+');
      for (let at = firstData * 4096; at < fstatSync(fd).size; at += 4096) writeSync(fd, Buffer.alloc(4096, 0x5a), 0, 4096, at);
      closeSync(fd);
      const chatAs = (secret: string) => send(p.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(secret), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }) });
      let damaged: string | null = null;
      for (const secret of secrets) {
        if ((await chatAs(secret)).status === 500) {
          damaged = secret;
          break;
        }
      }
      assert.ok(damaged, 'a worker met the damage');
      const moved = () => p.lines.some((l) => (JSON.parse(l) as { msg?: string }).msg === 'the replica file is damaged: moved aside; not ready until a snapshot fills a new one');
      await untilLogged(p, moved, 'the primary moved the file aside');
      assert.ok(readdirSync(sub).some((f) => f.startsWith('replica.sqlite.damaged-')));
      let status = 0;
      while (status !== 200) status = (await chatAs(damaged)).status;
      const all = await Promise.all(secrets.slice(0, 40).map(chatAs));
      assert.deepEqual(all.map((r) => r.status), Array(40).fill(200), 'both workers serve the new file');
    } finally {
      await proc?.stop('SIGKILL');
      await fx.close();
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('a worker that cannot start again is restarted less and less often, and says why in the JSON log', async () => {
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-crashloop-'));
    let proc: SidecarProcess | null = null;
    try {
      const replica = join(sub, 'replica.sqlite');
      const file = join(sub, 'snap.ndjson');
      writeFileSync(file, `${JSON.stringify({ type: 'meta', version: 1 })}\n`);
      await importReplica(file, replica);
      const yaml = `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${replica} }\nredis: { url: ${REDIS}, prefix: ${prefix}l, timeoutMs: 1000 }\n`;
      proc = await spawnSidecar({ dir: sub, name: 'workers-crashloop', yaml, args: ['--workers', '2'] });
      // the running workers keep their open file; a new one finds a directory where it was
      renameSync(replica, `${replica}.moved`);
      mkdirSync(replica);
      const listening = proc.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
      process.kill(listening.pids![0]!, 'SIGKILL');
      const p = proc;
      const waits = () => p.lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'worker exited unexpectedly; starting another').map((l) => l.restart_in_ms);
      await untilLogged(p, () => waits().length >= 3, 'three restarts', 15_000);
      assert.deepEqual(waits().slice(0, 3), [1_000, 2_000, 4_000]);
      const failed = p.lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'keyward start failed');
      assert.ok(failed && typeof failed.worker === 'number' && failed.level === 'fatal', 'the worker\'s reason, as a JSON line');
      assert.match(String(failed.err), /replica/);
    } finally {
      await proc?.stop('SIGKILL');
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('--workers 2 without Redis is refused: each worker would enforce every limit on its own', () => {
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-noredis-'));
    try {
      const cfg = join(sub, 'kw.yaml');
      writeFileSync(cfg, `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: http://127.0.0.1:9 } }\nreplica: { path: ${join(sub, 'r.sqlite')} }\n`);
      const r = spawnSync(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, '--workers', '2'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.status, 1);
      assert.match(r.stderr, /--workers 2 needs redis\.url/);
      const bad = spawnSync(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, '--workers', 'two'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(bad.status, 1);
      assert.match(bad.stderr, /--workers expects a positive integer or "auto"/);
    } finally {
      rmSync(sub, { recursive: true, force: true });
    }
  });
});

/** The command line as an operator runs it: real processes, real files. */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { once } from 'node:events';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { ReplicaStore } from '../../src/replica/store.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, send } from '../helpers/http.js';
import { KEYWARD_ARGS } from '../helpers/process.js';

const run = (args: string[]) => spawnSync(process.execPath, [...KEYWARD_ARGS, ...args], { encoding: 'utf8', timeout: 30_000 });

let dir: string;
let up: FakeUpstream;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-cli-'));
  up = await startFakeUpstream();
});
after(async () => {
  rmSync(dir, { recursive: true, force: true });
  await up.close();
});

const hash = makeKeyHasher({ hash: 'sha256' });
const snapshot = (version: number, keyLines: string[]) =>
  [JSON.stringify({ type: 'meta', version }), JSON.stringify({ type: 'wallet', user: 'u1', balance: 3 }), ...keyLines].join('\n') + '\n';
const keyLine = (id: string, secret: string) =>
  JSON.stringify({ type: 'key', id, hash: hash(secret), kind: 'personal', user: 'u1', project: null, status: 'active', budget: null, spent: 0, models: null, routing: null, rpm: null, tpm: null, concurrency: null });

describe('keyward CLI', () => {
  test('--help lists the verbs', () => {
    const r = run(['--help']);
    assert.equal(r.status, 0);
    for (const verb of ['serve', 'import', 'check-config', 'demo', 'console', 'keys', 'projects', 'wallets']) assert.match(r.stdout, new RegExp(`\\b${verb}\\b`));
  });

  test('check-config: 0 for a valid file, 1 with every problem named', () => {
    const good = join(dir, 'good.yaml');
    writeFileSync(good, `upstreams:\n  default: { url: ${up.url} }\n`);
    assert.equal(run(['check-config', '--config', good]).status, 0);
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'server: { port: "x", colour: blue }\nupstreams: {}\nredis: { onError: maybe, url: redis://x }\n');
    const r = run(['check-config', '--config', bad]);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /bad\.yaml/);
    assert.match(r.stderr, /server\.port/);
    assert.match(r.stderr, /server\.colour: unknown key/);
    assert.match(r.stderr, /upstreams/);
    assert.match(r.stderr, /redis\.onError/);
  });

  test('check-config --console validates a console config by the console\'s schema', () => {
    const example = fileURLToPath(new URL('../../config/console.example.yaml', import.meta.url));
    const env = { ...process.env, KEYWARD_SYNC_TOKEN: 'sync-token-0123456789', KEYWARD_ADMIN_TOKEN: 'admin-token-0123456789' };
    const ok = spawnSync(process.execPath, [...KEYWARD_ARGS, 'check-config', '--console', '--config', example], { encoding: 'utf8', timeout: 30_000, env });
    assert.equal(ok.status, 0, ok.stderr);
    // a sidecar's file is not a console's, and the other way round
    const sidecar = join(dir, 'sidecar.yaml');
    writeFileSync(sidecar, `upstreams:\n  default: { url: ${up.url} }\n`);
    const r = run(['check-config', '--console', '--config', sidecar]);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /upstreams: unknown key/);
    const wrongVerb = spawnSync(process.execPath, [...KEYWARD_ARGS, 'check-config', '--config', example], { encoding: 'utf8', timeout: 30_000, env });
    assert.equal(wrongVerb.status, 1);
    assert.match(wrongVerb.stderr, /this looks like the console's config: check it with `keyward check-config --console --config FILE`/);
    assert.doesNotMatch(r.stderr, /looks like/, 'a sidecar file checked as a console one gets no such hint');
  });

  test('check-config refuses what serve would refuse at start, all at once, and serve refuses the same file', () => {
    const bad = join(dir, 'start.yaml');
    writeFileSync(
      bad,
      [
        'server: { host: "not a host!" }',
        'admin: { host: 10.0.0.0/8 }',
        `upstreams:\n  default: { url: ${up.url} }`,
        'redis: { url: "redis+cluster://" }',
        '',
      ].join('\n'),
    );
    const r = run(['check-config', '--config', bad]);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /server\.host: expected an IP address or a host name/);
    assert.match(r.stderr, /admin\.host: expected an IP address or a host name/);
    assert.match(r.stderr, /redis\.url: redis\.url cluster needs at least one host:port/);
    const served = run(['serve', '--config', bad]);
    assert.equal(served.status, 1);
    assert.match(served.stderr, /redis\.url cluster needs at least one host:port/);
    // and says so in the log's shape on stdout, where log shippers read
    const fatal = JSON.parse(served.stdout.trim().split('\n').at(-1)!) as Record<string, unknown>;
    assert.deepEqual([fatal.level, fatal.service, fatal.msg], ['fatal', 'keyward', 'keyward start failed']);
    assert.match(String(fatal.err), /redis\.url cluster needs at least one host:port/);
    for (const [url, why] of [
      ['redis+cluster://a:1,b', /cluster nodes must be host:port/],
      ['redis+cluster://a:70000', /cluster nodes must be host:port/],
      ['unix://relative.sock', /absolute socket path/],
      ['redis://cache:6379/zero', /database number/],
      ['redis://:pw@', /not a valid URL/],
      ['rediss+cluster://u%zz:p@a:1', /malformed %-escape/],
    ] as const) {
      writeFileSync(bad, `upstreams:\n  default: { url: ${up.url} }\nredis: { url: "${url}" }\n`);
      const one = run(['check-config', '--config', bad]);
      assert.equal(one.status, 1, url);
      assert.match(one.stderr, why, url);
    }
  });

  test('import applies a snapshot; a bad line rejects the whole file by line number and the old replica stays', async () => {
    const replica = join(dir, 'replica.sqlite');
    const ok = join(dir, 'ok.ndjson');
    writeFileSync(ok, snapshot(7, [keyLine('k1', 'secret-one')]));
    const r1 = run(['import', ok, '--replica', replica]);
    assert.equal(r1.status, 0, r1.stderr);
    assert.match(r1.stdout, /version 7: 1 keys/);

    const bad = join(dir, 'bad.ndjson');
    writeFileSync(bad, snapshot(8, [keyLine('k2', 'secret-two'), '{"type":"key","id":"k3"}']));
    const r2 = run(['import', bad, '--replica', replica]);
    assert.equal(r2.status, 1);
    assert.match(r2.stderr, /line 4/);

    // refused into a replica that was not there: none is left behind for a later serve to read
    const fresh = join(dir, 'fresh.sqlite');
    assert.equal(run(['import', bad, '--replica', fresh]).status, 1);
    assert.ok(!existsSync(fresh) && !existsSync(`${fresh}-wal`), 'the refused import left a replica file');

    const store = new ReplicaStore({ path: replica });
    try {
      assert.equal(store.status().version, 7);
      assert.equal(store.lookup(hash('secret-one'))?.key.id, 'k1');
      assert.equal(store.lookup(hash('secret-two')), null);
    } finally {
      await store.close();
    }
  });

  test('import without --config or --replica writes the default replica path, under the working directory', async () => {
    const cwd = mkdtempSync(join(dir, 'cwd-'));
    const file = join(dir, 'default.ndjson');
    writeFileSync(file, snapshot(3, [keyLine('k9', 'secret-nine')]));
    // tsx named by its file: `--import tsx` resolves from the working directory
    const args = ['--import', import.meta.resolve('tsx'), ...KEYWARD_ARGS.slice(2)];
    const r = spawnSync(process.execPath, [...args, 'import', file], { encoding: 'utf8', timeout: 30_000, cwd });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /version 3: 1 keys, .* into \.\/data\/replica\.sqlite/);
    const store = new ReplicaStore({ path: join(cwd, 'data', 'replica.sqlite') });
    try {
      assert.equal(store.lookup(hash('secret-nine'))?.key.id, 'k9');
    } finally {
      await store.close();
    }
  });

  test('serve: answers with the imported replica, picks up a later import, exits 0 on SIGTERM', async () => {
    const replica = join(dir, 'serve.sqlite');
    const cfg = join(dir, 'serve.yaml');
    writeFileSync(cfg, `server: { port: 0 }\nadmin: { port: 0 }\nupstreams:\n  default: { url: ${up.url} }\nreplica: { path: ${replica} }\n`);
    const first = join(dir, 'first.ndjson');
    writeFileSync(first, snapshot(1, [keyLine('k1', 'secret-one')]));
    assert.equal(run(['import', first, '--config', cfg]).status, 0);

    const child = spawn(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const out: Record<string, unknown>[] = [];
      const url = await new Promise<string>((resolve) => {
        createInterface({ input: child.stdout! }).on('line', (line) => {
          const l = JSON.parse(line) as Record<string, unknown>;
          out.push(l);
          if (l.msg === 'keyward listening') resolve(l.listen as string);
        });
      });
      let sent = 2;
      assert.equal((await send(url, { path: '/v1/models', headers: bearer('secret-one') })).status, 200);
      assert.equal((await send(url, { path: '/v1/models', headers: bearer('secret-two') })).status, 401);
      const second = join(dir, 'second.ndjson');
      writeFileSync(second, snapshot(2, [keyLine('k2', 'secret-two')]));
      assert.equal(run(['import', second, '--config', cfg]).status, 0);
      // The running sidecar notices the other process's commit within its watch interval.
      const deadline = Date.now() + 3000;
      let status = 0;
      while (Date.now() < deadline && status !== 200) {
        status = (await send(url, { path: '/v1/models', headers: bearer('secret-two') })).status;
        sent++;
      }
      assert.equal(status, 200);
      child.kill('SIGTERM');
      const [code] = (await once(child, 'exit')) as [number];
      assert.equal(code, 0);
      // Access lines are written in batches; the ones still held at SIGTERM are flushed, not lost.
      const access = out.filter((l) => l.msg === 'request');
      assert.equal(access.length, sent, 'every request has its access line');
      assert.deepEqual([access[0]!.status, access[1]!.status, access.at(-1)!.status], [200, 401, 200]);
      assert.ok(access.every((l) => typeof l.req_id === 'string' && typeof l.duration_ms === 'number'));
      // The drain is in the JSON log too, not only on stderr, where log shippers do not look.
      const drain = out.findIndex((l) => l.msg === 'keyward draining');
      assert.ok(drain >= 0 && out[drain]!.signal === 'SIGTERM' && out[drain]!.level === 'info', 'a draining line naming the signal');
    } finally {
      child.kill('SIGKILL');
    }
  });
});

/**
 * The compiled production entry: `npm run build` output (built here into a fresh directory,
 * so no stale dist/ answers) runs with plain `node`, through bin/keyward.mjs, with the Lua
 * scripts and the console's web page beside the code. Other tests run the source.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const ROOT = join(import.meta.dirname, '../..');
let base: string;
let bin: string;
// No loader flags or NODE_OPTIONS: what runs here is what production runs.
const env = { ...process.env };
delete env.NODE_OPTIONS;
const node = (args: string[]) => spawnSync(process.execPath, args, { cwd: ROOT, env, encoding: 'utf8', timeout: 120_000 });

before(() => {
  // Inside the repository, so the build resolves node_modules exactly as dist/ does.
  mkdirSync(join(ROOT, '.scratch'), { recursive: true });
  base = mkdtempSync(join(ROOT, '.scratch', 'build-'));
  mkdirSync(join(base, 'bin'));
  cpSync(join(ROOT, 'bin/keyward.mjs'), join(base, 'bin/keyward.mjs'));
  bin = join(base, 'bin/keyward.mjs');
});
after(() => rmSync(base, { recursive: true, force: true }));

/** A Node.js binary older than the supported lines, where the machine has one (Debian's is 20). */
const OLD_NODE = ['/usr/bin/node', '/usr/local/bin/node'].find((p) => {
  const v = spawnSync(p, ['-p', 'process.versions.node'], { encoding: 'utf8' });
  return v.status === 0 && Number(v.stdout.split('.')[0]) < 22;
});

test('on a Node.js line before 22, bin/keyward.mjs says which lines it needs', { skip: OLD_NODE ? false : 'no Node.js before 22 on this machine' }, () => {
  const r = spawnSync(OLD_NODE!, [bin, 'serve', '--config', 'x.yaml'], { cwd: ROOT, env, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^keyward: Node\.js 22, 24 or 26 is required; this is v\d+\./);
});

test('without a build, bin/keyward.mjs says how to make one', () => {
  const r = node([bin, '--help']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /dist\/ is missing; run `npm run build`/);
});

test('bin/keyward.mjs holds a SIGHUP that comes while serve\'s modules load, and hands it on', async () => {
  // An entry standing in for serve's modules while they load: none of serve's code runs; it
  // says whether the SIGHUP was held.
  const early = mkdtempSync(join(ROOT, '.scratch', 'early-'));
  try {
    mkdirSync(join(early, 'bin'));
    mkdirSync(join(early, 'dist'));
    cpSync(join(ROOT, 'bin/keyward.mjs'), join(early, 'bin/keyward.mjs'));
    writeFileSync(join(early, 'dist/cli.js'), [
      "const early = globalThis[Symbol.for('keyward.earlySighup')];",
      "process.stdout.write('loading\\n');",
      'const tick = () => (early?.held ? process.stdout.write(\'held\\n\') : setTimeout(tick, 1));',
      'tick();',
    ].join('\n'));
    const child = spawn(process.execPath, [join(early, 'bin/keyward.mjs'), 'serve', '--config', 'x.yaml'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
    const lines = createInterface({ input: child.stdout! });
    const exited = once(child, 'exit');
    const [first] = (await once(lines, 'line')) as [string];
    assert.equal(first, 'loading');
    child.kill('SIGHUP');
    const [next] = (await Promise.race([once(lines, 'line'), exited.then(([code, signal]) => [`exited ${code} ${signal}`])])) as [string];
    assert.equal(next, 'held', 'the SIGHUP was held, not the end of the process');
    assert.deepEqual(await exited, [0, null]);
  } finally {
    rmSync(early, { recursive: true, force: true });
  }
});

test('npm run build emits JavaScript, the Lua scripts and the web page', () => {
  const r = node([join(ROOT, 'scripts/build.mjs'), '--out', join(base, 'dist')]);
  assert.equal(r.status, 0, r.stderr + r.stdout);
  const dist = join(base, 'dist');
  for (const f of ['cli.js', 'limits/redis/lua/admit.lua', 'limits/redis/lua/settle.lua', 'limits/redis/lua/refresh.lua', 'replica/worker.js',
    'console/web/index.html', 'console/web/app.js', 'console/web/style.css']) {
    assert.ok(existsSync(join(dist, f)), f);
  }
  const files = readdirSync(dist, { recursive: true }) as string[];
  assert.deepEqual(files.filter((f) => f.endsWith('.ts')), [], 'no TypeScript in the build');
});

test('the build checks configs with plain node', () => {
  const ok = node([bin, 'check-config', '--config', 'config/keyward.example.yaml']);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /keyward\.example\.yaml: ok/);
  const bad = node([bin, 'check-config', '--config', 'config/console.example.yaml']);
  assert.equal(bad.status, 1, 'a console config is not a sidecar config');
  assert.match(bad.stderr, /listen/);
});

test('the build serves the demo: a forwarded request, the console page, a clean exit', async () => {
  const child = spawn(process.execPath, [join(base, 'dist/cli.js'), 'demo', '--port', '0'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  try {
    const lines: string[] = [];
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on('line', (line) => {
        lines.push(line);
        if (line.includes('Ctrl-C stops the demo')) resolve();
      });
      child.once('exit', (code) => reject(new Error(`demo exited with ${code}: ${stderr}`)));
    });
    const head = /sidecar (\S+) .*console (\S+),/.exec(lines[0]!);
    assert.ok(head, lines[0]);
    const [, sidecarUrl, consoleUrl] = head;
    const key = /alice \(personal, wallet 25\):\s+(\S+)/.exec(lines.join('\n'))![1]!;
    const res = await fetch(`${sidecarUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'demo-model', messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(res.status, 200, await res.text());
    const page = await fetch(`${consoleUrl}/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-security-policy') ?? '', /script-src 'self'/);
    assert.match(await page.text(), /<label for="token">Token<\/label>/);
    assert.equal((await fetch(`${consoleUrl}/keys.js`)).status, 200);
  } finally {
    if (child.exitCode === null) child.kill('SIGTERM');
  }
  const code = child.exitCode ?? ((await once(child, 'exit')) as [number | null])[0];
  assert.equal(code, 0, stderr);
});

/**
 * ioredis leaves String.prototype in V8's slow mode when it loads (src/limits/redis/
 * string-methods.ts); the sidecar's modules rebuild it. Each case runs in a node of its own
 * with V8's test intrinsics, which only a child process may be given.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const root = join(import.meta.dirname, '..', '..');

/** Whether String.prototype has fast properties once `specifier` has been imported. */
async function fastAfter(specifier: string): Promise<boolean> {
  const code = `await import(${JSON.stringify(specifier)}); process.stdout.write(String(%HasFastProperties(String.prototype)));`;
  const { stdout } = await run(process.execPath, ['--allow-natives-syntax', '--import', 'tsx', '--input-type=module', '-e', code], { cwd: root });
  return stdout === 'true';
}

test('ioredis alone leaves String.prototype slow (what the rebuild is for)', async () => {
  assert.equal(await fastAfter('ioredis'), false);
});

test("String.prototype is fast once the sidecar's modules have loaded", async () => {
  assert.equal(await fastAfter(pathToFileURL(join(root, 'src', 'app', 'sidecar.ts')).href), true);
});

test("the serve command's modules leave it fast too", async () => {
  assert.equal(await fastAfter(pathToFileURL(join(root, 'src', 'app', 'serve.ts')).href), true);
});

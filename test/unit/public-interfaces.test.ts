/**
 * DESIGN section 1, "Public interfaces only": the lint rule that keeps src/ off the private
 * members of Node and of its dependencies fires on each way of reaching inside them, and
 * not on ordinary code.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ESLint } from 'eslint';
import tseslint from 'typescript-eslint';
import { publicInterfacesOnly } from '../../eslint.config.js';

const eslint = new ESLint({
  overrideConfigFile: true,
  overrideConfig: { files: ['**/*.ts'], languageOptions: { parser: tseslint.parser }, rules: { 'no-restricted-syntax': ['error', ...publicInterfacesOnly] } },
});

async function flagged(code: string): Promise<number> {
  const [result] = await eslint.lintText(code, { filePath: 'src/probe.ts' });
  return result!.messages.filter((m) => m.ruleId === 'no-restricted-syntax').length;
}

test('each way of reaching inside Node or a library is flagged', async () => {
  const cases = [
    'if (socket._httpMessage) socket.destroy();',
    'socket._handle.asyncReset(r);',
    "const sym = Object.getOwnPropertySymbols(new Socket()).find((s) => s.description === 'async_id_symbol');",
    'http.Agent.prototype.addRequest = function () {};',
    'agent.addRequest = (req, o) => undefined;',
    "const passes = proxy.webPasses.filter((p) => p.name !== 'deleteLength');",
    'hist.hashMap[key].count += 1;',
    'delete agent.freeSockets[name];',
    'class C extends Command { toWritable(s) { return super.toWritable(s); } }',
  ];
  for (const code of cases) assert.ok((await flagged(code)) > 0, `not flagged: ${code}`);
});

test('ordinary code, and documented extension points, are not flagged', async () => {
  const cases = [
    "proxy.before('web', 'stream', pass);",
    'class A extends http.Agent { keepSocketAlive(s) { return super.keepSocketAlive(s); } }',
    'histogram.labels({ outcome }).observe(seconds);',
    "client.defineCommand('x', { lua });",
    'const { description } = spec; if (count === description.length) run();',
  ];
  for (const code of cases) assert.equal(await flagged(code), 0, `flagged: ${code}`);
});

#!/usr/bin/env node
// Runs the compiled CLI from dist/ (`npm run build`), so production needs no TypeScript
// tooling: `npm ci --omit=dev` plus dist/ is the whole runtime.
import { existsSync } from 'node:fs';

// Node 22, 24 and 26 are the supported lines (DESIGN section 1; `engines` only warns at
// install). Below 22 the SQLite addon ends the process with a bare "Segmentation fault".
if (Number(process.versions.node.split('.')[0]) < 22) {
  process.stderr.write(`keyward: Node.js 22, 24 or 26 is required; this is ${process.version}\n`);
  process.exit(1);
}

// `serve` answers SIGHUP from its first moment (DESIGN section 12), also while its modules
// load, before any of its code runs: SIGHUP's default action would end the process. What
// comes meanwhile is handed to the reloader (holdSighup in src/app/reload.ts).
const verb = process.argv.slice(2).find((arg) => !arg.startsWith('-'));
if (verb === 'serve') {
  const early = { held: false, listener: () => (early.held = true) };
  globalThis[Symbol.for('keyward.earlySighup')] = early;
  process.on('SIGHUP', early.listener);
}

const entry = new URL('../dist/cli.js', import.meta.url);
if (!existsSync(entry)) {
  process.stderr.write('keyward: dist/ is missing; run `npm run build` first (`npm start` builds by itself)\n');
  process.exit(1);
}
await import(entry.href);

#!/usr/bin/env node
// Runs the compiled CLI from dist/ (`npm run build`), so production needs no TypeScript
// tooling: `npm ci --omit=dev` plus dist/ is the whole runtime.
import { existsSync } from 'node:fs';

const entry = new URL('../dist/cli.js', import.meta.url);
if (!existsSync(entry)) {
  process.stderr.write('keyward: dist/ is missing; run `npm run build` first (`npm start` builds by itself)\n');
  process.exit(1);
}
await import(entry.href);

#!/usr/bin/env node
/**
 * `npm run build`: compiles src/ to JavaScript and copies the files the code reads at run
 * time (Lua scripts, the console's web page) beside it, so production runs `node` alone.
 *   node scripts/build.mjs [--out DIR]     (default: dist)
 * An output directory inside the repository resolves node_modules like dist/ does.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const outFlag = process.argv.indexOf('--out');
const out = resolve(outFlag > 0 && process.argv[outFlag + 1] ? process.argv[outFlag + 1] : join(root, 'dist'));

// A clean output: a module deleted from src/ must not live on in the build.
rmSync(out, { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const compiled = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json'), '--outDir', out], { stdio: 'inherit' });
if (compiled.status !== 0) process.exit(compiled.status ?? 1);

// Everything under src/ that is not TypeScript is an asset the code loads by relative URL.
const src = join(root, 'src');
let copied = 0;
for (const entry of readdirSync(src, { recursive: true, withFileTypes: true })) {
  if (!entry.isFile() || entry.name.endsWith('.ts')) continue;
  const from = join(entry.parentPath, entry.name);
  cpSync(from, join(out, relative(src, from)));
  copied++;
}
process.stdout.write(`built ${relative(process.cwd(), out) || '.'}: compiled src/ and copied ${copied} assets\n`);

#!/usr/bin/env node
// Runs the TypeScript CLI through tsx's loader so `npx keyward` works right after `npm ci`.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli.ts');

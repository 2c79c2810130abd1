import { test } from 'node:test';
import assert from 'node:assert/strict';
import { availableParallelism } from 'node:os';
import { parseWorkers } from '../../src/app/workers.js';

test('--workers: a positive integer, or auto for one per core', () => {
  assert.equal(parseWorkers('1'), 1);
  assert.equal(parseWorkers('3'), 3);
  assert.equal(parseWorkers('auto'), availableParallelism());
  for (const bad of ['0', '-1', '1.5', 'two', '', '1e9']) assert.throws(() => parseWorkers(bad), /--workers expects a positive integer or "auto"/, bad);
});

/** The URL a sidecar and a `--workers` primary log as `listen`: an IPv6 host goes in brackets (src/app/listen.ts). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { httpUrl } from '../../src/app/listen.js';

test('httpUrl: an IPv6 host in brackets, an IPv4 or name as is', () => {
  assert.equal(httpUrl('::1', 8080), 'http://[::1]:8080');
  assert.equal(httpUrl('::', 0), 'http://[::]:0');
  assert.equal(httpUrl('127.0.0.1', 8080), 'http://127.0.0.1:8080');
  assert.equal(httpUrl('localhost', 9), 'http://localhost:9');
  // a URL the logged `listen` is parsed back into must name the same port
  assert.equal(new URL(httpUrl('::1', 4321)).port, '4321');
});

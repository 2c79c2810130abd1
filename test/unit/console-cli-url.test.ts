/** The admin CLI's client: a console URL carrying only a password (`http://:pw@host`) is user-info too. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { adminClient, CliError } from '../../src/console/cli-client.js';

test('a console URL with a password and no user name is refused before any call, without the password', async () => {
  let calls = 0;
  const counting = (async () => {
    calls++;
    throw new TypeError('fetch failed');
  }) as unknown as typeof fetch;
  let err: unknown;
  try {
    const call = adminClient({ url: 'http://:Pa55word@127.0.0.1:7000', token: 'admin-token', fetch: counting });
    await call('GET', '/admin/v1/whoami');
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof CliError, String(err));
  assert.match(err.message, /must not carry user-info/);
  assert.ok(!err.message.includes('Pa55word'), err.message);
  assert.equal(calls, 0, 'refused before any call');
});

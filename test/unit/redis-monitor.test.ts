/**
 * The tests' MONITOR watcher (test/helpers/redis-monitor.ts) against a server that answers
 * MONITOR with +OK and a command line in one write: the case ioredis's monitor() takes for the
 * reply to no command.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { monitorArgs, monitorSocket } from '../helpers/redis-monitor.js';

test('a command line in the same packet as MONITOR’s +OK is reported, not lost or taken for a reply', { timeout: 5_000 }, async (t) => {
  const server = createServer((socket) => {
    socket.once('data', () => socket.write('+OK\r\n+1795725365.878846 [0 127.0.0.1:34636] "info"\r\n+1795725365.9 [0 127.0.0.1:1] "evalsha" "ab\\"c" "{kw:k}"\r\n'));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => server.close());
  const seen: string[][] = [];
  const { socket } = await monitorSocket(`redis://127.0.0.1:${(server.address() as AddressInfo).port}`, (args) => seen.push(args));
  t.after(() => socket.destroy());
  while (seen.length < 2) await once(socket, 'data');
  assert.deepEqual(seen, [['info'], ['evalsha', 'ab"c', '{kw:k}']]);
});

test('a refused MONITOR is an error, not a watch that counts nothing', async (t) => {
  const server = createServer((socket) => socket.once('data', () => socket.write('-NOPERM this user has no permissions to run the \'monitor\' command\r\n')));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => server.close());
  await assert.rejects(monitorSocket(`redis://127.0.0.1:${(server.address() as AddressInfo).port}`, () => undefined), /NOPERM/);
});

test('monitorArgs reads quoted arguments with escaped quotes and backslashes', () => {
  assert.deepEqual(monitorArgs('+1.0 [0 unix:/s] "echo" "a\\\\b" "x y"'), ['echo', 'a\\b', 'x y']);
});

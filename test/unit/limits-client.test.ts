import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRedisUrl, reconnectDelayMs } from '../../src/limits/redis/client.js';

test('redis.url forms: single node, TLS, unix socket, cluster seeds', () => {
  assert.deepEqual(parseRedisUrl('redis://127.0.0.1:6379/2'), { kind: 'single', url: 'redis://127.0.0.1:6379/2' });
  assert.deepEqual(parseRedisUrl('rediss://:pw@cache:6380'), { kind: 'single', url: 'rediss://:pw@cache:6380' });
  assert.deepEqual(parseRedisUrl('unix:///run/redis/redis.sock'), { kind: 'unix', path: '/run/redis/redis.sock' });
  assert.deepEqual(parseRedisUrl('redis+cluster://10.0.0.1:7000,10.0.0.2:7001'), {
    kind: 'cluster',
    nodes: [{ host: '10.0.0.1', port: 7000 }, { host: '10.0.0.2', port: 7001 }],
    tls: false,
  });
  assert.deepEqual(parseRedisUrl('rediss+cluster://app:s%40cret@a:1,[::1]:2'), {
    kind: 'cluster',
    nodes: [{ host: 'a', port: 1 }, { host: '::1', port: 2 }],
    tls: true,
    username: 'app',
    password: 's@cret',
  });
});

test('redis.url errors name what is expected', () => {
  assert.throws(() => parseRedisUrl('127.0.0.1:6379'), /redis:\/\/host:port/);
  assert.throws(() => parseRedisUrl('memcached://x:1'), /not supported/);
  assert.throws(() => parseRedisUrl('redis+cluster://'), /at least one/);
  assert.throws(() => parseRedisUrl('redis+cluster://a:1,b'), /host:port/);
  assert.throws(() => parseRedisUrl('unix://relative.sock'), /absolute/);
  assert.throws(() => parseRedisUrl('redis://'), /needs a host|not a valid URL/);
  assert.throws(() => parseRedisUrl('redis://cache:6379/db1'), /database number/);
  assert.throws(() => parseRedisUrl('redis://cache:99999'), /not a valid URL|between 1 and 65535/);
  assert.throws(() => parseRedisUrl('redis+cluster://a:0'), /host:port/);
  assert.throws(() => parseRedisUrl('redis+cluster://u:%E0%A4%A@a:1'), /malformed %-escape/);
  assert.deepEqual(parseRedisUrl('redis://cache'), { kind: 'single', url: 'redis://cache' });
});

test('reconnect backoff grows and is capped', () => {
  assert.equal(reconnectDelayMs(1), 100);
  assert.ok(reconnectDelayMs(3) > reconnectDelayMs(2));
  assert.equal(reconnectDelayMs(50), 2_000);
});

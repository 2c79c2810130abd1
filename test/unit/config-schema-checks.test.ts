/**
 * What check-config refuses so that serve never fails on a config it passed (DESIGN
 * section 2): a routing mode's name and value both checked, durations Node's timers can
 * wait, URLs fetch will use, listeners that cannot bind the same address and port.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BAD_FETCH_PORTS } from '../../src/config/urls.js';
import { MINIMAL, hasProblem, parse, problems } from '../helpers/config-text.js';

test('a routing mode with a bad name still has its value checked, and both are reported', () => {
  const list = problems('upstreams: { default: {}, "bad mode": { url: ftp://x, zz: 1 } }\n');
  hasProblem(list, 'upstreams.bad mode', /routing mode/);
  hasProblem(list, 'upstreams.bad mode.url', /http/);
  hasProblem(list, 'upstreams.bad mode.zz', /unknown key/);
});

test('a number that is not whole hides no check that compares fields', () => {
  const list = problems('server: { port: 9000, maxJsonBodyBytes: 1.5 }\nadmin: { port: 9000 }\nupstreams: { batch: { url: http://b, timeoutMs: 2.5 }, "a b": {} }\n');
  hasProblem(list, 'server.maxJsonBodyBytes', /whole number/);
  hasProblem(list, 'admin.port', /share the proxy port/);
  hasProblem(list, 'upstreams', /upstreams\.default is required/);
  hasProblem(list, 'upstreams.a b', /routing mode/);
});

const MAX_TIMER_MS = 2_147_483_647;

/** Every path in `value` whose last key ends in `Ms`. */
function msPaths(value: unknown, path: string[] = []): string[][] {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return [];
  return Object.entries(value).flatMap(([k, v]) => (k.endsWith('Ms') && typeof v === 'number' ? [[...path, k]] : msPaths(v, [...path, k])));
}

function withValue(tree: Record<string, unknown>, path: string[], v: number): Record<string, unknown> {
  const copy = structuredClone(tree);
  let at: Record<string, unknown> = copy;
  for (const k of path.slice(0, -1)) at = at[k] as Record<string, unknown>;
  at[path.at(-1)!] = v;
  return copy;
}

test('every duration (a key ending in Ms) is refused past what a Node timer can wait', () => {
  const full = parse(`${MINIMAL}console: { token: t }\nredis: {}\ntracing: {}\nalerts: { webhookUrl: http://127.0.0.1:8099/h }\n`) as unknown as Record<string, unknown>;
  const paths = msPaths(full);
  for (const want of ['server.shutdownGraceMs', 'server.bodyIdleTimeoutMs', 'upstreams.default.timeoutMs', 'limits.leaseMs', 'redis.timeoutMs']) {
    assert.ok(paths.some((p) => p.join('.') === want), `${want} in ${paths.map((p) => p.join('.')).join(', ')}`);
  }
  for (const path of paths) {
    const over = JSON.stringify(withValue(full, path, MAX_TIMER_MS + 1));
    hasProblem(problems(over), path.join('.'), /at most/);
  }
  const far = parse(`${MINIMAL}server: { shutdownGraceMs: ${MAX_TIMER_MS} }\nlimits: { leaseMs: ${MAX_TIMER_MS} }\n`);
  assert.equal(far.server.shutdownGraceMs, MAX_TIMER_MS);
  hasProblem(problems(`${MINIMAL}server: { shutdownGraceMs: 3000000000 }\nlimits: { leaseMs: 7000000000 }\n`), 'limits.leaseMs', /2147483647/);
});

test('the longest duration allowed is the longest a Node timer waits for', async () => {
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.name);
  process.on('warning', onWarning);
  try {
    clearTimeout(setTimeout(() => {}, MAX_TIMER_MS));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(warnings, []);
    clearTimeout(setTimeout(() => {}, MAX_TIMER_MS + 1));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(warnings, ['TimeoutOverflowWarning']);
  } finally {
    process.off('warning', onWarning);
  }
});

test('console.url is a base URL: a ?query or #fragment is refused, as for tracing.otlpUrl', () => {
  hasProblem(problems(`${MINIMAL}console: { url: "http://127.0.0.1:46339/?v=1", token: t }\n`), 'console.url', /\?query or #fragment/);
  hasProblem(problems(`${MINIMAL}console: { url: "http://127.0.0.1:46339/c#x", token: t }\n`), 'console.url', /\?query or #fragment/);
  assert.equal(parse(`${MINIMAL}console: { url: "http://console.internal:46339/base", token: t }\n`).console?.url, 'http://console.internal:46339/base');
});

test('console.url and alerts.webhookUrl on a port fetch refuses are refused', () => {
  const list = problems(`${MINIMAL}console: { url: "http://127.0.0.1:6000", token: t }\nalerts: { webhookUrl: "https://ops.example:10080/h" }\n`);
  hasProblem(list, 'console.url', /port 6000/);
  hasProblem(list, 'alerts.webhookUrl', /port 10080/);
  const ok = parse(`${MINIMAL}console: { url: "http://127.0.0.1:6001", token: t }\nalerts: { webhookUrl: "https://ops.example/h" }\n`);
  assert.equal(ok.alerts?.webhookUrl, 'https://ops.example/h');
});

test('every port refused is one Node\'s fetch refuses', async () => {
  for (const port of BAD_FETCH_PORTS) {
    const err = await fetch(`http://127.0.0.1:${port}/`).then(() => null, (e: Error) => e);
    assert.match(String((err?.cause as Error | undefined)?.message ?? err?.cause), /bad port/, `port ${port}`);
  }
});

test('listeners on localhost and on 127.0.0.1 or ::1 with one port collide', () => {
  for (const [server, admin] of [['localhost', '127.0.0.1'], ['127.0.0.1', 'localhost'], ['localhost', '"[::1]"'], ['LOCALHOST', 'localhost'], ['"::"', '127.0.0.1'], ['0.0.0.0', 'localhost'], ['"::ffff:127.0.0.1"', '127.0.0.1']]) {
    hasProblem(problems(`${MINIMAL}server: { host: ${server}, port: 36327 }\nadmin: { host: ${admin}, port: 36327 }\n`), 'admin.port', /share the proxy port/);
  }
  const apart = parse(`${MINIMAL}server: { host: localhost, port: 36327 }\nadmin: { host: 127.0.0.2, port: 36327 }\n`);
  assert.equal(apart.admin.host, '127.0.0.2');
});

test('an IPv4 address in a short, whole-number, octal or hex form is refused: the resolver reads it as an address the clash check would not', () => {
  for (const h of ['127.1', '2130706433', '0177.0.0.1', '127.0.0.01', '0x7f.0.0.1', '10.0x1']) {
    hasProblem(problems(`${MINIMAL}admin: { host: "${h}", port: 36327 }\n`), 'admin.host', /four decimal parts/);
  }
  for (const h of ['127.0.0.1', 'keyward-admin.internal', 'host-7', '"::1"']) assert.ok(parse(`${MINIMAL}admin: { host: ${h} }\n`));
});

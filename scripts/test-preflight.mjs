#!/usr/bin/env node
/**
 * `npm test` runs the suite through this: it checks what the tests need that `npm install`
 * does not bring, says in one line what is missing and how to get it, then runs the command
 * it is given and exits with that command's code.
 *   node scripts/test-preflight.mjs <command> [args...]
 *
 * - Redis: the tests use the one at KW_TEST_REDIS_URL (default redis://127.0.0.1:6379). When
 *   nothing listens there and the address is this machine's, a private redis-server
 *   (REDIS_SERVER, else the one on PATH) is started on that port for the run, keeping nothing
 *   on disk, and stopped afterwards. Without one the command does not run: exit 1.
 * - Chromium (KEYWARD_CHROMIUM, default /usr/bin/chromium) drives the console page tests;
 *   without it those tests are skipped, and a line says so.
 * - A deadline (KW_TEST_DEADLINE_S, default 1200): a run still going then is stopped, with
 *   every process it started, and exits 1 saying so, rather than holding CI until its limit.
 */
import { Buffer } from 'node:buffer';
import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { clearTimeout, setTimeout } from 'node:timers';

const DEFAULT_URL = 'redis://127.0.0.1:6379';
const PING_TIMEOUT_MS = 2_000;
const START_TIMEOUT_MS = 10_000;
const DEADLINE_S = Number(process.env.KW_TEST_DEADLINE_S ?? 1200);
const KILL_AFTER_MS = 10_000;

const say = (line) => process.stderr.write(`test preflight: ${line}\n`);

/** host, port and credentials of a redis:// URL; null for anything else. */
function target(text) {
  let url;
  try {
    url = new URL(text);
  } catch {
    return null;
  }
  if (url.protocol !== 'redis:') return null;
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1') || '127.0.0.1';
  const port = Number(url.port || 6379);
  // Shown in messages: never the password.
  const shown = `redis://${url.hostname || '127.0.0.1'}:${port}`;
  return { host, port, shown, username: decodeURIComponent(url.username), password: decodeURIComponent(url.password) };
}

/** A command in Redis's wire format. */
const resp = (...args) => `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;

/**
 * Asks for PONG (after AUTH when the URL has a password). Resolves with `pong`, `refused`
 * (nothing listens), or `other` and what happened instead.
 */
function ping(t) {
  const auth = t.password ? (t.username ? resp('AUTH', t.username, t.password) : resp('AUTH', t.password)) : '';
  const replies = auth ? 2 : 1;
  return new Promise((resolve) => {
    const socket = connect({ host: t.host, port: t.port });
    let text = '';
    const done = (r) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => done({ state: 'other', detail: `no answer within ${PING_TIMEOUT_MS} ms` }), PING_TIMEOUT_MS);
    socket.on('connect', () => socket.write(auth + resp('PING')));
    socket.on('data', (b) => {
      text += b.toString('latin1');
      const lines = text.split('\r\n').slice(0, -1);
      const refusal = lines.find((l) => l.startsWith('-'));
      if (refusal) done({ state: 'other', detail: `it answered "${refusal.slice(1, 120)}"` });
      else if (lines.length >= replies) done(lines[replies - 1] === '+PONG' ? { state: 'pong' } : { state: 'other', detail: 'it does not answer as Redis' });
    });
    socket.on('error', (err) => done(err.code === 'ECONNREFUSED' ? { state: 'refused' } : { state: 'other', detail: err.code ?? err.message }));
  });
}

/** REDIS_SERVER when set (and executable), else redis-server on PATH, else null. */
function redisServerBinary() {
  const executable = (p) => {
    try {
      accessSync(p, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  };
  if (process.env.REDIS_SERVER) return executable(process.env.REDIS_SERVER) ? process.env.REDIS_SERVER : null;
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir && executable(join(dir, 'redis-server'))) return join(dir, 'redis-server');
  }
  return null;
}

const isLoopback = (host) => host === 'localhost' || host === '::1' || /^127\./.test(host);

/** Starts redis-server on the target's port; resolves with a stop function once it answers, or with why it could not. */
async function startRedis(bin, t) {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-test-redis-'));
  const bind = t.host === 'localhost' ? ['127.0.0.1', '-::1'] : [t.host];
  const proc = spawn(bin, ['--port', String(t.port), '--bind', ...bind, '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  for (const s of [proc.stdout, proc.stderr]) s.on('data', (b) => (output = (output + b.toString()).slice(-2_000)));
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < deadline && proc.exitCode === null && proc.signalCode === null) {
    if ((await ping(t)).state === 'pong') return { stop };
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop();
  const last = output.trim().split('\n').pop() ?? '';
  return { problem: `${bin} did not start on port ${t.port}${last ? `: ${last.trim()}` : ''}` };
}

/** Makes sure a Redis answers; returns what to stop after the run, or null after saying what is missing. */
async function redisForTests() {
  const fromEnv = process.env.KW_TEST_REDIS_URL;
  const t = target(fromEnv ?? DEFAULT_URL);
  const fix = 'apt-get install redis-server, or set KW_TEST_REDIS_URL to a Redis that answers';
  if (!t) {
    say('KW_TEST_REDIS_URL must be a redis://host:port URL (unset, the tests use redis://127.0.0.1:6379)');
    return null;
  }
  const first = await ping(t);
  if (first.state === 'pong') return { stop: async () => {} };
  if (first.state === 'other') {
    say(`something listens at ${t.shown} but is not a Redis the tests can use (${first.detail}): ${fix}`);
    return null;
  }
  const bin = isLoopback(t.host) ? redisServerBinary() : null;
  if (!bin) {
    const why = isLoopback(t.host) ? 'and there is no redis-server to start one' : 'and it is not on this machine';
    say(`no Redis answers at ${t.shown}${fromEnv ? ' (KW_TEST_REDIS_URL)' : ''}, ${why}: ${fix}`);
    return null;
  }
  const started = await startRedis(bin, t);
  if (started.problem) {
    say(`no Redis answers at ${t.shown} and ${started.problem}: ${fix}`);
    return null;
  }
  say(`started a private redis-server on ${t.shown} for this run (nothing kept on disk); it stops when the tests end`);
  return started;
}

/**
 * Runs the command with this process's streams, in a process group of its own so that the
 * deadline stops the test files' processes too; resolves with its exit code.
 */
function run(command) {
  const child = spawn(command[0], command.slice(1), { stdio: 'inherit', detached: true });
  const signal = (sig) => {
    try {
      process.kill(-child.pid, sig);
    } catch {
      // already gone
    }
  };
  // Ctrl-C reaches this process's group, not the command's: it is passed on, as is a signal sent to this process alone.
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => signal(sig));
  let late = false;
  const deadline = setTimeout(() => {
    late = true;
    say(`the run did not finish within ${DEADLINE_S} s (KW_TEST_DEADLINE_S): stopping it and every process it started`);
    signal('SIGTERM');
    setTimeout(() => signal('SIGKILL'), KILL_AFTER_MS).unref();
  }, DEADLINE_S * 1000);
  return new Promise((resolve) => {
    child.on('error', (err) => {
      clearTimeout(deadline);
      say(`could not run ${command[0]}: ${err.message}`);
      resolve(1);
    });
    child.on('exit', (code) => {
      clearTimeout(deadline);
      // What the command started may outlive it; nothing of the run is left behind.
      signal('SIGKILL');
      resolve(late ? 1 : (code ?? 1));
    });
  });
}

const command = process.argv.slice(2);
if (command.length === 0) {
  say('usage: node scripts/test-preflight.mjs <command> [args...]');
  process.exit(2);
}
if (!(DEADLINE_S > 0)) {
  say(`KW_TEST_DEADLINE_S must be a number of seconds above 0, not "${process.env.KW_TEST_DEADLINE_S}"`);
  process.exit(2);
}
const chromium = process.env.KEYWARD_CHROMIUM ?? '/usr/bin/chromium';
if (!existsSync(chromium)) say(`no Chromium at ${chromium}: the console page tests will be skipped (apt-get install chromium, or set KEYWARD_CHROMIUM)`);
const redis = await redisForTests();
if (!redis) process.exit(1);
const code = await run(command);
await redis.stop();
process.exit(code);

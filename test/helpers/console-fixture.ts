/**
 * A real console on an ephemeral port with its store in a temp dir, plus small clients
 * for its admin and sync APIs. Tokens and the master key are random per fixture.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { consoleConfigSchema, type ConsoleConfig, type ConsoleConfigInput } from '../../src/console/config.js';
import { startConsole, type RunningConsole } from '../../src/app/console.js';

export interface ConsoleFixture {
  dir: string;
  config: ConsoleConfig;
  env: NodeJS.ProcessEnv;
  tokens: { admin: string; sync: string; alice: string; bob: string };
  console: RunningConsole;
  url: string;
  /** admin API call with a token (admin by default); returns status and parsed JSON */
  api(method: string, path: string, opts?: { body?: unknown; token?: string | null }): Promise<{ status: number; body: any }>;
  /** restart on the same store and port (the console "comes back") */
  restart(): Promise<void>;
  close(): Promise<void>;
}

export const tok = (label: string) => `${label}-${randomBytes(16).toString('hex')}`;

export function makeConsoleConfig(opts: { dir: string; tokens: ConsoleFixture['tokens']; port?: number; overrides?: Partial<ConsoleConfigInput> }): ConsoleConfig {
  return consoleConfigSchema.parse({
    listen: { host: '127.0.0.1', port: opts.port ?? 0 },
    store: { path: join(opts.dir, 'console.sqlite') },
    masterKeyEnv: 'TEST_MASTER_KEY',
    auth: {
      syncTokens: [opts.tokens.sync],
      adminTokens: [opts.tokens.admin],
      users: [
        { id: 'alice', token: opts.tokens.alice },
        { id: 'bob', token: opts.tokens.bob },
      ],
    },
    pricing: {
      models: [
        { match: 'gpt-4o-mini*', inputPerMillion: 0.15, outputPerMillion: 0.6 },
        { match: 'gpt-4o*', inputPerMillion: 2.5, outputPerMillion: 10 },
      ],
      unpriced: { inputPerMillion: 1, outputPerMillion: 1 },
    },
    ...opts.overrides,
  });
}

export async function startConsoleFixture(opts: { overrides?: Partial<ConsoleConfigInput> } = {}): Promise<ConsoleFixture> {
  const dir = mkdtempSync(join(tmpdir(), 'kw-console-'));
  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const env = { TEST_MASTER_KEY: randomBytes(32).toString('hex') };
  let config = makeConsoleConfig({ dir, tokens, ...(opts.overrides ? { overrides: opts.overrides } : {}) });
  let running = await startConsole({ config, env });
  // Later restarts keep the port so clients configured with the URL find it again.
  config = { ...config, listen: { ...config.listen, port: running.port } };
  const fx: ConsoleFixture = {
    dir, config, env, tokens, console: running, url: running.url,
    async api(method, path, o = {}) {
      const token = o.token === undefined ? tokens.admin : o.token;
      const res = await fetch(`${fx.url}${path}`, {
        method,
        headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(o.body !== undefined ? { 'content-type': 'application/json' } : {}) },
        ...(o.body !== undefined ? { body: JSON.stringify(o.body) } : {}),
      });
      const text = await res.text();
      return { status: res.status, body: text ? JSON.parse(text) : null };
    },
    async restart() {
      running = await startConsole({ config, env });
      fx.console = running;
    },
    async close() {
      await running.close().catch(() => {});
      rmSync(dir, { recursive: true, force: true });
    },
  };
  return fx;
}

/** GET a sync endpoint with the sync token; returns status and raw text. */
export async function syncGet(fx: ConsoleFixture, path: string, token: string | null = fx.tokens.sync): Promise<{ status: number; text: string }> {
  const res = await fetch(`${fx.url}${path}`, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  return { status: res.status, text: await res.text() };
}

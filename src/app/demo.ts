/**
 * `keyward demo` (what `npm start` runs): the whole system on loopback, with nothing else
 * installed: the reference console (fresh store, random master key and tokens), a demo
 * upstream, and a sidecar that syncs its replica from the console. Demo keys are created
 * through the console's admin API, as an operator would, and curl lines show each outcome.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { configSchema } from '../config/schema.js';
import { adminClient } from '../console/cli-client.js';
import { consoleConfigSchema } from '../console/config.js';
import { startConsole, type RunningConsole } from './console.js';
import { createLogger } from '../obs/logger.js';
import { startSidecar, type Sidecar } from './sidecar.js';
import { startDemoUpstream } from './demo-upstream.js';

async function listenWithFallback<T>(start: (port: number) => Promise<T>, port: number): Promise<T> {
  try {
    return await start(port);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    return start(0); // the usual port is taken: any port will do for a demo
  }
}

const token = () => randomBytes(24).toString('base64url');

/** Wallets, a project and three keys, created through the admin API. */
async function seed(admin: ReturnType<typeof adminClient>) {
  await admin('PUT', '/admin/v1/wallets/alice', { balance: 25 });
  await admin('PUT', '/admin/v1/wallets/bob', { balance: 0 });
  await admin('POST', '/admin/v1/projects', { id: 'demo-team', budget: 100, members: ['alice'] });
  const create = (body: Record<string, unknown>) => admin<{ secret: string }>('POST', '/admin/v1/keys', body).then((r) => r.secret);
  return {
    ok: await create({ kind: 'personal', user: 'alice', name: 'alice laptop', rpm: 60, tpm: 100_000, concurrency: 4 }),
    broke: await create({ kind: 'personal', user: 'bob', name: 'bob laptop' }),
    scoped: await create({ kind: 'team', project: 'demo-team', name: 'team bot', models: ['demo-model', 'gpt-4o-mini*'] }),
  };
}

interface DemoSecrets {
  master: string;
  sync: string;
  admin: string;
}

function demoConsole(o: { dir: string; secrets: DemoSecrets; port: number }): Promise<RunningConsole> {
  const config = (port: number) =>
    consoleConfigSchema.parse({
      listen: { port },
      store: { path: join(o.dir, 'console.sqlite') },
      auth: { syncTokens: [o.secrets.sync], adminTokens: [o.secrets.admin] },
      pricing: { models: [{ match: '*', inputPerMillion: 2.5, outputPerMillion: 10 }], unpriced: { inputPerMillion: 0, outputPerMillion: 0 } },
    });
  return listenWithFallback((port) => startConsole({ config: config(port), env: { KEYWARD_MASTER_KEY: o.secrets.master } }), o.port);
}

function demoSidecar(o: { dir: string; upstreamUrl: string; consoleUrl: string; syncToken: string; port: number; adminPort: number }): Promise<Sidecar> {
  const config = (port: number, adminPort: number) =>
    configSchema.parse({
      server: { port },
      admin: { port: adminPort },
      upstreams: { default: { url: o.upstreamUrl } },
      replica: { path: join(o.dir, 'replica.sqlite') },
      console: { url: o.consoleUrl, token: o.syncToken, waitMs: 25_000 },
    });
  const logger = createLogger({ level: 'info', destination: process.stderr });
  return listenWithFallback((port) => listenWithFallback((adminPort) => startSidecar({ config: config(port, adminPort), logger }), o.adminPort), o.port);
}

/** What the demo prints: where everything listens, the demo keys, and a command for each outcome. */
function introduce(say: (line: string) => void, o: { sidecar: Sidecar; consoleUrl: string; upstreamUrl: string; keys: Awaited<ReturnType<typeof seed>>; adminToken: string }): void {
  const { keys } = o;
  const base = o.sidecar.url;
  const body = (model: string) => `-H 'content-type: application/json' -d '{"model":"${model}","messages":[{"role":"user","content":"hi"}]}'`;
  say(`keyward demo: sidecar ${base} (admin http://127.0.0.1:${o.sidecar.adminPort}), console ${o.consoleUrl}, demo upstream ${o.upstreamUrl}`);
  say('Demo keys, created through the console (they live only in this demo):');
  say(`  alice (personal, wallet 25):              ${keys.ok}`);
  say(`  bob   (personal, wallet 0):               ${keys.broke}`);
  say(`  team  (models demo-model, gpt-4o-mini*):  ${keys.scoped}`);
  say('Try:');
  say(`  200  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.ok}' ${body('demo-model')}`);
  say(`  401  curl -s ${base}/v1/models -H 'authorization: Bearer not-a-real-key'`);
  say(`  402  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.broke}' ${body('demo-model')}`);
  say(`  403  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.scoped}' ${body('gpt-4o')}`);
  say(`The console, from another shell (admin token: ${o.adminToken}):`);
  say(`  export KEYWARD_CONSOLE_URL=${o.consoleUrl} KEYWARD_ADMIN_TOKEN=${o.adminToken}`);
  say('  npx keyward keys list        # then: npx keyward keys delete <id>  -> that key answers 401 api_key_deleted');
  say(`  curl -s http://127.0.0.1:${o.sidecar.adminPort}/metrics`);
  say('Access log lines go to stderr. Ctrl-C stops the demo.');
}

export async function runDemo(opts: { port?: number; adminPort?: number; consolePort?: number; log?: (line: string) => void } = {}) {
  const say = opts.log ?? ((line: string) => process.stdout.write(`${line}\n`));
  const dir = mkdtempSync(join(tmpdir(), 'keyward-demo-'));
  const secrets: DemoSecrets = { master: randomBytes(32).toString('hex'), sync: token(), admin: token() };
  const port = opts.port ?? 8080;
  // the proxy asked for on the admin listener's usual port: the admin listener takes any other
  const adminPort = opts.adminPort ?? (port === 9090 ? 0 : 9090);
  // what has started, stopped in reverse when a later piece cannot start, or at close()
  const started: { close(): Promise<void> }[] = [];
  const close = async () => {
    for (const piece of started.reverse()) await piece.close();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const upstream = await startDemoUpstream();
    started.push(upstream);
    const console = await demoConsole({ dir, secrets, port: opts.consolePort ?? 7000 });
    started.push(console);
    const keys = await seed(adminClient({ url: console.url, token: secrets.admin }));
    const sidecar = await demoSidecar({ dir, upstreamUrl: upstream.url, consoleUrl: console.url, syncToken: secrets.sync, port, adminPort });
    started.push({ close: () => sidecar.close({ graceMs: 1000 }) });
    await sidecar.sync?.start(); // the first sync: the demo keys are in the replica from here on
    introduce(say, { sidecar, consoleUrl: console.url, upstreamUrl: upstream.url, keys, adminToken: secrets.admin });
    return { sidecar, upstream, console, keys, adminToken: secrets.admin, close };
  } catch (err) {
    await close();
    throw err;
  }
}

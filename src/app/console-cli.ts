/**
 * CLI verbs for the reference console: `keyward console --config FILE` runs it, and
 * `keys`, `projects` and `wallets` talk to a running console's admin API
 * (`--console URL`, default $KEYWARD_CONSOLE_URL or http://127.0.0.1:7000; token from
 * $KEYWARD_ADMIN_TOKEN). Output is a table for people, or the API's JSON with `--json`.
 * Output goes through an injectable writer so the verbs can be run in-process by tests.
 */
import { Command } from 'commander';
import pino from 'pino';
import { ConfigError } from '../config/load.js';
import {
  adminClient, budgetPeriodArg, CliError, DEFAULT_CONSOLE_URL, ipList, modelLimits, modelList, numberOrNone, shadowList, TOKEN_ENV, URL_ENV, type AdminCall,
} from '../console/cli-client.js';
import { keyDetails, keysTable, lastUsed, projectsTable, walletsTable } from '../console/cli-format.js';
import { loadConsoleConfig } from './config-files.js';
import { KeyHashingError, MasterKeyError } from '../console/crypto.js';
import type { KeyView } from '../console/db.js';
import { SHADOW_CHECKS } from '../protocol/shadow-checks.js';
import { startConsole } from './console.js';

export interface CliIO {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
  fetch: typeof fetch;
  setExitCode: (code: number) => void;
}

function resolveIO(io: Partial<CliIO>): CliIO {
  return {
    stdout: io.stdout ?? ((t) => void process.stdout.write(t)),
    stderr: io.stderr ?? ((t) => void process.stderr.write(t)),
    env: io.env ?? process.env,
    fetch: io.fetch ?? fetch,
    setExitCode: io.setExitCode ?? ((c) => void (process.exitCode = c)),
  };
}

interface Common { console?: string; json?: boolean }
type Act = (ctx: { call: AdminCall; opts: Record<string, any>; args: string[]; out: (human: string, json: unknown) => void }) => Promise<void>;
/** Adds a verb under `parent`: see verbMaker. */
type Verb = (parent: Command, spec: string, description: string, act: Act) => Command;

/** Makes `verb`, which adds --console/--json and runs `act` with an API client, turning failures into a message and exit code 1. */
function verbMaker(io: CliIO): Verb {
  return (parent, spec, description, act) => {
    const cmd = parent.command(spec).description(description)
      .option('--console <url>', `console URL (default $${URL_ENV} or ${DEFAULT_CONSOLE_URL})`)
      .option('--json', 'print the API answer as JSON')
      .addHelpText('after', `\nThe admin (or user) token comes from $${TOKEN_ENV}, never from a flag.`);
    cmd.action(async (...raw: unknown[]) => {
      const self = raw[raw.length - 1] as Command;
      const opts = self.opts() as Common & Record<string, any>;
      const args = raw.slice(0, -2).map(String);
      try {
        const token = io.env[TOKEN_ENV];
        if (!token) throw new CliError(`set ${TOKEN_ENV} to an admin (or user) token of the console`);
        const call = adminClient({ url: opts.console ?? io.env[URL_ENV] ?? DEFAULT_CONSOLE_URL, token, fetch: io.fetch });
        const out = (human: string, json: unknown) => io.stdout(opts.json ? JSON.stringify(json, null, 2) + '\n' : human);
        await act({ call, opts, args, out });
      } catch (err) {
        if (!(err instanceof CliError)) throw err;
        io.stderr(`error: ${err.message}\n`);
        io.setExitCode(1);
      }
    });
    return cmd;
  };
}

export function registerConsoleCommands(program: Command, ioIn: Partial<CliIO> = {}): void {
  const io = resolveIO(ioIn);
  const verb = verbMaker(io);
  program.command('console').description('run the reference console (key store, admin API, sync feed)')
    .requiredOption('-c, --config <file>', 'console YAML config')
    .action(async (opts: { config: string }) => runConsole({ file: opts.config, io }));
  registerKeyVerbs(program, verb);
  registerProjectVerbs(program, verb);
  registerWalletVerbs(program, verb);
}

/** The settings `keys create` and `keys update` take. */
function withKeySettings(cmd: Command): Command {
  return cmd
    .option('--name <name>', 'label shown in listings')
    .option('--models <globs>', 'comma-separated model globs the key may use, or "all"')
    .option('--routing <mode>', 'upstream routing mode, or "none"')
    .option('--rpm <n>', 'requests per minute, or "none"')
    .option('--tpm <n>', 'tokens per minute, or "none"')
    .option('--concurrency <n>', 'requests in flight at once, or "none"')
    .option('--budget <amount>', 'team keys: spending limit, or "none"')
    .option('--budget-period <period>', 'team keys: the budget restarts each UTC day, week (from Monday) or month, or "none"')
    .option('--ips <cidrs>', 'comma-separated CIDR ranges the key works from, or "none"')
    .option('--allow-browser', 'let browsers use the key (requests with Origin or Sec-Fetch-Mode)')
    .option('--no-allow-browser', 'refuse browser requests (the default)')
    .option('--shadow <checks>', `comma-separated checks to evaluate without enforcing (${SHADOW_CHECKS.join(', ')}), or "none"`)
    .option('--model-limit <glob:limits>', 'per-model limits such as \'gpt-4o*:rpm=10,tpm=20000\' (repeatable, first match applies; "none" clears)', (v: string, prev: string[] = []) => [...prev, v]);
}

/** The API body for the key settings given on the command line (those left out are not sent). */
function keySettingsBody(o: Record<string, any>): Record<string, unknown> {
  return {
    ...(o.budgetPeriod !== undefined ? { period: budgetPeriodArg(o.budgetPeriod) } : {}),
    ...(o.ips !== undefined ? { ips: ipList(o.ips) } : {}),
    ...(o.allowBrowser !== undefined ? { allowBrowser: o.allowBrowser as boolean } : {}),
    ...(o.modelLimit !== undefined ? { modelLimits: modelLimits(o.modelLimit) } : {}),
    ...(o.shadow !== undefined ? { shadow: shadowList(o.shadow) } : {}),
    ...(o.name !== undefined ? { name: o.name === 'none' ? null : o.name } : {}),
    ...(o.models !== undefined ? { models: modelList(o.models) } : {}),
    ...(o.routing !== undefined ? { routing: o.routing === 'none' ? null : o.routing } : {}),
    ...(o.rpm !== undefined ? { rpm: numberOrNone('--rpm', { integer: true })(o.rpm) } : {}),
    ...(o.tpm !== undefined ? { tpm: numberOrNone('--tpm', { integer: true })(o.tpm) } : {}),
    ...(o.concurrency !== undefined ? { concurrency: numberOrNone('--concurrency', { integer: true })(o.concurrency) } : {}),
    ...(o.budget !== undefined ? { budget: numberOrNone('--budget')(o.budget) } : {}),
  };
}

function createdText(r: { key: KeyView; secret: string }): string {
  return `created ${r.key.kind} key ${r.key.id} for ${r.key.kind === 'personal' ? `user ${r.key.user}` : `project ${r.key.project}`}\n` +
    `key: ${r.secret}\n` +
    `(\`keyward keys reveal ${r.key.id}\` shows it again)\n`;
}

const enc = encodeURIComponent;

function registerKeyVerbs(program: Command, verb: Verb): void {
  const keys = program.command('keys').description('manage API keys on the console');
  withKeySettings(verb(keys, 'create', 'create a personal (--personal USER) or team (--team PROJECT) key', async ({ call, opts, out }) => {
    if (Boolean(opts.personal) === Boolean(opts.team)) throw new CliError('give exactly one of --personal USER or --team PROJECT');
    const owner = opts.personal ? { kind: 'personal', user: opts.personal } : { kind: 'team', project: opts.team };
    const r = await call('POST', '/admin/v1/keys', { ...owner, ...keySettingsBody(opts) });
    out(createdText(r), r);
  }).option('--personal <user>', 'a personal key of this user (spends from their wallet)').option('--team <project>', 'a team key of this project'));

  verb(keys, 'list', 'list keys', async ({ call, opts, out }) => {
    const q = new URLSearchParams({ ...(opts.user ? { user: opts.user } : {}), ...(opts.project ? { project: opts.project } : {}), ...(opts.all ? { all: '1' } : {}) });
    // Every page, in creation order (the console answers at most 1,000 keys a call).
    const keys: KeyView[] = [];
    for (;;) {
      const r = await call('GET', `/admin/v1/keys${q.size ? `?${q}` : ''}`);
      keys.push(...(r.keys as KeyView[]));
      if (typeof r.next !== 'string') break;
      q.set('after', r.next);
    }
    out(keysTable(keys), { keys });
  }).option('--user <user>', 'only this user\'s keys').option('--project <project>', 'only this project\'s keys').option('--all', 'include deleted keys');

  verb(keys, 'show <id>', 'show a key\'s settings and usage', async ({ call, args, out }) => {
    const r = await call('GET', `/admin/v1/keys/${enc(args[0]!)}`);
    out(keyDetails(r.key), r);
  });
  verb(keys, 'reveal <id>', 'print a key\'s secret again', async ({ call, args, out }) => {
    const r = await call('POST', `/admin/v1/keys/${enc(args[0]!)}/reveal`);
    out(`${r.secret}\n`, r);
  });
  withKeySettings(verb(keys, 'update <id>', 'change a key\'s settings', async ({ call, opts, args, out }) => {
    const body = keySettingsBody(opts);
    if (Object.keys(body).length === 0) throw new CliError('nothing to change: give at least one setting');
    const r = await call('PATCH', `/admin/v1/keys/${enc(args[0]!)}`, body);
    out(keyDetails(r.key), r);
  }));
  verb(keys, 'reset <id>', 'set a team key\'s spent back to 0 (sidecars restart its budget at once)', async ({ call, args, out }) => {
    const r = await call('POST', `/admin/v1/keys/${enc(args[0]!)}/reset`);
    out(keyDetails(r.key), r);
  });
  verb(keys, 'delete <id>', 'delete a key now (every synced sidecar refuses it within a second)', async ({ call, args, out }) => {
    const r = await call('DELETE', `/admin/v1/keys/${enc(args[0]!)}`);
    out(`deleted key ${r.key.id} (last used ${lastUsed(r.key)})\n`, r);
  });
  verb(keys, 'rotate <id>', 'create a replacement with the same settings; delete the old key once traffic has moved', async ({ call, args, out }) => {
    const r = await call('POST', `/admin/v1/keys/${enc(args[0]!)}/rotate`);
    out(
      createdText(r) +
        `old key ${r.replaces.id} stays active; last used: ${lastUsed(r.replaces)}\n` +
        `move clients to the new key, check with \`keyward keys show ${r.replaces.id}\` that its last use stops advancing, then run \`keyward keys delete ${r.replaces.id}\`\n`,
      r,
    );
  });
}

function registerProjectVerbs(program: Command, verb: Verb): void {
  const projects = program.command('projects').description('manage projects (team keys spend from them)');
  const showProject = (r: any) => projectsTable([r.project]);
  const budget = (o: Record<string, any>) => (o.budget !== undefined ? { budget: numberOrNone('--budget')(o.budget) } : {});
  const period = (o: Record<string, any>) => (o.budgetPeriod !== undefined ? { period: budgetPeriodArg(o.budgetPeriod) } : {});
  const periodHelp = 'the budget restarts each UTC day, week (from Monday) or month, or "none"';
  verb(projects, 'create <id>', 'create a project', async ({ call, opts: o, args, out }) => {
    const r = await call('POST', '/admin/v1/projects', { id: args[0], ...budget(o), ...period(o), ...(o.member ? { members: o.member } : {}) });
    out(showProject(r), r);
  }).option('--budget <amount>', 'spending limit, or "none"').option('--budget-period <period>', periodHelp).option('--member <user...>', 'users who may see the project\'s keys');
  verb(projects, 'list', 'list projects', async ({ call, out }) => {
    const r = await call('GET', '/admin/v1/projects');
    out(projectsTable(r.projects), r);
  });
  verb(projects, 'show <id>', 'show a project', async ({ call, args, out }) => {
    const r = await call('GET', `/admin/v1/projects/${enc(args[0]!)}`);
    out(showProject(r), r);
  });
  for (const status of ['enable', 'disable'] as const) {
    verb(projects, `${status} <id>`, status === 'enable' ? 'let the project\'s keys work again' : 'refuse model (402) and file (403) requests of the project\'s keys', async ({ call, args, out }) => {
      const r = await call('PATCH', `/admin/v1/projects/${enc(args[0]!)}`, { status: `${status}d` });
      out(showProject(r), r);
    });
  }
  verb(projects, 'budget <id> <amount>', 'set the project\'s spending limit ("none" for no limit)', async ({ call, opts: o, args, out }) => {
    const r = await call('PATCH', `/admin/v1/projects/${enc(args[0]!)}`, { budget: numberOrNone('amount')(args[1]!), ...period(o) });
    out(showProject(r), r);
  }).option('--budget-period <period>', periodHelp);
  verb(projects, 'update <id>', 'change a project\'s budget or budget period', async ({ call, opts: o, args, out }) => {
    const body = { ...budget(o), ...period(o) };
    if (Object.keys(body).length === 0) throw new CliError('nothing to change: give --budget or --budget-period');
    const r = await call('PATCH', `/admin/v1/projects/${enc(args[0]!)}`, body);
    out(showProject(r), r);
  }).option('--budget <amount>', 'spending limit, or "none"').option('--budget-period <period>', periodHelp);
  verb(projects, 'reset <id>', 'set the project\'s spent back to 0 (sidecars restart its budget at once)', async ({ call, args, out }) => {
    const r = await call('POST', `/admin/v1/projects/${enc(args[0]!)}/reset`);
    out(showProject(r), r);
  });
  for (const [name, method] of [['add-member', 'PUT'], ['remove-member', 'DELETE']] as const) {
    verb(projects, `${name} <id> <user>`, `${name === 'add-member' ? 'let a user see' : 'stop a user seeing'} the project's keys`, async ({ call, args, out }) => {
      const r = await call(method, `/admin/v1/projects/${enc(args[0]!)}/members/${enc(args[1]!)}`);
      out(showProject(r), r);
    });
  }
}

function amountArg(raw: string): number {
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n)) throw new CliError('amount must be a number');
  return n;
}

function registerWalletVerbs(program: Command, verb: Verb): void {
  const wallets = program.command('wallets').description('manage users\' wallets (personal keys spend from them)');
  verb(wallets, 'list', 'list wallets', async ({ call, out }) => {
    const r = await call('GET', '/admin/v1/wallets');
    out(walletsTable(r.wallets), r);
  });
  verb(wallets, 'show <user>', 'show a user\'s wallet', async ({ call, args, out }) => {
    const r = await call('GET', `/admin/v1/wallets/${enc(args[0]!)}`);
    out(walletsTable([r.wallet]), r);
  });
  verb(wallets, 'credit <user> <amount>', 'add to a user\'s balance', async ({ call, args, out }) => {
    const r = await call('POST', `/admin/v1/wallets/${enc(args[0]!)}/credit`, { amount: amountArg(args[1]!) });
    out(walletsTable([r.wallet]), r);
  });
  verb(wallets, 'set <user> <amount>', 'set a user\'s balance', async ({ call, args, out }) => {
    const r = await call('PUT', `/admin/v1/wallets/${enc(args[0]!)}`, { balance: amountArg(args[1]!) });
    out(walletsTable([r.wallet]), r);
  });
}

/** `keyward console`: runs until SIGTERM/SIGINT, then closes cleanly and exits 0. */
async function runConsole(opts: { file: string; io: CliIO }): Promise<void> {
  const { io } = opts;
  let config;
  try {
    config = loadConsoleConfig({ file: opts.file, env: io.env });
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    io.stderr(`${err.message}\n`);
    return io.setExitCode(1);
  }
  const log = pino({
    level: config.logging.level,
    base: { service: 'keyward-console' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
    redact: { paths: ['secret', '*.secret', 'token', '*.token', 'authorization', '*.authorization'], censor: '[redacted]' },
  });
  let running;
  try {
    running = await startConsole({ config, env: io.env, log });
  } catch (err) {
    if (!(err instanceof MasterKeyError) && !(err instanceof KeyHashingError) && (err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    io.stderr(`error: ${(err as Error).message}\n`);
    return io.setExitCode(1);
  }
  log.info({ url: running.url, store: config.store.path, hash: config.keys.hash }, 'console listening');
  const stop = (signal: string) => {
    log.info({ signal }, 'console shutting down');
    running.close().then(
      () => io.setExitCode(0),
      (err: Error) => {
        log.error({ err: err.message }, 'console shutdown failed');
        io.setExitCode(1);
      },
    );
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
  // SIGHUP's default would end the console; sidecars reload on it, the console does not.
  process.on('SIGHUP', () => log.warn({}, 'the console does not reload its config: restart it to apply a change'));
}

/**
 * The keyward command line: serve, import, check-config, demo, and (from the console
 * module) console, keys, projects, wallets.
 */
import cluster from 'node:cluster';
import { Command, InvalidArgumentError, Option } from 'commander';
import { ConfigError } from './config/load.js';
import { DEFAULT_REPLICA_PATH } from './config/schema.js';
import { serve, serveWorker } from './app/serve.js';
import { parseWorkers } from './app/workers.js';
import { importSnapshotFile, ImportError } from './app/import.js';
import { runDemo } from './app/demo.js';
import { registerConsoleCommands } from './app/console-cli.js';
import { checkConfig, replicaPathFor } from './app/config-files.js';

/** Runs `fn` until SIGTERM/SIGINT, then `stop` once, then exits 0. */
function untilSignal(stop: (signal: string) => Promise<void>): void {
  let stopping = false;
  const onSignal = (signal: string) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`keyward: ${signal}: draining\n`);
    stop(signal).then(
      () => process.exit(0),
      (err: Error) => {
        process.stderr.write(`keyward: shutdown failed: ${err.message}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
}

function fail(err: unknown): never {
  if (err instanceof ConfigError || err instanceof ImportError) {
    process.stderr.write(`${err.message}\n`);
  } else {
    process.stderr.write(`keyward: ${err instanceof Error ? err.message : String(err)}\n`);
  }
  process.exit(1);
}

function portNumber(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError('expected a port number from 0 to 65535.');
  return n;
}

/** `keyward serve`: one sidecar, or a cluster primary and its workers, until a signal. */
async function serveCommand(o: { config: string; workers: string }): Promise<void> {
  try {
    // A worker of the primary: the same command line, run again by node:cluster. Its config comes from the primary.
    if (cluster.isWorker) return await serveWorker();
    const serving = await serve({ file: o.config, workers: parseWorkers(o.workers) });
    untilSignal((signal) => serving.stop(signal));
  } catch (err) {
    // Before any logger exists: one line in the log's shape on stdout, where log shippers
    // read, beside the plain text fail() writes on stderr.
    const worker = cluster.isWorker ? { worker: cluster.worker!.id } : {};
    const line = { level: 'fatal', time: new Date().toISOString(), service: 'keyward', ...worker, msg: 'keyward start failed', err: err instanceof Error ? err.message : String(err) };
    process.stdout.write(`${JSON.stringify(line)}\n`);
    throw err;
  }
}

export function buildProgram(): Command {
  const program = new Command('keyward')
    .description('Authentication and limits sidecar for model gateways')
    .version('0.1.0')
    .showHelpAfterError();

  program
    .command('serve')
    .description('run the sidecar')
    .requiredOption('-c, --config <file>', 'YAML config file')
    .option('-w, --workers <n>', 'worker processes sharing the proxy port (a number, or "auto" for one per core); more than 1 needs redis', '1')
    .action(serveCommand);

  program
    .command('check-config')
    .description('validate a config file; exit 0 when valid, 1 with every problem otherwise')
    .requiredOption('-c, --config <file>', 'YAML config file')
    .option('--console', "validate it as the reference console's config (keyward console --config FILE)")
    .action((o: { config: string; console?: boolean }) => {
      checkConfig({ file: o.config, ...(o.console ? { console: true } : {}) });
      process.stdout.write(`${o.config}: ok\n`);
    });

  program
    .command('import')
    .description('apply a snapshot file (sync protocol v1 NDJSON) to the replica, atomically')
    .argument('<file>', 'snapshot file')
    .addOption(new Option('-c, --config <file>', 'config file naming replica.path').conflicts('replica'))
    .option('--replica <path>', `replica file (instead of --config; neither: ${DEFAULT_REPLICA_PATH}, the config's default)`)
    .action(async (file: string, o: { config?: string; replica?: string }) => {
      const path = replicaPathFor(o);
      // Every line is validated inside the one transaction: a bad file changes nothing.
      const counts = await importSnapshotFile({ replicaPath: path, file });
      process.stdout.write(`imported version ${counts.version}: ${counts.keys} keys, ${counts.projects} projects, ${counts.wallets} wallets into ${path}\n`);
    });

  registerConsoleCommands(program);

  program
    .command('demo')
    .description('run console, sidecar and a sample upstream on loopback with demo keys (no other services needed)')
    .option('--port <n>', 'proxy port (falls back to any free port when taken)', portNumber, 8080)
    .action(async (o: { port: number }) => {
      const demo = await runDemo({ port: o.port });
      untilSignal(() => demo.close());
    });

  return program;
}

const isMain = process.argv[1] !== undefined && /(cli\.[jt]s|keyward(\.mjs)?)$/.test(process.argv[1]);
if (isMain) {
  buildProgram().parseAsync(process.argv).catch(fail);
}

/**
 * One worker of the benchmark's `--workers N` keyward (bench/servers/keyward.ts is the
 * primary): runWorker, as `keyward serve` runs it in a worker, with the config the primary
 * sends and its access log formatted as in production but written to /dev/null.
 */
import cluster from 'node:cluster';
import { load } from './build.js';

const [{ createLogger, logDestination }, { runWorker }] = await Promise.all([
  load<typeof import('../../src/obs/logger.js')>('obs/logger.js'),
  load<typeof import('../../src/app/worker.js')>('app/worker.js'),
]);

await runWorker({ logger: () => createLogger({ level: 'info', destination: logDestination('/dev/null', { shared: true }), fields: { worker: cluster.worker!.id }, shared: true }) });

/**
 * `keyward serve`: one sidecar, or a cluster primary and its workers, reloading the config
 * file on SIGHUP and when it changes (DESIGN section 12). In a worker, the config comes
 * from the primary, never from the file.
 */
import cluster from 'node:cluster';
import { loadConfig } from '../config/file.js';
import { createLogger, flushed, type Logger } from '../obs/logger.js';
import { holdSighup, startReloading } from './reload.js';
import { startSidecar } from './sidecar.js';
import { runWorker } from './worker.js';
import { startWorkers } from './workers.js';

export interface Serving {
  /** stops reloading, drains in-flight requests within server.shutdownGraceMs, flushes the log; `signal` is logged */
  stop(signal?: string): Promise<void>;
}

/** The stop of a serving process: its start and any failure go to the JSON log too, where log shippers read. */
function stopping(logger: Logger, close: () => Promise<void>): Serving['stop'] {
  return async (signal) => {
    logger.info({ signal: signal ?? null }, 'keyward draining');
    try {
      await close();
    } catch (err) {
      logger.error({ err: err instanceof Error ? err.message : String(err) }, 'keyward shutdown failed');
      throw err;
    } finally {
      await flushed(logger);
    }
  };
}

/** A cluster worker: runs until the primary tells it to drain, or a signal does. */
export async function serveWorker(): Promise<void> {
  await runWorker({ logger: (config) => createLogger({ level: config.logging.level, fields: { worker: cluster.worker!.id }, shared: true }) });
}

export async function serve(o: { file: string; workers: number }): Promise<Serving> {
  holdSighup();
  const loaded = loadConfig(o.file);
  const { config } = loaded;
  if (o.workers > 1) {
    const logger = createLogger({ level: config.logging.level, fields: { worker: 0 }, shared: true });
    const pool = await startWorkers({ config, logger, workers: o.workers });
    const reloader = startReloading({ file: o.file, loaded, log: logger, metrics: pool.metrics, apply: (c) => pool.reconfigure(c) });
    logger.info({ listen: pool.url, admin_port: pool.adminPort, workers: o.workers, pids: pool.pids(), config_hash: loaded.hash }, 'keyward listening');
    return {
      stop: stopping(logger, async () => {
        reloader.close();
        await pool.close();
      }),
    };
  }
  const logger = createLogger({ level: config.logging.level });
  const sidecar = await startSidecar({ config, logger });
  const reloader = startReloading({ file: o.file, loaded, log: logger, metrics: sidecar.metrics, apply: (c) => sidecar.reconfigure(c) });
  logger.info({ listen: sidecar.url, admin_port: sidecar.adminPort, config_hash: loaded.hash }, 'keyward listening');
  return {
    stop: stopping(logger, async () => {
      reloader.close();
      await sidecar.close();
    }),
  };
}

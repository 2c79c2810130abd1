/**
 * The config files the verbs read: the sidecar's (`serve`, `check-config`, `import
 * --config`) and the console's (`console`, `check-config --console`), each validated as
 * its process validates it at start.
 */
import { CONSOLE_ENV_DEFAULTS, loadConfig, loadConfigFile } from '../config/file.js';
import { DEFAULT_REPLICA_PATH } from '../config/schema.js';
import { consoleConfigSchema, type ConsoleConfig } from '../console/config.js';

export function loadConsoleConfig(opts: { file: string; env?: NodeJS.ProcessEnv }): ConsoleConfig {
  return loadConfigFile({ file: opts.file, schema: consoleConfigSchema, envDefaults: CONSOLE_ENV_DEFAULTS, ...(opts.env ? { env: opts.env } : {}) });
}

/** `check-config`: throws ConfigError naming every problem, as a reload or a start would. */
export function checkConfig(o: { file: string; console?: boolean }): void {
  if (o.console) loadConsoleConfig({ file: o.file });
  else loadConfig(o.file);
}

/** The replica an import writes: `--replica`, else the config's `replica.path`, else the default. */
export function replicaPathFor(o: { replica?: string; config?: string }): string {
  return o.replica ?? (o.config ? loadConfig(o.config).config.replica.path : DEFAULT_REPLICA_PATH);
}

/**
 * Config files read (the sidecar's and the console's). The sidecar's as `serve`,
 * `check-config` and a reload read it: one read, the
 * strict validation of load.ts against the sidecar's schema, and the hash of the very bytes
 * that were validated (keyward_config_info shows it, so an operator can tell which file
 * is in force).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { z } from 'zod';
import { ConfigError, parseConfigText, type EnvDefault } from './load.js';
import { configSchema, type Config } from './schema.js';

export interface LoadedConfig {
  config: Config;
  /** sha256 of the file's bytes, first 12 hex digits */
  hash: string;
}

/** The first 12 hex digits of the sha256 of a config file's bytes. */
export function configHash(bytes: Buffer | string): string {
  return createHash('sha256').update(bytes).digest('hex').slice(0, 12);
}

/** Values DESIGN section 2 gives as environment references, taken when a block leaves them out. */
export const SIDECAR_ENV_DEFAULTS: readonly EnvDefault[] = [
  { block: 'console', key: 'token', variable: 'KEYWARD_SYNC_TOKEN' },
  { block: 'keys', key: 'pepper', variable: 'KEYWARD_KEY_PEPPER', when: (keys) => keys.hash === 'hmac-sha256' },
];

/** The file's bytes (through any symlinks); throws ConfigError when it cannot be read. */
export function readConfigFile(file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new ConfigError(file, [`cannot read file: ${(err as NodeJS.ErrnoException).code ?? String(err)}`]);
  }
}

export function loadConfigFile<T>(opts: { file: string; schema: z.ZodType<T>; env?: NodeJS.ProcessEnv; envDefaults?: readonly EnvDefault[] }): T {
  const text = readConfigFile(opts.file).toString('utf8');
  return parseConfigText({ text, file: opts.file, schema: opts.schema, ...(opts.env ? { env: opts.env } : {}), ...(opts.envDefaults ? { envDefaults: opts.envDefaults } : {}) });
}

/** The console's: its pepper as the sidecar's, since the two must hash keys alike. */
export const CONSOLE_ENV_DEFAULTS: readonly EnvDefault[] = SIDECAR_ENV_DEFAULTS.filter((d) => d.block === 'keys');

/** Top-level keys only the console's config has: a file with them was given to the wrong verb. */
const CONSOLE_ONLY = ['listen: unknown key', 'store: unknown key', 'pricing: unknown key'];

/** Reads and validates the file; throws ConfigError naming every problem. */
export function loadConfig(file: string, env: NodeJS.ProcessEnv = process.env): LoadedConfig {
  const bytes = readConfigFile(file);
  try {
    return { config: parseConfigText({ text: bytes.toString('utf8'), file, schema: configSchema, env, envDefaults: SIDECAR_ENV_DEFAULTS }), hash: configHash(bytes) };
  } catch (err) {
    if (!(err instanceof ConfigError) || !err.problems.some((p) => CONSOLE_ONLY.includes(p))) throw err;
    throw new ConfigError(file, [...err.problems, 'this looks like the console\'s config: check it with `keyward check-config --console --config FILE`, run it with `keyward console --config FILE`']);
  }
}

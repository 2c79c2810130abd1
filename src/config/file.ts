/**
 * The sidecar's config file as `serve`, `check-config` and a reload read it: one read, the
 * strict validation of load.ts against the sidecar's schema, and the hash of the very bytes
 * that were validated (keyward_config_info shows it, so an operator can tell which file
 * is in force).
 */
import { createHash } from 'node:crypto';
import { parseConfigText, readConfigFile, type EnvDefault } from './load.js';
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

/** Reads and validates the file; throws ConfigError naming every problem. */
export function loadConfig(file: string, env: NodeJS.ProcessEnv = process.env): LoadedConfig {
  const bytes = readConfigFile(file);
  return { config: parseConfigText({ text: bytes.toString('utf8'), file, schema: configSchema, env, envDefaults: SIDECAR_ENV_DEFAULTS }), hash: configHash(bytes) };
}

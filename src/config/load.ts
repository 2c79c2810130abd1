/**
 * YAML config loading (DESIGN section 2): `${VAR}` and `${VAR:-default}` expansion from
 * the environment, then strict validation. Every problem is collected and reported
 * together, each naming the file, the key path and what was expected.
 */
import { readFileSync } from 'node:fs';
import { parseDocument } from 'yaml';
import type { z } from 'zod';

export class ConfigError extends Error {
  constructor(
    readonly file: string,
    readonly problems: string[],
  ) {
    super(`${file}: ${problems.length} problem${problems.length === 1 ? '' : 's'}\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

const VAR = /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g;

/** Expands variables in every string scalar; an unset variable without a default is a problem. */
function expand(value: unknown, path: string[], env: NodeJS.ProcessEnv, problems: string[]): unknown {
  if (typeof value === 'string') {
    let missing = false;
    const out = value.replace(VAR, (_m, name: string, def: string | undefined) => {
      const v = env[name];
      if (v !== undefined && v !== '') return v;
      if (def !== undefined) return def;
      problems.push(`${path.join('.') || '(root)'}: environment variable ${name} is not set and has no default`);
      missing = true;
      return '';
    });
    if (missing) return undefined;
    // A whole-value substitution of a number or boolean keeps YAML's typing, so `port: ${PORT:-8080}` is a number.
    if (out !== value && /^\$\{[^}]+\}$/.test(value)) {
      if (/^-?\d+(\.\d+)?$/.test(out)) return Number(out);
      if (out === 'true' || out === 'false') return out === 'true';
    }
    return out;
  }
  if (Array.isArray(value)) return value.map((v, i) => expand(v, [...path, String(i)], env, problems));
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = expand(v, [...path, k], env, problems);
    return out;
  }
  return value;
}

function zodProblems(error: z.ZodError): string[] {
  const out: string[] = [];
  for (const issue of error.issues) {
    const path = issue.path.map(String).join('.') || '(root)';
    if (issue.code === 'unrecognized_keys') {
      for (const k of issue.keys) out.push(`${path === '(root)' ? k : `${path}.${k}`}: unknown key`);
    } else {
      out.push(`${path}: ${issue.message}`);
    }
  }
  return out;
}

/** Parses YAML text against a schema; throws ConfigError with every problem found. */
export function parseConfigText<T>(opts: { text: string; file: string; schema: z.ZodType<T>; env?: NodeJS.ProcessEnv }): T {
  const doc = parseDocument(opts.text, { uniqueKeys: true });
  if (doc.errors.length > 0) {
    throw new ConfigError(opts.file, doc.errors.map((e) => `YAML: ${e.message.split('\n')[0]}`));
  }
  const problems: string[] = [];
  const expanded = expand(doc.toJS() ?? {}, [], opts.env ?? process.env, problems);
  const result = opts.schema.safeParse(expanded);
  if (!result.success) {
    // A missing variable is already reported; zod's "received undefined" for that key would be noise.
    const reported = new Set(problems.map((p) => p.slice(0, p.indexOf(':'))));
    problems.push(...zodProblems(result.error).filter((p) => !reported.has(p.slice(0, p.indexOf(':')))));
  }
  if (problems.length > 0 || !result.success) throw new ConfigError(opts.file, problems);
  return result.data;
}

export function loadConfigFile<T>(opts: { file: string; schema: z.ZodType<T>; env?: NodeJS.ProcessEnv }): T {
  let text: string;
  try {
    text = readFileSync(opts.file, 'utf8');
  } catch (err) {
    throw new ConfigError(opts.file, [`cannot read file: ${(err as NodeJS.ErrnoException).code ?? String(err)}`]);
  }
  return parseConfigText({ text, file: opts.file, schema: opts.schema, ...(opts.env ? { env: opts.env } : {}) });
}

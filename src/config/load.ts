/**
 * YAML config loading (DESIGN section 2): `${VAR}` and `${VAR:-default}` expansion from
 * the environment, then strict validation. Every problem is collected and reported
 * together, each naming the file, the key path and what was expected. Text in, value out:
 * file.ts reads the files.
 */
import { parseDocument } from 'yaml';
import type { z } from 'zod';
import { lineColOf, recoverable, yamlProblems } from './yaml-problems.js';

export class ConfigError extends Error {
  constructor(
    readonly file: string,
    readonly problems: string[],
  ) {
    super(`${file}: ${problems.length} problem${problems.length === 1 ? '' : 's'}\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/**
 * A supported reference (`${VAR}`, `${VAR:-default}`), or any other `${...}` on one line,
 * which is hidden too so that it reaches the "no supported reference" problem rather
 * than breaking a flow mapping (`{ token: ${VAR:?msg} }`) into YAML errors. A reference
 * ends on its line: an unclosed one would otherwise take every line up to the next `}`
 * as its default, a comment's included.
 */
const REFERENCE = /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}\n]*))?\}|\$\{[^{}\n]*\}/g;

interface Reference {
  /** null: a `${...}` form that is not expanded */
  name: string | null;
  fallback: string | undefined;
}

/** Where a placeholder stands in the hidden text and the reference it replaced in the file. */
interface Span {
  hiddenAt: number;
  hiddenEnd: number;
  fileAt: number;
  fileEnd: number;
}

/** The references of one text, and the mark their placeholders start with (`__<mark><index>__`). */
interface Hidden {
  text: string;
  refs: Reference[];
  spans: Span[];
  mark: string;
  placeholder: RegExp;
}

/**
 * Swaps each `${...}` for a YAML-safe placeholder before parsing, so a reference may
 * stand anywhere, even inside a flow mapping (`{ token: ${TOKEN} }`), and a value with
 * YAML syntax in it (`#`, `:`, `{`) cannot change the document's structure. The mark is
 * one the text does not contain, so text written literally is never taken for one.
 */
function hideReferences(text: string): Hidden {
  let mark = 'KWENV';
  while (text.includes(`__${mark}`)) mark += 'X';
  const refs: Reference[] = [];
  const spans: Span[] = [];
  let shift = 0;
  const out = text.replace(REFERENCE, (m: string, name: string | undefined, fallback: string | undefined, offset: number) => {
    refs.push({ name: name ?? null, fallback });
    const placeholder = `__${mark}${refs.length - 1}__`;
    spans.push({ hiddenAt: offset + shift, hiddenEnd: offset + shift + placeholder.length, fileAt: offset, fileEnd: offset + m.length });
    shift += placeholder.length - m.length;
    return placeholder;
  });
  return { text: out, refs, spans, mark, placeholder: new RegExp(`__${mark}(\\d+)__`, 'g') };
}

/** The file's offset for an offset into the hidden text (inside a placeholder: its reference's start). */
function fileOffset(hidden: Hidden, at: number): number {
  let span: Span | undefined;
  for (const s of hidden.spans) {
    if (s.hiddenAt > at) break;
    span = s;
  }
  if (!span) return at;
  return at < span.hiddenEnd ? span.fileAt : at - span.hiddenEnd + span.fileEnd;
}

/**
 * Puts the environment's values where the placeholders stand. Values stay strings;
 * numeric keys of the schema accept numeric strings, so `port: ${PORT:-8080}` works
 * while an all-digit token stays a string.
 */
interface ExpandContext {
  path: string[];
  hidden: Hidden;
  env: NodeJS.ProcessEnv;
  problems: string[];
  /** paths whose value a missing variable left out: the schema's complaints there are noise */
  missingAt?: Set<string>;
  /** key paths (pathKey) whose last name a reference gave, to the text written for it (shown) */
  written: Map<string, string>;
}

/** A path as the map of written names keys it: the same name elsewhere in the tree is another key. */
const pathKey = (path: readonly PropertyKey[]): string => path.map(String).join('\u0000');

/**
 * A path as problems name it. A key a reference gave is shown as written (`${NAME}`): its
 * value may be a secret (`token:${TOKEN}`, a colon without its space, is one key). A key
 * with a colon in it is shown up to the colon, for the same reason.
 */
function shown(path: readonly PropertyKey[], written: ReadonlyMap<string, string>): string {
  const segs = path.map((seg, i) => {
    const s = String(seg);
    const w = written.get(pathKey(path.slice(0, i + 1)));
    if (w !== undefined) return w;
    const colon = s.indexOf(':');
    return colon === -1 ? s : `${s.slice(0, colon)}:… (a space missing after ':'?)`;
  });
  return segs.join('.') || '(root)';
}

/** A string's references put in; undefined (each problem reported) when one cannot be. */
function expandString(value: string, ctx: ExpandContext): string | undefined {
  let missing = false;
  let unsupported = false;
  const out = value.replace(ctx.hidden.placeholder, (_m, i: string) => {
    const ref = ctx.hidden.refs[Number(i)]!;
    if (ref.name === null) {
      unsupported = true;
      return '';
    }
    // `${A:-${B}}` would give the literal text `${B}` (the default ends at the first `}`).
    if (ref.fallback?.includes('${')) {
      ctx.problems.push(`${shown(ctx.path, ctx.written)}: the default of \${${ref.name}:-...} holds another reference; nested references are not expanded`);
      missing = true;
      return '';
    }
    const v = ctx.env[ref.name];
    if (v !== undefined && v !== '') return v;
    if (ref.fallback !== undefined) return ref.fallback;
    ctx.problems.push(`${shown(ctx.path, ctx.written)}: environment variable ${ref.name} is ${v === '' ? 'empty' : 'not set'} and has no default`);
    missing = true;
    return '';
  });
  // Any other form (`${VAR:?msg}`, `${VAR-x}`, `${ VAR }`) would stay as literal text, a token or URL no one meant.
  if (unsupported || value.includes('${')) {
    ctx.problems.push(`${shown(ctx.path, ctx.written)}: "\${" starts no supported reference; only \${VAR} and \${VAR:-default} are expanded`);
    missing = true;
  }
  if (missing) ctx.missingAt?.add(ctx.path.join('.') || '(root)');
  return missing ? undefined : out;
}

function expand(value: unknown, ctx: ExpandContext): unknown {
  if (typeof value === 'string') return expandString(value, ctx);
  if (Array.isArray(value)) return value.map((v, i) => expand(v, { ...ctx, path: [...ctx.path, String(i)] }));
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    // names a reference gave: a written key of the same name, before or after, is a clash
    const referencedNames = new Set<string>();
    for (const [k, v] of Object.entries(value)) {
      // A reference may name a key too (`${MODE}: { url: ... }`); one that is not set drops
      // the entry, reported, after its value's own references are checked.
      const referenced = k.includes(`__${ctx.hidden.mark}`);
      const name = referenced ? (expand(k, { ...ctx, missingAt: undefined }) as string | undefined) : k;
      const written = referenced ? k.replace(ctx.hidden.placeholder, (_m, i: string) => `\${${ctx.hidden.refs[Number(i)]!.name ?? '...'}}`) : k;
      if (name === undefined) {
        expand(v, { ...ctx, path: [...ctx.path, written] });
        continue;
      }
      if (referenced) ctx.written.set(pathKey([...ctx.path, name]), written);
      if (Object.hasOwn(out, name) && (referenced || referencedNames.has(name))) {
        ctx.problems.push(`${shown([...ctx.path, name], ctx.written)}: named twice once references are expanded`);
        continue;
      }
      if (referenced) referencedNames.add(name);
      // Defined, not assigned: assigning `__proto__` would set the prototype, and zod would
      // read its members one level up instead of reporting an unknown key.
      Object.defineProperty(out, name, { value: expand(v, { ...ctx, path: [...ctx.path, name] }), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  return value;
}

const UNKNOWN_KEY = ': unknown key';

/** The schema's problems, each with the path it is at (as the tree has it) and its line (as shown). */
function zodProblems(error: z.ZodError, written: ReadonlyMap<string, string>): { at: string; line: string }[] {
  const out: { at: string; line: string }[] = [];
  for (const issue of error.issues) {
    const at = issue.path.map(String).join('.') || '(root)';
    const path = shown(issue.path, written);
    if (issue.code === 'unrecognized_keys') {
      for (const k of issue.keys) out.push({ at: '', line: `${shown([...issue.path, k], written)}${UNKNOWN_KEY}` });
    } else if (issue.code === 'invalid_key') {
      // zod's own message says only "Invalid key in record"; what was expected is in the issue under it
      out.push({ at, line: `${path}: ${issue.issues[0]?.message ?? issue.message}` });
    } else {
      out.push({ at, line: `${path}: ${issue.message}` });
    }
  }
  return out;
}

/**
 * A value a block takes from the environment when the file leaves it out (DESIGN section
 * 2 gives `console.token` as `${KEYWARD_SYNC_TOKEN}`): only inside a block the file has.
 */
export interface EnvDefault {
  block: string;
  key: string;
  variable: string;
  /** only for a block like this (e.g. a pepper only where the hash uses one) */
  when?: (block: Record<string, unknown>) => boolean;
}

function applyEnvDefaults(doc: unknown, defaults: readonly EnvDefault[], env: NodeJS.ProcessEnv): void {
  if (typeof doc !== 'object' || doc === null) return;
  for (const d of defaults) {
    const block = (doc as Record<string, unknown>)[d.block];
    const value = env[d.variable];
    if (typeof block !== 'object' || block === null || Array.isArray(block) || value === undefined || value === '') continue;
    if (Object.hasOwn(block, d.key) || (d.when && !d.when(block as Record<string, unknown>))) continue;
    (block as Record<string, unknown>)[d.key] = value;
  }
}

/**
 * The parsed tree and the YAML problems. A recoverable problem leaves a tree to validate
 * beside it; any other leaves none, as what follows it cannot be trusted to mean anything.
 */
function parseYaml(hidden: Hidden, fileText: string): { tree: unknown; problems: string[] } {
  const doc = parseDocument(hidden.text, { uniqueKeys: true });
  // Warnings count: an unknown tag (`!env X`) would otherwise be read as the text after it.
  const errors = [...doc.errors, ...doc.warnings];
  const problems = yamlProblems(errors, (at) => lineColOf(fileText, fileOffset(hidden, at)));
  if (!errors.every(recoverable)) return { tree: undefined, problems };
  try {
    return { tree: doc.toJS() ?? {}, problems };
  } catch (err) {
    // An alias to no anchor, or one that expands past the parser's limit. What follows a
    // `:` in the message is the file's own text.
    return { tree: undefined, problems: [...problems, `YAML: ${(err as Error).message.split(/[:\n]/)[0]}`] };
  }
}

/** Parses YAML text against a schema; throws ConfigError with every problem found. */
export function parseConfigText<T>(opts: { text: string; file: string; schema: z.ZodType<T>; env?: NodeJS.ProcessEnv; envDefaults?: readonly EnvDefault[] }): T {
  const hidden = hideReferences(opts.text);
  const { tree, problems } = parseYaml(hidden, opts.text);
  if (tree === undefined) throw new ConfigError(opts.file, problems);
  const env = opts.env ?? process.env;
  const missingAt = new Set<string>();
  const written = new Map<string, string>();
  const expanded = expand(tree, { path: [], hidden, env, problems, missingAt, written });
  applyEnvDefaults(expanded, opts.envDefaults ?? [], env);
  const result = opts.schema.safeParse(expanded);
  if (!result.success) {
    // A missing variable is already reported; the schema's "required" for the value it left
    // out would be noise. A key that is unknown is a problem of its own, whatever its value.
    problems.push(...zodProblems(result.error, written).filter((p) => !missingAt.has(p.at)).map((p) => p.line));
  }
  if (problems.length > 0 || !result.success) throw new ConfigError(opts.file, problems);
  return result.data;
}

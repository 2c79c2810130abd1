/**
 * The YAML parser's errors as config problems. A config file holds secrets (tokens, Redis
 * passwords, webhook secrets), and the parser's own messages quote the text they stumbled
 * on; a problem here says where (line and column of the file as written) and what kind
 * of mistake, in words of its own, and never quotes the file.
 */
import type { ErrorCode, YAMLError } from 'yaml';

/** What each kind of YAML error means, in words that quote nothing of the file. */
const PHRASES: Record<ErrorCode, string> = {
  ALIAS_PROPS: 'an alias (*name) may not have an anchor or a tag',
  BAD_ALIAS: 'an alias or anchor name is empty or ends in ":"',
  BAD_COLLECTION_TYPE: 'a tag that does not fit the mapping or list it is on',
  BAD_DIRECTIVE: 'a % directive YAML does not know',
  BAD_DQ_ESCAPE: 'an invalid \\ escape in a double-quoted string',
  BAD_INDENT: 'bad indentation (is a {...} or [...] left open, or a line indented too little?)',
  BAD_PROP_ORDER: 'an anchor or tag before the indicator it belongs after',
  BAD_SCALAR_START: 'a value starts with a character YAML reserves (quote the value)',
  BLOCK_AS_IMPLICIT_KEY: 'a nested mapping where a plain value was expected (quote the value, or put the mapping on its own lines)',
  BLOCK_IN_FLOW: 'an indented block inside {...} or [...]',
  DUPLICATE_KEY: 'a key named twice in the same mapping',
  IMPOSSIBLE: 'text YAML cannot read here',
  KEY_OVER_1024_CHARS: 'a key longer than 1024 characters',
  MISSING_CHAR: 'a missing character (a closing quote, a "," or ":" between items, or a space after ":")',
  MULTILINE_IMPLICIT_KEY: 'a key that runs over more than one line (is a ":" or an indentation wrong?)',
  MULTIPLE_ANCHORS: 'more than one anchor on one value',
  MULTIPLE_DOCS: 'more than one YAML document in the file',
  MULTIPLE_TAGS: 'more than one tag on one value',
  NON_STRING_KEY: 'a key that is not a plain string',
  RESOURCE_EXHAUSTION: 'aliases that expand past the parser\'s limit',
  TAB_AS_INDENT: 'a tab used as indentation (use spaces)',
  TAG_RESOLVE_FAILED: 'an unknown tag (such as !env): only ${VAR} and ${VAR:-default} take values from the environment',
  UNEXPECTED_TOKEN: 'unexpected text (a bracket, brace or quote left open or closed twice?)',
};

/** One mistake can set off errors on every line after it; the first few lines locate it. */
const MAX_LINES_SHOWN = 5;

export interface LineCol {
  line: number;
  col: number;
}

/**
 * One problem per line with errors (the first error on it), at most a handful, then how
 * many more lines have errors. `at` turns a parser offset into the file's line and column.
 */
export function yamlProblems(errors: readonly YAMLError[], at: (offset: number) => LineCol): string[] {
  const byLine = new Map<number, string>();
  for (const e of [...errors].sort((a, b) => a.pos[0] - b.pos[0])) {
    const { line, col } = at(e.pos[0]);
    if (!byLine.has(line)) byLine.set(line, `YAML: line ${line}, column ${col}: ${PHRASES[e.code] ?? 'a YAML syntax error'}`);
  }
  const out = [...byLine.values()];
  if (out.length <= MAX_LINES_SHOWN) return out;
  const rest = out.length - MAX_LINES_SHOWN;
  return [...out.slice(0, MAX_LINES_SHOWN), `YAML: ${rest} more line${rest === 1 ? '' : 's'} with problems, not listed (often follow-ons of the ones above)`];
}

/** Whether the parsed document still means what the file says apart from these problems. */
export function recoverable(e: YAMLError): boolean {
  // A warning leaves the document whole; a key named twice leaves one of its values.
  return e.name === 'YAMLWarning' || e.code === 'DUPLICATE_KEY';
}

/** Line and column (both from 1) of an offset into `text`. */
export function lineColOf(text: string, offset: number): LineCol {
  let line = 1;
  let lineStart = 0;
  for (let i = text.indexOf('\n'); i !== -1 && i < offset; i = text.indexOf('\n', i + 1)) {
    line++;
    lineStart = i + 1;
  }
  return { line, col: offset - lineStart + 1 };
}

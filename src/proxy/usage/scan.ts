/**
 * Finds a whole JSON response's top-level `usage` and `response` values without parsing
 * the rest of it. JSON.parse of a whole response body, to read one small object at its
 * end, would build every choice, message and string only to drop them, on every
 * response. This walks the bytes once, tracking strings and nesting, and hands back where
 * the two values lie, so only they are parsed. Pure.
 *
 * It answers only for a body that is one object with balanced, matching brackets (nested
 * at most 31 deep) and nothing but whitespace after it, whose top-level keys have no
 * escapes; anything else returns null and the caller parses the body whole.
 */

/** Where a value lies in the body: [start, end), whitespace around it included. */
export type Span = readonly [number, number];

export interface TopLevelSpans {
  /** the last top-level `usage` value (JSON.parse keeps the last of duplicate keys) */
  usage: Span | null;
  /** the last top-level `response` value (the responses API nests its usage there) */
  response: Span | null;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const USAGE = Buffer.from('usage');
const RESPONSE = Buffer.from('response');
/**
 * How far a string is walked byte by byte before the rest is searched natively: most of a
 * response's strings (keys, ids, roles) are shorter, and a native call per string costs
 * more than walking them; long texts are left to the native search.
 */
const SHORT_STRING = 32;

const isSpace = (c: number): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** Index of the quote that closes the string opened at `open`, or -1. */
function stringEnd(buf: Buffer, open: number): number {
  const walkTo = Math.min(buf.length, open + 1 + SHORT_STRING);
  let j = open + 1;
  for (; j < walkTo; j++) {
    const c = buf[j]!;
    if (c === QUOTE) return j;
    if (c === BACKSLASH) j++; // the escaped byte is never the end
  }
  if (j >= buf.length) return -1;
  // j is the first byte not yet read; a quote is escaped when an odd run of backslashes ends at it
  for (let q = buf.indexOf(QUOTE, j); q !== -1; q = buf.indexOf(QUOTE, q + 1)) {
    let slashes = 0;
    while (buf[q - 1 - slashes] === BACKSLASH) slashes++;
    if (slashes % 2 === 0) return q;
  }
  return -1;
}

/** Whether buf[from, from + word.length) holds exactly the bytes of `word`. */
function spells(buf: Buffer, from: number, word: Buffer): boolean {
  for (let k = 0; k < word.length; k++) if (buf[from + k] !== word[k]) return false;
  return true;
}

/** Which of the two wanted keys the string buf[from, to) is: 1 usage, 2 response, 0 neither, -1 escaped. */
function keyOf(buf: Buffer, from: number, to: number): number {
  const len = to - from;
  if (len === USAGE.length && spells(buf, from, USAGE)) return 1;
  if (len === RESPONSE.length && spells(buf, from, RESPONSE)) return 2;
  // an escaped key could spell either one: the caller parses the body whole instead
  for (let k = from; k < to; k++) if (buf[k] === BACKSLASH) return -1;
  return 0;
}

/** Deepest nesting walked: each open bracket's kind is a bit of one integer. */
const MAX_DEPTH = 31;

/**
 * The walk keeps its state in plain locals, with no closure over them and no array of open
 * brackets: it runs on every JSON response, and both cost it time (docs/performance.md,
 * "Other cuts on the request path").
 */
export function topLevelSpans(buf: Buffer): TopLevelSpans | null {
  const n = buf.length;
  let i = 0;
  while (i < n && isSpace(buf[i]!)) i++;
  if (buf[i] !== 0x7b) return null; // not an object
  /** how many brackets are open, and bit d set when the one at depth d is `{` (clear: `[`) */
  let depth = 0;
  let kinds = 0;
  let usage: Span | null = null;
  let response: Span | null = null;
  let expectKey = false;
  /** the wanted key whose value is being read (0: none), and where that value began */
  let pending = 0;
  let valueStart = -1;
  for (; i < n; i++) {
    const c = buf[i]!;
    if (c === QUOTE) {
      const end = stringEnd(buf, i);
      if (end === -1) return null;
      if (expectKey && depth === 1) {
        const key = keyOf(buf, i + 1, end);
        if (key === -1) return null;
        pending = key;
      }
      expectKey = false;
      i = end;
    } else if (c === 0x7b || c === 0x5b) {
      if (depth === MAX_DEPTH) return null;
      kinds = c === 0x7b ? kinds | (1 << depth) : kinds & ~(1 << depth);
      depth++;
      expectKey = c === 0x7b;
    } else if (c === 0x7d || c === 0x5d) {
      if (depth === 0) return null;
      depth--;
      if (((kinds >> depth) & 1) !== (c === 0x7d ? 1 : 0)) return null; // `}` closes `{`, `]` closes `[`
      if (depth === 0) {
        if (pending === 1) usage = [valueStart, i];
        else if (pending === 2) response = [valueStart, i];
        for (i++; i < n; i++) if (!isSpace(buf[i]!)) return null;
        return { usage, response };
      }
    } else if (c === 0x2c) {
      if (depth === 1) {
        if (pending === 1) usage = [valueStart, i];
        else if (pending === 2) response = [valueStart, i];
        pending = 0;
      }
      expectKey = ((kinds >> (depth - 1)) & 1) === 1;
    } else if (c === 0x3a && depth === 1) {
      valueStart = i + 1;
    }
  }
  return null; // cut short
}

// ---- a window cut from a larger body -----------------------------------------------------

/** The last `"usage": {...}` object in `text` that parses, or undefined. */
export function lastUsageObject(text: string): unknown {
  for (let i = text.lastIndexOf('"usage"'); i >= 0; i = i > 0 ? text.lastIndexOf('"usage"', i - 1) : -1) {
    if (text[i - 1] === '\\') continue; // inside a string, escaped
    let j = i + 7;
    while (/\s/.test(text[j] ?? '')) j++;
    if (text[j] !== ':') continue;
    j++;
    while (/\s/.test(text[j] ?? '')) j++;
    if (text[j] !== '{') continue;
    const end = closingBrace(text, j);
    if (end < 0) continue;
    try {
      return JSON.parse(text.slice(j, end + 1));
    } catch {
      // not a real object; try an earlier occurrence
    }
  }
  return undefined;
}

function closingBrace(text: string, open: number): number {
  let depth = 0;
  let inString = false;
  for (let k = open; k < text.length; k++) {
    const c = text[k];
    if (inString) {
      if (c === '\\') k++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{') depth++;
    else if (c === '}' && --depth === 0) return k;
  }
  return -1;
}

/**
 * The one strict reading of a JSON model request (DESIGN section 5, step 6), shared by
 * admission and billing. A body that a common upstream decoder could read differently
 * is refused rather than guessed at: invalid UTF-8, a byte order mark, lone surrogate
 * escapes, duplicate keys at any depth, a top-level key that equals a field keyward
 * reads in another letter case (Go's encoding/json matches keys case-insensitively,
 * folding `ſ` to `s` and the Kelvin sign to `k`), non-finite output caps. JSON.parse
 * already refuses NaN, comments and trailing commas, which Python's decoder accepts in
 * part. Pure.
 */

import { collectModels, modelNamesProblem, TOO_DEEP } from './model-names.js';

export type JsonInspection =
  | { ok: true; model: string | null; maxOutputTokens: number | null; models: string[]; background: boolean }
  | { ok: false; message: string };

const OUTPUT_CAPS = ['max_tokens', 'max_completion_tokens', 'max_output_tokens'];

/** How Go's case-insensitive key matching sees a key. */
export function foldKey(key: string): string {
  // Most keys are lower-case ASCII already, and fold to themselves: no new string for them.
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c > 0x7f || (c >= 0x41 && c <= 0x5a)) return key.replace(/\u017f/g, 's').toLowerCase();
  }
  return key;
}

/** Top-level fields that select a model or set the output cap: read exactly, never case-folded. */
export function isSensitiveField(folded: string): boolean {
  return folded === 'model' || folded === 'models' || folded.endsWith('fallbacks') || OUTPUT_CAPS.includes(folded);
}

/** Body fields that select further models, held to the key's scope like `model`. */
export function selectsModels(name: string): boolean {
  return name === 'models' || name.endsWith('fallbacks');
}

const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Index of the quote that closes the string opened at `i`. */
function stringEnd(text: string, i: number): number {
  for (let j = text.indexOf('"', i + 1); j !== -1; j = text.indexOf('"', j + 1)) {
    let slashes = 0;
    while (text.charCodeAt(j - 1 - slashes) === 92) slashes++;
    if (slashes % 2 === 0) return j;
  }
  return text.length;
}

/** Whether the `\u` escapes in text[from, to) pair every surrogate. */
function surrogatesPaired(text: string, from: number, to: number): boolean {
  let pendingHigh = false;
  for (let i = from; i < to; i++) {
    if (text.charCodeAt(i) !== 92) continue;
    if (text.charCodeAt(i + 1) !== 117) {
      i++; // the escaped character
      if (pendingHigh) return false;
      continue;
    }
    const unit = parseInt(text.slice(i + 2, i + 6), 16);
    const adjacent = pendingHigh;
    pendingHigh = false;
    if (unit >= 0xdc00 && unit <= 0xdfff) {
      if (!adjacent) return false;
    } else if (adjacent) return false;
    else if (unit >= 0xd800 && unit <= 0xdbff) {
      if (text.charCodeAt(i + 6) !== 92) return false;
      pendingHigh = true;
    }
    i += 5;
  }
  return !pendingHigh;
}

const ARRAY = Symbol('array');
/** Keys of one object kept in a list before a Set takes over. */
const SMALL_OBJECT_KEYS = 8;
const DUPLICATE = 'The request body names a key more than once in one object.';

/**
 * Walks valid JSON text once: duplicate keys in any object and unpaired surrogate escapes
 * are problems. Linear in the text.
 */
export function strictProblem(text: string): string | null {
  // Per open container: ARRAY, or an object's keys so far (none, one key, a short list,
  // or a Set past SMALL_OBJECT_KEYS, so the many small objects of a body cost no Set each;
  // a list that short keeps the walk linear).
  const stack: (typeof ARRAY | undefined | string | string[] | Set<string>)[] = [];
  let expectKey = false;
  // The next backslash at or after the current string, found by one forward search that
  // only moves on once the scan has passed it: linear over the whole text.
  let nextEscape = text.indexOf('\\');
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) {
      const end = stringEnd(text, i);
      if (nextEscape !== -1 && nextEscape <= i) nextEscape = text.indexOf('\\', i + 1);
      const hasEscape = nextEscape !== -1 && nextEscape < end;
      if (hasEscape && !surrogatesPaired(text, i + 1, end)) return 'The request body contains an unpaired surrogate escape.';
      if (expectKey) {
        const key = hasEscape ? (JSON.parse(text.slice(i, end + 1)) as string) : text.slice(i + 1, end);
        const top = stack.length - 1;
        const keys = stack[top];
        if (keys === undefined) stack[top] = key;
        else if (typeof keys === 'string') {
          if (keys === key) return DUPLICATE;
          stack[top] = [keys, key];
        } else if (Array.isArray(keys)) {
          if (keys.includes(key)) return DUPLICATE;
          if (keys.length < SMALL_OBJECT_KEYS) keys.push(key);
          else stack[top] = new Set([...keys, key]);
        } else if (keys instanceof Set) {
          if (keys.has(key)) return DUPLICATE;
          keys.add(key);
        }
      }
      expectKey = false;
      i = end;
    } else if (c === 123) {
      stack.push(undefined);
      expectKey = true;
    } else if (c === 91) {
      stack.push(ARRAY);
    } else if (c === 125 || c === 93) {
      stack.pop();
    } else if (c === 44) {
      expectKey = stack.length > 0 && stack[stack.length - 1] !== ARRAY;
    }
  }
  return null;
}

/**
 * The largest output cap the body names, `extra_body`'s included (gateways merge it into
 * the provider's request, where its cap is the one that counts); a numeric string counts
 * (lax decoders coerce it).
 */
function outputCap(body: Record<string, unknown>): { ok: true; cap: number | null } | { ok: false; message: string } {
  const top = capsIn(body, null);
  const extra = body.extra_body;
  if (!top.ok || typeof extra !== 'object' || extra === null || Array.isArray(extra)) return top;
  return capsIn(extra as Record<string, unknown>, top.cap);
}

/** The largest of `cap` and the output caps one object names. */
function capsIn(o: Record<string, unknown>, cap: number | null): { ok: true; cap: number | null } | { ok: false; message: string } {
  for (const name of OUTPUT_CAPS) {
    let v = o[name];
    if (typeof v === 'string' && /^\s*\d{1,15}\s*$/.test(v)) v = Number(v);
    if (typeof v !== 'number') continue;
    if (!Number.isFinite(v)) return { ok: false, message: `"${name}" must be a finite number.` };
    if (v >= 0) cap = Math.max(cap ?? 0, Math.min(Math.ceil(v), Number.MAX_SAFE_INTEGER));
  }
  return { ok: true, cap };
}

const refused = (message: string): JsonInspection => ({ ok: false, message });

/**
 * The object the body parses to, or (a string) why it is not one keyward reads: not UTF-8,
 * not JSON, not an object, or open to another reading (strictProblem).
 */
function strictObject(buf: Buffer): Record<string, unknown> | string {
  if (buf.length >= 3 && buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf) return 'The request body must not start with a byte order mark.';
  let text: string;
  try {
    text = decoder.decode(buf);
  } catch {
    return 'The request body is not valid UTF-8.';
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return 'The request body is not valid JSON.';
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return 'The request body must be a JSON object.';
  return strictProblem(text) ?? (parsed as Record<string, unknown>);
}

/**
 * Adds to `models` those the body's model-selecting keys name, `extra_body`'s included.
 * Returns the problem when two top-level keys fold alike (one key to a case-insensitive
 * decoder), else null.
 */
function collectSelected(body: Record<string, unknown>, models: string[]): string | null {
  // A key that folds to itself (most do) cannot clash with another such key (JSON.parse
  // keeps one of each, and strictProblem refused duplicates), so only keys that fold to
  // something else are looked up, among all keys and the other folds: no Set at all for a
  // body of lower-case keys.
  const keys = Object.keys(body);
  let all: Set<string> | null = null;
  let folds: Set<string> | null = null;
  for (const key of keys) {
    const folded = foldKey(key);
    if (folded !== key) {
      all ??= new Set(keys);
      if (isSensitiveField(folded) || all.has(folded) || folds?.has(folded)) {
        const what = isSensitiveField(folded) ? `"${folded}"` : 'a key';
        return `The request body names ${what} in another letter case or more than once; send it once, in lower case.`;
      }
      (folds ??= new Set()).add(folded);
    }
    if (selectsModels(key) && !collectModels(body[key], models)) return TOO_DEEP;
  }
  // Gateways that call providers through an OpenAI SDK merge `extra_body` into the
  // provider's request, where its `model` overrides the one keyward checked.
  const extra = body.extra_body;
  if (typeof extra === 'object' && extra !== null && !Array.isArray(extra)) {
    for (const [k, v] of Object.entries(extra)) {
      const folded = foldKey(k);
      if ((folded === 'model' || selectsModels(folded)) && !collectModels(v, models)) return TOO_DEEP;
    }
  }
  return null;
}

export function inspectJson(buf: Buffer): JsonInspection {
  const body = strictObject(buf);
  if (typeof body === 'string') return refused(body);
  const models: string[] = [];
  const clash = collectSelected(body, models);
  if (clash) return refused(clash);
  const cap = outputCap(body);
  if (!cap.ok) return cap;
  const named = 'model' in body;
  if (named && (typeof body.model !== 'string' || body.model === '')) return refused('"model" must be a non-empty string.');
  const model = named ? (body.model as string) : null;
  const names = modelNamesProblem(model, models);
  if (names) return refused(names);
  // A background response answers at once, before anything is generated (DESIGN section 6).
  return { ok: true, model, maxOutputTokens: cap.cap, models, background: body.background === true };
}

/**
 * Whether the query string names a model (`model`, `models`, `*fallbacks`, in any letter
 * case, percent-encoded or with `[]`): some gateways take it over the body's.
 */
export function queryNamesModel(target: string): boolean {
  const q = target.indexOf('?');
  if (q === -1) return false;
  for (const pair of target.slice(q + 1).split(/[&;]/)) {
    let name = pair.split('=', 1)[0]!.replace(/\+/g, ' ');
    try {
      name = decodeURIComponent(name);
    } catch {
      // a malformed escape: judge the raw text
    }
    const folded = foldKey(name.trim()).replace(/\[.*$/, '');
    if (folded === 'model' || selectsModels(folded)) return true;
  }
  return false;
}

/**
 * Finds what the sidecar needs in a JSON request body: the top-level `model` (exactly
 * one, a string) and the output cap, without trusting JSON.parse's "last duplicate wins".
 * Pure.
 */

export type JsonInspection =
  | { ok: true; model: string | null; maxOutputTokens: number | null }
  | { ok: false; message: string };

const MODEL = Buffer.from('"model"');
const ESCAPE_U = Buffer.from('\\u');

function countOccurrences(buf: Buffer, needle: Buffer, stopAt: number): number {
  let n = 0;
  for (let i = buf.indexOf(needle); i !== -1 && n < stopAt; i = buf.indexOf(needle, i + needle.length)) n++;
  return n;
}

/** Index just past the string starting at `i` (which is a quote). */
function skipString(text: string, i: number): number {
  for (let j = i + 1; j < text.length; j++) {
    const c = text.charCodeAt(j);
    if (c === 92) j++; // backslash: skip the escaped char
    else if (c === 34) return j + 1;
  }
  return text.length;
}

/** Top-level keys of an object literal already known to be valid JSON, decoded. */
export function topLevelKeys(text: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  let expectKey = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) {
      const end = skipString(text, i);
      if (depth === 1 && expectKey) keys.push(JSON.parse(text.slice(i, end)) as string);
      expectKey = false;
      i = end - 1;
    } else if (c === 123 || c === 91) {
      depth++;
      expectKey = depth === 1 && c === 123;
    } else if (c === 125 || c === 93) {
      depth--;
    } else if (c === 44 && depth === 1) {
      expectKey = true;
    }
  }
  return keys;
}

function outputCap(body: Record<string, unknown>): number | null {
  for (const name of ['max_tokens', 'max_completion_tokens', 'max_output_tokens']) {
    const v = body[name];
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0) return Math.floor(v);
  }
  return null;
}

export function inspectJson(buf: Buffer): JsonInspection {
  let parsed: unknown;
  try {
    parsed = JSON.parse(buf.toString('utf8'));
  } catch {
    return { ok: false, message: 'The request body is not valid JSON.' };
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    return { ok: false, message: 'The request body must be a JSON object.' };
  }
  const body = parsed as Record<string, unknown>;
  // Fast path: a second top-level "model" needs either a second literal "model" or a \u escape.
  if (countOccurrences(buf, MODEL, 2) > 1 || buf.includes(ESCAPE_U)) {
    const n = topLevelKeys(buf.toString('utf8')).filter((k) => k === 'model').length;
    if (n > 1) return { ok: false, message: 'The request body names "model" more than once.' };
  }
  if (!('model' in body)) return { ok: true, model: null, maxOutputTokens: outputCap(body) };
  if (typeof body.model !== 'string' || body.model === '') {
    return { ok: false, message: '"model" must be a non-empty string.' };
  }
  return { ok: true, model: body.model, maxOutputTokens: outputCap(body) };
}

/**
 * Usage objects as upstreams report them (chat's `prompt_tokens`/`completion_tokens`,
 * messages' and responses' `input_tokens`/`output_tokens`, messages' cache fields), read
 * into one shape for the usage tap (tap.ts). Pure.
 */

export interface Usage {
  input_tokens: number;
  output_tokens: number;
}

export type Obj = Record<string, unknown>;
export const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
/**
 * Whole tokens, bounded: the console accepts only safe non-negative integers in a usage
 * event. A field left out or null counts none; any other value that is not a number of 0
 * or more (a negative, a string, 1e400) is NaN, and makes its usage object unusable.
 */
const count = (v: unknown): number => {
  if (v === undefined || v === null) return 0;
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.min(Math.ceil(v), 2 ** 40) : NaN;
};
/** A usage object's fields that say something: null is "no change" in a messages delta, as the SDK reads it. */
export const given = (u: Obj): Obj => {
  const out: Obj = {};
  for (const [k, v] of Object.entries(u)) if (v !== null && v !== undefined) out[k] = v;
  return out;
};
/** A usage object whose figures cannot be read is no report at all: the estimate rule bills it (section 6). */
const readable = (u: Usage): Usage | null => (Number.isNaN(u.input_tokens) || Number.isNaN(u.output_tokens) ? null : u);

/**
 * One `usage` object, any of the supported shapes. Messages-style cache writes and reads
 * are input the upstream processed, so they count as input. (The responses API's
 * `input_tokens` already includes its cached tokens.)
 */
export function normalize(u: unknown): Usage | null {
  if (!isObj(u)) return null;
  if ('input_tokens' in u || 'output_tokens' in u) {
    return readable({
      input_tokens: count(u.input_tokens) + count(u.cache_creation_input_tokens) + count(u.cache_read_input_tokens),
      output_tokens: count(u.output_tokens),
    });
  }
  if ('prompt_tokens' in u || 'completion_tokens' in u) {
    return readable({ input_tokens: count(u.prompt_tokens), output_tokens: count(u.completion_tokens) });
  }
  return null;
}

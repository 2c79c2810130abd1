/**
 * The model names a request selects (DESIGN section 5, steps 6 and 7), as the JSON and the
 * multipart readers collect them: what `models` and `fallbacks` values name, and which
 * names are refused before scope is checked. Pure.
 */

/** The longest model name keyward accepts: the console refuses longer ones in usage events. */
export const MAX_MODEL_LENGTH = 256;
/** At most this many further models (`models`, `fallbacks`) are read from one request. */
export const MAX_EXTRA_MODELS = 1000;
/** Deepest nesting of a `models`/`fallbacks` value that is read; deeper is refused. */
const MAX_DEPTH = 32;
/**
 * A comma, whitespace or a control character: no model is named so, and gateways read a
 * name with a comma as a list (LiteLLM runs each model of `"gpt-4o,o1-pro"`), so such a name
 * could run models the scope never saw.
 */
const NOT_A_NAME = /[\s,\x00-\x1f\x7f-\x9f]/; // eslint-disable-line no-control-regex

/**
 * What of an object inside a `models`/`fallbacks` value names models. An object with a
 * `model` or `models` key is a whole request's override (LiteLLM's per-fallback `model` and
 * `messages`): only those values are models, and its prose is not. Any other object maps
 * models to models (`{"gpt-4o": ["o1"]}`): its keys and values all are.
 */
function modelEntries(x: object): [string | null, unknown][] {
  if (Array.isArray(x)) return x.map((e): [string | null, unknown] => [null, e]);
  const o = x as Record<string, unknown>;
  if (Object.hasOwn(o, 'model') || Object.hasOwn(o, 'models')) {
    const out: [string | null, unknown][] = [];
    if (Object.hasOwn(o, 'model')) out.push([null, o.model]);
    if (Object.hasOwn(o, 'models')) out.push([null, o.models]);
    return out;
  }
  return Object.entries(o);
}

/**
 * Every model name inside `v` (a `models`/`fallbacks` value), depth first (see
 * modelEntries). Walks with its own stack: a value nested past MAX_DEPTH is refused
 * (false), and no input can exhaust the call stack. Stops collecting past
 * MAX_EXTRA_MODELS (the caller refuses that many).
 */
export function collectModels(v: unknown, out: string[]): boolean {
  const stack: [unknown, number][] = [[v, 0]];
  while (stack.length > 0 && out.length <= MAX_EXTRA_MODELS) {
    const [x, depth] = stack.pop()!;
    if (typeof x === 'string') out.push(x);
    else if (typeof x === 'object' && x !== null) {
      if (depth >= MAX_DEPTH) return false;
      // pushed in reverse, so they are taken in their order
      const entries = modelEntries(x);
      for (let i = entries.length - 1; i >= 0; i--) {
        const [k, e] = entries[i]!;
        stack.push([e, depth + 1]);
        if (k !== null) stack.push([k, depth + 1]);
      }
    }
  }
  return true;
}

/** The models a multipart `models`/`fallbacks` field names: a JSON value's strings and keys, else the text itself; null when nested too deep. */
export function modelsOfField(value: string): string[] | null {
  const out: string[] = [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    return [value];
  }
  if (!collectModels(parsed, out)) return null;
  return typeof parsed === 'object' && parsed !== null ? out : [value, ...out.filter((m) => m !== value)];
}

/** Why the names a request selects are refused (400), or null. `model` is the request's own. */
export function modelNamesProblem(model: string | null, models: readonly string[]): string | null {
  if (models.length > MAX_EXTRA_MODELS) return 'The request body names too many models.';
  if (model !== null && model.length > MAX_MODEL_LENGTH) return `"model" is at most ${MAX_MODEL_LENGTH} characters.`;
  if (models.some((m) => m.length > MAX_MODEL_LENGTH)) return `Model names are at most ${MAX_MODEL_LENGTH} characters.`;
  if ((model !== null && NOT_A_NAME.test(model)) || models.some((m) => NOT_A_NAME.test(m))) {
    return 'A model name may not contain commas, whitespace or control characters; name one model per field.';
  }
  return null;
}

/** The problem of a `models`/`fallbacks` value nested too deep. */
export const TOO_DEEP = `A "models" or "fallbacks" value is nested more than ${MAX_DEPTH} deep.`;

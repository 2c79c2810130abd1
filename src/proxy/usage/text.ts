/**
 * Generated text in a response, counted in characters, for the estimate a response that
 * reports no usage is settled at (DESIGN section 6). Only the fields where each API puts
 * what the model generated are read, once each: a stream's deltas, not the summary
 * events that repeat them.
 */

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const len = (v: unknown): number => (typeof v === 'string' ? v.length : 0);
const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

function toolCalls(v: unknown): number {
  let n = 0;
  for (const call of list(v)) if (isObj(call) && isObj(call.function)) n += len(call.function.arguments);
  return n;
}

/** chat/completions and completions choices, streamed (`delta`) or whole (`message`). */
function choices(o: Obj): number {
  let n = 0;
  for (const c of list(o.choices)) {
    if (!isObj(c)) continue;
    n += len(c.text);
    for (const part of [c.delta, c.message]) {
      if (!isObj(part)) continue;
      n += len(part.content) + len(part.reasoning_content) + len(part.reasoning) + len(part.refusal) + toolCalls(part.tool_calls);
    }
  }
  return n;
}

const RESPONSES_DELTAS = new Set([
  'response.output_text.delta',
  'response.function_call_arguments.delta',
  'response.reasoning_summary_text.delta',
  'response.reasoning_text.delta',
  'response.refusal.delta',
  'transcript.text.delta',
]);

/** One SSE event's generated characters. */
export function eventText(o: unknown): number {
  if (!isObj(o)) return 0;
  const type = typeof o.type === 'string' ? o.type : '';
  if (type === 'content_block_delta' && isObj(o.delta)) return len(o.delta.text) + len(o.delta.partial_json) + len(o.delta.thinking);
  if (RESPONSES_DELTAS.has(type)) return len(o.delta);
  if (type === '') return choices(o);
  return 0;
}

/** A whole JSON response's generated characters: chat, completions, messages, responses, transcriptions. */
export function bodyText(o: unknown): number {
  if (!isObj(o)) return 0;
  let n = choices(o) + len(o.text);
  for (const block of list(o.content)) {
    if (!isObj(block)) continue;
    n += len(block.text) + len(block.thinking);
    if (block.type === 'tool_use' && block.input !== undefined) n += JSON.stringify(block.input).length;
  }
  for (const item of list(o.output)) {
    if (!isObj(item)) continue;
    n += len(item.arguments);
    for (const part of list(item.content)) if (isObj(part)) n += len(part.text) + len(part.refusal);
  }
  return n;
}

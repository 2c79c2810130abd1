/**
 * Usage events (DESIGN section 7, `POST /sync/v1/usage`): what the sidecar reports per
 * model response and what the console accepts. Pure: no I/O.
 */
import { z } from 'zod';
import { issueText } from './records.js';

export interface UsageEvent {
  /**
   * The sidecar's own id of this event, unique per forwarded request: a client may send the
   * same x-request-id with many requests, so request_id does not tell two events apart. The
   * console applies an event with a given event_id once (a retried batch sends it again).
   */
  event_id?: string;
  request_id: string;
  key_id: string;
  model: string | null;
  input_tokens: number;
  output_tokens: number;
  status: number;
  /** ISO-8601 time the request completed */
  at: string;
  /** true when the tokens are the sidecar's estimate (no usage in the response, section 6) */
  estimated?: boolean;
}

// Like records, events may carry fields this reader does not know: they are ignored.
export const usageEvent = z.object({
  event_id: z.string().min(1).max(128).optional(),
  request_id: z.string().min(1).max(256),
  key_id: z.string().min(1).max(256),
  model: z.string().max(256).nullable(),
  input_tokens: z.number().int().nonnegative(),
  output_tokens: z.number().int().nonnegative(),
  status: z.number().int(),
  at: z.string().min(1),
  estimated: z.boolean().optional(),
});


/**
 * Validates a usage upload (NDJSON, one event per line). Good lines are kept and bad ones
 * reported by 1-based line number, so one bad event does not cost the rest of the batch.
 */
export function parseUsageLines(text: string): { events: UsageEvent[]; errors: { line: number; error: string }[] } {
  const events: UsageEvent[] = [];
  const errors: { line: number; error: string }[] = [];
  text.split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (line === '') return;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      errors.push({ line: i + 1, error: 'not valid JSON' });
      return;
    }
    const r = usageEvent.safeParse(value);
    if (r.success) events.push(r.data);
    else errors.push({ line: i + 1, error: issueText(r.error) });
  });
  return { events, errors };
}

/**
 * Log lines that fit one pipe write. Cluster workers share one stdout, and only a write of
 * at most PIPE_BUF bytes reaches a pipe whole; a longer line could interleave with another
 * worker's and leave neither line readable. A line over the bound keeps its shape: its
 * longest strings are cut (longest first, each to half, never below a floor) and end in
 * "…", and the line says `"truncated":true`, until it fits.
 */

/** Characters a cut string keeps at least. */
const FLOOR_CHARS = 64;
const MARK = '\u2026';

interface Leaf {
  holder: Record<string, unknown> | unknown[];
  key: string | number;
  value: string;
}

/** Every string value in `node`, with where it sits. */
function leaves(node: unknown, out: Leaf[]): Leaf[] {
  if (Array.isArray(node)) {
    node.forEach((v, i) => (typeof v === 'string' ? out.push({ holder: node, key: i, value: v }) : leaves(v, out)));
  } else if (node !== null && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (typeof v === 'string') out.push({ holder: node as Record<string, unknown>, key: k, value: v });
      else leaves(v, out);
    }
  }
  return out;
}

const bytes = (s: string): number => Buffer.byteLength(s);

/**
 * `line` (one JSON object and its newline) if it is within `limit` bytes; else the same
 * object with its longest strings cut and marked, within `limit`. A line that cannot be
 * cut to fit (say, thousands of short fields) becomes its level, time and message, marked.
 */
export function fitLine(line: string, limit: number): string {
  if (line.length <= limit / 3 || bytes(line) <= limit) return line;
  let obj: Record<string, unknown>;
  try {
    obj = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return `${JSON.stringify({ msg: 'unreadable log line dropped', truncated: true })}\n`;
  }
  obj.truncated = true;
  const strings = leaves(obj, []);
  let text = `${JSON.stringify(obj)}\n`;
  while (bytes(text) > limit) {
    const longest = strings.reduce<Leaf | null>((a, l) => (l.value.length > FLOOR_CHARS && (a === null || l.value.length > a.value.length) ? l : a), null);
    if (longest === null) break;
    const keep = Math.max(FLOOR_CHARS, Math.floor(longest.value.length / 2));
    longest.value = longest.value.slice(0, keep) + MARK;
    (longest.holder as Record<string | number, unknown>)[longest.key] = longest.value;
    text = `${JSON.stringify(obj)}\n`;
  }
  if (bytes(text) <= limit) return text;
  const { level, time, msg } = obj;
  return `${JSON.stringify({ level, time, msg, truncated: true })}\n`;
}

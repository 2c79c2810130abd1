/**
 * What the live-reload tests share: an upstream that answers like the OpenAI API (and
 * streams slowly when asked to), a replica filled through `keyward import`, a config file
 * rewritten between steps, and waits on what a running `keyward serve` reports: its
 * reload metrics and its log lines.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { configMetrics, importReplica, untilScraped } from './instance.js';
import type { SidecarProcess } from './process.js';
import type { Handler } from './upstream.js';

/** A slow stream's pieces and the pause between them: longer than 5 s in all. */
export const SLOW_PIECES = 11;
export const SLOW_PAUSE_MS = 500;

/**
 * Chat completions as the OpenAI API answers them, naming `who` in the reply. Model
 * `slow` streams SLOW_PIECES pieces SLOW_PAUSE_MS apart, then its usage and [DONE].
 */
export function chatUpstream(who: string): Handler {
  return (req, res, rec) => {
    const body = JSON.parse(rec.body.toString('utf8') || '{}') as { model?: string; stream?: boolean };
    const base = { id: `chatcmpl-${who}`, created: 1, model: body.model ?? 'none' };
    const usage = { prompt_tokens: 5, completion_tokens: SLOW_PIECES, total_tokens: 5 + SLOW_PIECES };
    if (!body.stream) {
      const text = JSON.stringify({ ...base, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: who, refusal: null }, finish_reason: 'stop', logprobs: null }], usage });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      return void res.end(text);
    }
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    const chunk = (choices: unknown[], u: unknown = null) => `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices, usage: u })}\n\n`;
    let sent = 0;
    const timer = setInterval(() => {
      if (res.destroyed) return clearInterval(timer);
      if (sent < SLOW_PIECES) return void res.write(chunk([{ index: 0, delta: { content: `${who}${sent++} ` }, finish_reason: null }]));
      clearInterval(timer);
      res.write(chunk([{ index: 0, delta: {}, finish_reason: 'stop' }]));
      res.write(chunk([], usage));
      res.end('data: [DONE]\n\n');
    }, body.model === 'slow' ? SLOW_PAUSE_MS : 1);
    req.socket.once('close', () => clearInterval(timer));
  };
}

const hash = makeKeyHasher({ hash: 'sha256' });

/** Fills `replica` through `keyward import` with personal keys of wallet u1: id -> [secret, extra fields]. */
export async function importKeys(dir: string, replica: string, keys: Record<string, { secret: string; routing?: string | null; rpm?: number | null; concurrency?: number | null }>): Promise<void> {
  const records: unknown[] = [{ type: 'meta', version: 1 }, { type: 'wallet', user: 'u1', balance: 100 }];
  for (const [id, k] of Object.entries(keys)) {
    records.push({
      type: 'key', id, hash: hash(k.secret), kind: 'personal', user: 'u1', project: null, status: 'active', budget: null, spent: 0,
      models: null, routing: k.routing ?? null, rpm: k.rpm ?? null, tpm: null, concurrency: k.concurrency ?? null,
    });
  }
  const file = join(dir, 'snapshot.ndjson');
  writeFileSync(file, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  await importReplica(file, replica);
}

/** The log lines of a process, parsed. */
export const logLines = (p: SidecarProcess): Record<string, unknown>[] => p.lines.map((l) => JSON.parse(l) as Record<string, unknown>);

/**
 * Waits until the process has counted one more reload of `result` than `before` says, and
 * returns the scrape that shows it with how long it took.
 */
export async function nextReload(p: SidecarProcess, before: { ok: number; error: number }, result: 'ok' | 'error', timeoutMs = 5_000): Promise<{ metrics: ReturnType<typeof configMetrics>; ms: number }> {
  const t0 = Date.now();
  const m = await untilScraped(p, (s) => configMetrics(s)[result] > before[result], `a reload counted as ${result}`, timeoutMs);
  return { metrics: configMetrics(m), ms: Date.now() - t0 };
}

/**
 * Small HTTP helpers shared by the admin and sync APIs: bearer-token principals, bounded
 * body reading, JSON answers and the one error shape `{"error":{"code","message"}}`.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { z } from 'zod';
import type { ConsoleConfig } from './config.js';
import { ApiError, MethodNotAllowed, invalid } from './errors.js';

/** `tokenNumber`: which of `auth.adminTokens` (from 1), so an audit line tells two admins apart. */
export type Principal = { role: 'admin'; tokenNumber: number } | { role: 'user'; user: string } | { role: 'sync' };

/** Minimal logger shape (pino's); the console never passes it a key, token or master key. */

const digest = (token: string) => createHash('sha256').update(token, 'utf8').digest('hex');

/**
 * Maps a request's bearer token to its principal. Tokens are compared by their SHA-256,
 * so the lookup time says nothing about how much of a guessed token was right.
 */
export function makeAuthenticator(auth: ConsoleConfig['auth']): (req: IncomingMessage) => Principal | null {
  const byDigest = new Map<string, Principal>();
  for (const t of auth.syncTokens) byDigest.set(digest(t), { role: 'sync' });
  auth.adminTokens.forEach((t, i) => byDigest.set(digest(t), { role: 'admin', tokenNumber: i + 1 }));
  for (const u of auth.users) byDigest.set(digest(u.token), { role: 'user', user: u.id });
  return (req) => {
    const header = req.headers.authorization;
    const m = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    return m ? (byDigest.get(digest(m[1]!)) ?? null) : null;
  };
}

export function principalName(p: Principal | null): string {
  if (!p) return 'anonymous';
  if (p.role === 'admin') return `admin#${p.tokenNumber}`;
  return p.role === 'user' ? `user:${p.user}` : p.role;
}

export function sendJson(res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}): void {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    ...extra,
  });
  res.end(text);
}

export function sendError(res: ServerResponse, err: ApiError): void {
  const extra: Record<string, string> = err.status === 401 ? { 'www-authenticate': 'Bearer' } : err instanceof MethodNotAllowed ? { allow: err.allow.join(', ') } : {};
  sendJson(res, err.status, { error: { code: err.code, message: err.message } }, extra);
}

export const unauthorized = () => new ApiError(401, 'unauthorized', 'a valid bearer token is required');
export const forbidden = (message = 'this token may not do that') => new ApiError(403, 'forbidden', message);

/** Reads the whole body, refusing more than `limit` bytes (413) instead of buffering it. */
export async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) throw new ApiError(413, 'body_too_large', `body exceeds ${limit} bytes`);
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new ApiError(413, 'body_too_large', `body exceeds ${limit} bytes`);
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

/** Parses a JSON body against a strict schema; problems name the field, not its value. */
export async function readJson<T>(req: IncomingMessage, schema: z.ZodType<T>, limit = 1024 * 1024): Promise<T> {
  const raw = (await readBody(req, limit)).toString('utf8');
  let value: unknown;
  try {
    value = raw.trim() === '' ? {} : JSON.parse(raw);
  } catch {
    throw invalid('body is not valid JSON');
  }
  const r = schema.safeParse(value);
  if (!r.success) {
    throw invalid(r.error.issues.map((i) => `${i.path.join('.') || '(body)'}: ${i.message}`).join('; '));
  }
  return r.data;
}

/** Matches `/a/:x/b` against a path; returns the decoded parameters or null. */
export function match(pattern: string, path: string): Record<string, string> | null {
  const want = pattern.split('/');
  const got = path.split('/');
  if (want.length !== got.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    const w = want[i]!;
    if (w.startsWith(':')) {
      let v: string;
      try {
        v = decodeURIComponent(got[i]!);
      } catch {
        return null;
      }
      if (v === '') return null;
      params[w.slice(1)] = v;
    } else if (w !== got[i]) {
      return null;
    }
  }
  return params;
}

/** An integer query parameter in plain digits (not `1e3`, `0x10` or ` 5`, which Number() would take), within bounds. */
export function intParam(q: URLSearchParams, name: string, opts: { min: number; max: number; def?: number }): number {
  const raw = q.get(name);
  if (raw === null) {
    if (opts.def !== undefined) return opts.def;
    throw invalid(`${name} is required`);
  }
  if (!/^\d+$/.test(raw)) throw invalid(`${name} must be a non-negative integer`);
  const n = Number(raw);
  if (n < opts.min || n > opts.max) throw invalid(`${name} must be between ${opts.min} and ${opts.max}`);
  return n;
}

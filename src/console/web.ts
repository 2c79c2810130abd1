/**
 * The console's web page (DESIGN sections 8 and 11): static files from ./web, read once at
 * start, served at `/` with a strict Content-Security-Policy. The page holds no data of its
 * own: everything it shows comes from the admin API with the signed-in token.
 */
import { readFileSync, readdirSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
};

/**
 * Same-origin only, no inline script or style, no framing, no form posts anywhere: a
 * script that got in could not load more code or send the token elsewhere.
 */
export const PAGE_CSP = [
  "default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self'", "connect-src 'self'",
  "form-action 'none'", "frame-ancestors 'none'", "base-uri 'none'",
].join('; ');

const HEADERS = {
  'content-security-policy': PAGE_CSP,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
  // Small files: always revalidate, so an upgraded console never runs an old script.
  'cache-control': 'no-cache',
};

interface Asset { type: string; body: Buffer }

/** Loads the page's files; returns the handler, which answers true when it served `path`. */
export function makeWebHandler(dir: URL = new URL('./web/', import.meta.url)): (req: IncomingMessage, res: ServerResponse, path: string) => boolean {
  const assets = new Map<string, Asset>();
  for (const name of readdirSync(dir)) {
    const ext = name.slice(name.lastIndexOf('.'));
    const type = TYPES[ext];
    if (type) assets.set(name === 'index.html' ? '/' : `/${name}`, { type, body: readFileSync(new URL(name, dir)) });
  }
  return (req, res, path) => {
    const asset = assets.get(path);
    if (!asset || (req.method !== 'GET' && req.method !== 'HEAD')) return false;
    res.writeHead(200, { ...HEADERS, 'content-type': asset.type, 'content-length': asset.body.length });
    res.end(req.method === 'HEAD' ? undefined : asset.body);
    return true;
  };
}

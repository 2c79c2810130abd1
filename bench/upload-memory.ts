/**
 * Memory of a sidecar streaming large uploads (`tsx bench/upload-memory.ts [MiB...]`):
 * the benchmark's keyward server (in-process limiter, no upload limit) in a child
 * process, in front of the benchmark upstream; for each size, one files-route body and
 * one multipart transcription body (model field, then the file) are sent, and the child's
 * peak resident set (VmHWM) is read from /proc after each. Streaming shows as a peak that
 * does not grow with the size of the upload.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { generateKey } from '../src/auth/keyformat.js';

const MiB = 1 << 20;
const sizes = process.argv.slice(2).map(Number).filter((n) => n > 0);
const SIZES = sizes.length ? sizes : [64, 256, 1024];

function start(file: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(import.meta.dirname, 'servers', file), ...args], { stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, ...env } });
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const info = JSON.parse(line) as { ready?: boolean; port?: number };
      if (info.ready) resolve({ child, port: info.port! });
    });
    child.once('exit', (code) => reject(new Error(`${file} exited with ${code}`)));
  });
}

const peakMiB = (pid: number) => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

/** Sends `head`, `size` bytes of filler, then `tail`, with a declared length; resolves with the status. */
function upload(port: number, key: string, path: string, contentType: string, head: Buffer, size: number, tail: Buffer): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ port, host: '127.0.0.1', method: 'POST', path, headers: { authorization: `Bearer ${key}`, 'content-type': contentType, 'content-length': head.length + size + tail.length } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    const piece = Buffer.alloc(MiB, 0x61);
    let left = size;
    req.write(head);
    const pump = () => {
      while (left > 0) {
        const n = Math.min(left, piece.length);
        left -= n;
        if (!req.write(n === piece.length ? piece : piece.subarray(0, n))) return void req.once('drain', pump);
      }
      req.end(tail);
    };
    pump();
  });
}

const key = generateKey();
const up = await start('upstream.ts', []);
const kw = await start('keyward.ts', [`http://127.0.0.1:${up.port}`, 'memory'], { KW_BENCH_KEY: key });
const B = 'kw-bench-boundary';
const form = (fields: string) => Buffer.from(`${fields}--${B}\r\ncontent-disposition: form-data; name="file"; filename="a.bin"\r\ncontent-type: application/octet-stream\r\n\r\n`);
const end = Buffer.from(`\r\n--${B}--\r\n`);
const model = `--${B}\r\ncontent-disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n`;
console.log(`keyward child at start: peak RSS ${peakMiB(kw.child.pid!).toFixed(0)} MiB`);
try {
  for (const mib of SIZES) {
    for (const [name, path, fields] of [['files', '/v1/files', ''], ['multipart model', '/v1/audio/transcriptions', model]] as const) {
      const t0 = performance.now();
      const status = await upload(kw.port, key, path, `multipart/form-data; boundary=${B}`, form(fields), mib * MiB, end);
      const s = (performance.now() - t0) / 1000;
      console.log(`${name.padEnd(16)} ${String(mib).padStart(5)} MiB  status ${status}  ${(mib / s).toFixed(0)} MiB/s  keyward peak RSS ${peakMiB(kw.child.pid!).toFixed(0)} MiB`);
    }
  }
} finally {
  kw.child.stdin!.end();
  up.child.stdin!.end();
}

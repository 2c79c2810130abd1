/**
 * Child-process plumbing shared by the benchmark servers: report the port as one JSON
 * line on stdout, and exit when the parent closes our stdin or sends SIGTERM, so no
 * server outlives the run even when the parent dies.
 */
import type { Server } from 'node:http';
import { heapSampleOnSignal, recordStalls } from './stalls.js';

export function ready(info: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ ready: true, ...info })}\n`);
}

export function exitWithParent(cleanup: () => Promise<void> | void = () => undefined): void {
  let stopping = false;
  const stalls = recordStalls();
  void heapSampleOnSignal();
  const stop = () => {
    if (stopping) return;
    stopping = true;
    if (stalls) process.stdout.write(`${JSON.stringify({ stalls: stalls() })}\n`);
    const hard = setTimeout(() => process.exit(0), 3_000);
    hard.unref();
    Promise.resolve()
      .then(cleanup)
      .catch((err: unknown) => process.stderr.write(`cleanup failed: ${String(err)}\n`))
      .finally(() => process.exit(0));
  };
  process.stdin.on('end', stop);
  process.stdin.on('close', stop);
  process.stdin.resume();
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

/** Listens on an ephemeral loopback port, reports it, and closes with the parent (then `cleanup`). */
export function serveForParent(server: Server, cleanup: () => void = () => undefined): void {
  server.listen(0, '127.0.0.1', () => {
    const addr = server.address();
    ready({ port: typeof addr === 'object' && addr ? addr.port : 0 });
  });
  exitWithParent(() => {
    server.closeAllConnections();
    server.close();
    cleanup();
  });
}

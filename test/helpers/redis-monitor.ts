/**
 * Counts the script calls Redis itself reports, with MONITOR on a plain socket of its own.
 *
 * Not ioredis's monitor(): it marks a connection as monitoring a promise turn after MONITOR's
 * +OK, so a command line arriving in the same packet as that +OK is taken for the reply to no
 * command ("Command queue state error"); the failed connection then reconnects for ever and
 * keeps the test process alive.
 */
import { Buffer } from 'node:buffer';
import { connect, type Socket } from 'node:net';
import { uid } from './redis-limits-conformance.js';
import { waitFor } from './redis-server.js';

interface Target {
  host: string;
  port: number;
  /** AUTH's arguments when the URL carries a password. */
  auth: string[];
}

/** A command in Redis's wire format. */
const resp = (...args: string[]): string => `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;

function target(url: string): Target {
  const u = new URL(url);
  const password = decodeURIComponent(u.password);
  const username = decodeURIComponent(u.username);
  return {
    host: u.hostname.replace(/^\[(.*)\]$/, '$1') || '127.0.0.1',
    port: Number(u.port || 6379),
    auth: password ? (username ? [username, password] : [password]) : [],
  };
}

/** The arguments of one MONITOR line: `+<time> [<db> <client>] "cmd" "arg" ...` (quotes escaped inside). */
export function monitorArgs(line: string): string[] {
  const args: string[] = [];
  for (const m of line.matchAll(/"((?:[^"\\]|\\.)*)"/g)) args.push(m[1]!.replace(/\\(.)/g, '$1'));
  return args;
}

/** A socket in MONITOR mode, resolved once Redis has said +OK; `onCommand` gets every command after that. */
export async function monitorSocket(url: string, onCommand: (args: string[]) => void): Promise<{ socket: Socket; closed(): boolean }> {
  const t = target(url);
  const socket = connect({ host: t.host, port: t.port });
  let closed = false;
  socket.on('close', () => (closed = true));
  await new Promise<void>((resolve, fail) => {
    const reject = (err: Error): void => {
      socket.destroy();
      fail(err);
    };
    let pending = '';
    let oks = t.auth.length ? 2 : 1;
    socket.once('error', reject);
    socket.on('data', (b: Buffer) => {
      pending += b.toString('latin1');
      for (let at = pending.indexOf('\r\n'); at >= 0; at = pending.indexOf('\r\n')) {
        const line = pending.slice(0, at);
        pending = pending.slice(at + 2);
        if (oks === 0) onCommand(monitorArgs(line));
        else if (line !== '+OK') reject(new Error(`MONITOR on ${t.host}:${t.port}: ${line}`));
        else if (--oks === 0) resolve();
      }
    });
    socket.write((t.auth.length ? resp('AUTH', ...t.auth) : '') + resp('MONITOR'));
  });
  // Seen by `closed()`: a watch that lost its socket would count too few.
  socket.on('error', () => undefined);
  return { socket, closed: () => closed };
}

export interface EvalWatch {
  /** EVAL/EVALSHA calls naming the prefix, over all nodes, since the watch began or was last reset. */
  calls: number;
  /** Waits until MONITOR has shown everything sent to each node before this call. */
  settle(): Promise<void>;
  stop(): void;
}

/** Counts the EVAL/EVALSHA calls naming `prefix` on each node at `urls`. */
export async function watchEvals(urls: string[], prefix: string): Promise<EvalWatch> {
  const marks = new Set<string>();
  const seen = { calls: 0 };
  const monitors = await Promise.all(
    urls.map((url) =>
      monitorSocket(url, (args) => {
        if (/^echo$/i.test(args[0] ?? '')) marks.add(args[1] ?? '');
        else if (/^eval/i.test(args[0] ?? '') && args.some((a) => a.includes(prefix))) seen.calls++;
      }),
    ),
  );
  /** A marker through one node: MONITOR reports commands in the order the node ran them. */
  const mark = async (url: string): Promise<void> => {
    const m = uid(`${prefix}-mark`);
    const t = target(url);
    const probe = connect({ host: t.host, port: t.port });
    probe.on('error', () => undefined); // a probe that cannot reach the node shows as the marker's timeout
    try {
      probe.write((t.auth.length ? resp('AUTH', ...t.auth) : '') + resp('ECHO', m));
      await waitFor(() => {
        if (monitors.some((x) => x.closed())) throw new Error('a MONITOR connection closed while watching');
        return marks.has(m);
      }, 5_000, `the marker on ${t.host}:${t.port}`);
    } finally {
      probe.destroy();
    }
  };
  return {
    get calls() {
      return seen.calls;
    },
    set calls(n: number) {
      seen.calls = n;
    },
    settle: async () => void (await Promise.all(urls.map(mark))),
    stop: () => monitors.forEach((x) => x.socket.destroy()),
  };
}

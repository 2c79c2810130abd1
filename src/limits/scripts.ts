/**
 * The one loader of the Lua scripts in lua/. A script may paste a shared prelude with a
 * line `-- #include <file>.lua` (bucket.lua: the token-bucket, slice and admission rules).
 * Each script is sent as ioredis' defineCommand would send it: EVAL the first time on a
 * connection, EVALSHA after that, EVAL again after a NOSCRIPT (e.g. a Redis restart).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Command, type Cluster, type Redis } from 'ioredis';

export const SCRIPTS = {
  keywardAdmit: 'admit.lua',
  keywardLease: 'lease.lua',
  keywardSettle: 'settle.lua',
  keywardRefresh: 'refresh.lua',
  keywardPeek: 'peek.lua',
  keywardHold: 'hold.lua',
  keywardLedger: 'ledger.lua',
} as const;
export type ScriptName = keyof typeof SCRIPTS;
export type RunScript = (name: ScriptName, keys: string[], args: (string | number)[]) => Promise<unknown>;

const read = (file: string): string => readFileSync(new URL(`./lua/${file}`, import.meta.url), 'utf8');

/** A script's source with its includes pasted in. */
export function scriptSource(file: string): string {
  return read(file).replace(/^-- #include (\S+\.lua)$/gm, (_, inc: string) => read(inc));
}

type ScriptCommand = new (name: string, args: never[], options: { replyEncoding: 'utf8' }) => Command;
/** Per script: its SHA1 and the command class that sends it (one per process). */
let scripts: Record<ScriptName, { sha: string; Cmd: ScriptCommand }> | null = null;
const NO_ARGS: never[] = [];
/** Replies as strings, as defineCommand's commands have them (without it, bulk replies are Buffers). */
const UTF8 = { replyEncoding: 'utf8' } as const;

/**
 * A Command that sends one script: EVAL with its source on a connection that has not had it
 * yet, EVALSHA on one that has (what ioredis' Script does). A NOSCRIPT answer marks the
 * connection as without it, and the caller sends the command again.
 */
function commandFor(lua: string, sha: string): ScriptCommand {
  const loaded = new WeakSet<object>();
  return class extends Command {
    override toWritable(socket: object): string | Buffer {
      const reject = this.reject;
      this.reject = (err: Error) => {
        if (err.message.includes('NOSCRIPT')) loaded.delete(socket);
        reject.call(this, err);
      };
      if (!loaded.has(socket)) {
        loaded.add(socket);
        this.name = 'eval';
        this.args[0] = lua;
      } else if (this.name === 'eval') {
        this.name = 'evalsha';
        this.args[0] = sha;
      }
      return super.toWritable(socket);
    }
  };
}

/**
 * A runner of the scripts on the client. Not defineCommand: the command it builds per call
 * takes the arguments spread, and ioredis' Command copies them with Array.prototype.flat,
 * which on Node 20 costs about 75 ns an argument (30 µs for a settlement batch of 400, more
 * than the rest of the call). Here each call's argument list is built once and handed to a
 * command made with none.
 */
export function scriptRunner(client: Redis | Cluster): RunScript {
  scripts ??= Object.fromEntries(
    Object.entries(SCRIPTS).map(([name, file]) => {
      const lua = scriptSource(file);
      const sha = createHash('sha1').update(lua).digest('hex');
      return [name, { sha, Cmd: commandFor(lua, sha) }];
    }),
  ) as Record<ScriptName, { sha: string; Cmd: ScriptCommand }>;
  const all = scripts;
  const turn = turnOf(client);
  const send = (Cmd: ScriptCommand, argv: string[]): Promise<unknown> => {
    const cmd = new Cmd('evalsha', NO_ARGS, UTF8);
    cmd.args = argv;
    return client.sendCommand(cmd) as Promise<unknown>;
  };
  return (name, keys, args) => {
    turn.cork();
    const { sha, Cmd } = all[name];
    // Strings, as Command's constructor would have made them (it does so only for what it is given).
    const argv: string[] = [sha, String(keys.length)];
    for (const k of keys) argv.push(k);
    for (const a of args) argv.push(typeof a === 'string' ? a : String(a));
    // Sent again, as EVAL, when this connection's Redis no longer has the script.
    return send(Cmd, argv).catch((err: Error) => {
      if (!err.message.includes('NOSCRIPT')) throw err;
      // The first command may have written the source in place of the SHA (an EVAL on a
      // node it was redirected from); the new one starts as EVALSHA, as the first did.
      argv[0] = sha;
      return send(Cmd, argv);
    });
  };
}

/**
 * Runs `fn` at the end of this event-loop turn, before the turn's calls are written: what
 * it sends (a batch of what the turn's requests asked for) leaves in the same write.
 */
export function atTurnEnd(client: Redis | Cluster, fn: () => void): void {
  turnOf(client).atEnd(fn);
}

type Corkable = { cork(): void; uncork(): void };
interface Turn {
  cork(): void;
  atEnd(fn: () => void): void;
}
/** One per client: every limiter on a connection shares its turn. */
const turns = new WeakMap<object, Turn>();
const turnOf = (client: Redis | Cluster): Turn => {
  let t = turns.get(client);
  if (!t) turns.set(client, (t = coalescer(client)));
  return t;
};

/**
 * The calls of one event-loop turn leave in one write: the first corks the connection's
 * socket (every master's on a Cluster) and the socket is uncorked once the turn's I/O
 * callbacks have run (setImmediate), so many admissions share one syscall. This is what
 * ioredis' enableAutoPipelining is for, without its Pipeline object per turn and its
 * extra promise per command, which cost more client CPU than the syscalls they save.
 * Order on the connection is unchanged.
 */
function coalescer(client: Redis | Cluster): Turn {
  let corked: Corkable[] | null = null;
  let due: (() => void)[] = [];
  let scheduled = false;
  // A Cluster's connections change with failovers and resharding: asked for at each turn.
  const streams = (): Corkable[] => {
    if (!client.isCluster) {
      // One connection: no list to build from the nodes, once per turn.
      const s = (client as Redis).stream as Corkable | undefined;
      return s ? [s] : [];
    }
    return (client as Cluster).nodes('master').flatMap((n) => (n.stream ? [n.stream as Corkable] : []));
  };
  const end = (): void => {
    try {
      // Still `scheduled`: what these send joins this turn's write instead of the next.
      while (due.length > 0) {
        const fns = due;
        due = [];
        for (const fn of fns) fn();
      }
    } finally {
      scheduled = false;
      const s = corked;
      corked = null;
      if (s) for (const x of s) x.uncork();
    }
  };
  const schedule = (): void => {
    if (scheduled) return;
    scheduled = true;
    setImmediate(end);
  };
  return {
    cork() {
      if (corked) return;
      corked = streams();
      for (const x of corked) x.cork();
      schedule();
    },
    atEnd(fn) {
      due.push(fn);
      schedule();
    },
  };
}

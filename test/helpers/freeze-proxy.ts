/**
 * A TCP proxy in front of Redis that can hold every byte in both directions ("frozen"), as a
 * Redis that hung or a link that stalled would, then deliver what it held or drop it with the
 * connections, as a link that failed would.
 */
import net from 'node:net';
import { once } from 'node:events';

export interface FreezeProxy {
  /** redis://… of the proxy */
  url: string;
  frozen: boolean;
  /** Delivers every held write, in order, and stops holding. */
  thaw(): void;
  /** Forgets every held write and cuts every connection: what was held never arrives. */
  cut(): void;
  close(): void;
}

export interface FreezeProxyOptions {
  /** the Redis to pass bytes to */
  target: URL;
  /** Sees every chunk as it arrives, before it is held or passed on. */
  seen?: (chunk: Buffer, toClient: boolean, conn: object) => void;
}

export async function startFreezeProxy(o: FreezeProxyOptions): Promise<FreezeProxy> {
  const held: (() => void)[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(o.target.port || 6379), o.target.hostname);
    const conn = {};
    const pipe = (from: net.Socket, to: net.Socket, toClient: boolean): void => {
      from.on('data', (d: Buffer) => {
        o.seen?.(d, toClient, conn);
        if (proxy.frozen) held.push(() => to.write(d));
        else to.write(d);
      });
    };
    pipe(client, upstream, false);
    pipe(upstream, client, true);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => (client.destroy(), upstream.destroy()));
    }
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const proxy: FreezeProxy = {
    url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    frozen: false,
    thaw() {
      proxy.frozen = false;
      for (const write of held.splice(0)) write();
    },
    cut() {
      held.length = 0;
      proxy.frozen = false;
      for (const s of sockets) s.destroy();
    },
    close() {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
  return proxy;
}

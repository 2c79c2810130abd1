/**
 * Listening on a configured address, for the composition roots that open a port: the
 * sidecar's proxy port, the cluster primary and the console.
 */
import type { Server } from 'node:http';

/** Starts `server` on `host:port` and resolves with the port it got (port 0: any free one). */
export function listen(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      const addr = server.address();
      resolve(typeof addr === 'object' && addr ? addr.port : port);
    });
  });
}

/** `http://host:port`, an IPv6 host in brackets. */
export function httpUrl(host: string, port: number): string {
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
}

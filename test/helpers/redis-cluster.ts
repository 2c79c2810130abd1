/**
 * A real local Redis Cluster of three masters (no replicas) for the conformance suite.
 */
import { REDIS_CLI, type RedisProcess, execFileP, makeTmpDir, spawnRedisOnSomePort, waitFor } from './redis-server.js';

export interface LocalCluster {
  ports: number[];
  /** The limiter URL form: redis+cluster://127.0.0.1:p1,127.0.0.1:p2,... */
  url: string;
  stop(): Promise<void>;
}

export async function startRedisCluster(masters = 3): Promise<LocalCluster> {
  const tmp = await makeTmpDir('cluster');
  const servers: RedisProcess[] = [];
  const ports: number[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(servers.map((s) => s.stop()));
    await tmp.remove();
  };
  try {
    for (let i = 0; i < masters; i++) {
      // The cluster bus listens on port + 10000, so ports stay below 55535.
      const { port, server } = await spawnRedisOnSomePort(
        (p) => [
          '--cluster-enabled', 'yes',
          '--cluster-config-file', `${tmp.dir}/nodes-${p}.conf`,
          '--cluster-node-timeout', '2000',
          '--save', '',
          '--appendonly', 'no',
          '--dir', tmp.dir,
        ],
        { base: 21_000, span: 20_000 },
      );
      servers.push(server);
      ports.push(port);
    }
    await execFileP(REDIS_CLI, [
      '--cluster', 'create',
      ...ports.map((p) => `127.0.0.1:${p}`),
      '--cluster-replicas', '0',
      '--cluster-yes',
    ]);
    const clusterOk = async (port: number): Promise<boolean> => {
      const { stdout } = await execFileP(REDIS_CLI, ['-p', String(port), 'cluster', 'info']);
      return /cluster_state:ok/.test(stdout) && /cluster_slots_assigned:16384/.test(stdout);
    };
    await waitFor(async () => (await Promise.all(ports.map(clusterOk))).every(Boolean), 15_000, 'cluster_state:ok', 100);
  } catch (err) {
    await stop();
    throw err;
  }
  return { ports, url: `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(',')}`, stop };
}

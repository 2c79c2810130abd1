/**
 * A real local Redis Cluster: three masters by default (the conformance suite), or masters
 * with one replica each (the failover tests, which kill a master and wait for its replica).
 */
import { REDIS_CLI, type RedisProcess, execFileP, makeTmpDir, spawnRedisOnSomePort, waitFor } from './redis-server.js';

export interface ClusterNode {
  port: number;
  server: RedisProcess;
}

export interface LocalCluster {
  ports: number[];
  nodes: ClusterNode[];
  /** The limiter URL form: redis+cluster://127.0.0.1:p1,127.0.0.1:p2,... */
  url: string;
  /** `redis-cli -p port ...`, stdout. */
  cli(port: number, ...args: string[]): Promise<string>;
  /**
   * Port of the master serving `slot`, as the live nodes see it (null while none does);
   * with `via`, as that node alone sees it (a node that hangs would stall each ask 5 s).
   */
  masterOf(slot: number, via?: number): Promise<number | null>;
  /** Slot of a key, computed by the cluster itself. */
  keySlot(key: string): Promise<number>;
  /** True when every live node reports cluster_state:ok and all 16384 slots served. */
  healthy(): Promise<boolean>;
  stop(): Promise<void>;
}

export interface ClusterOptions {
  masters?: number;
  /** Replicas per master; default 0. */
  replicas?: number;
  /** cluster-node-timeout; default 2000. */
  nodeTimeoutMs?: number;
  /** cluster-require-full-coverage; default yes (Redis' own default). */
  fullCoverage?: boolean;
}

export async function startRedisCluster(arg: number | ClusterOptions = {}): Promise<LocalCluster> {
  const o: ClusterOptions = typeof arg === 'number' ? { masters: arg } : arg;
  const masters = o.masters ?? 3;
  const total = masters * (1 + (o.replicas ?? 0));
  const tmp = await makeTmpDir('cluster');
  const nodes: ClusterNode[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(nodes.map((n) => n.server.stop()));
    await tmp.remove();
  };
  const cli = async (port: number, ...args: string[]): Promise<string> =>
    (await execFileP(REDIS_CLI, ['-p', String(port), ...args], { timeout: 5_000 })).stdout;
  const alive = (): ClusterNode[] => nodes.filter((n) => n.server.proc.exitCode === null && n.server.proc.signalCode === null);

  const masterOf = async (slot: number, via?: number): Promise<number | null> => {
    for (const port of via === undefined ? alive().map((n) => n.port) : [via]) {
      const nodesOut = await cli(port, 'cluster', 'nodes').catch(() => '');
      if (!nodesOut) continue;
      for (const line of nodesOut.split('\n')) {
        const f = line.split(' ');
        if (f.length < 9 || !f[2]!.includes('master') || f[2]!.includes('fail')) continue;
        for (const range of f.slice(8)) {
          const [a, b] = range.split('-').map(Number);
          if (a !== undefined && !Number.isNaN(a) && slot >= a && slot <= (b ?? a)) return Number(f[1]!.split(/[:@]/)[1]);
        }
      }
      return null;
    }
    return null;
  };

  const healthy = async (): Promise<boolean> => {
    const live = alive();
    const infos = await Promise.all(live.map((n) => cli(n.port, 'cluster', 'info').catch(() => '')));
    return infos.every((i) => /cluster_state:ok/.test(i) && /cluster_slots_ok:16384/.test(i));
  };

  try {
    for (let i = 0; i < total; i++) {
      // The cluster bus listens on port + 10000, so ports stay below 55535.
      const { port, server } = await spawnRedisOnSomePort(
        (p) => [
          '--cluster-enabled', 'yes',
          '--cluster-config-file', `${tmp.dir}/nodes-${p}.conf`,
          '--cluster-node-timeout', String(o.nodeTimeoutMs ?? 2000),
          '--cluster-require-full-coverage', o.fullCoverage === false ? 'no' : 'yes',
          // A replica must be in sync before a master is killed: no 5 s wait before the first sync,
          // and a replica may always take over whatever its link's age.
          '--repl-diskless-sync-delay', '0',
          '--cluster-replica-validity-factor', '0',
          '--save', '',
          '--appendonly', 'no',
          '--dir', tmp.dir,
        ],
        { base: 21_000, span: 20_000 },
      );
      nodes.push({ port, server });
    }
    await execFileP(REDIS_CLI, [
      '--cluster', 'create',
      ...nodes.map((n) => `127.0.0.1:${n.port}`),
      '--cluster-replicas', String(o.replicas ?? 0),
      '--cluster-yes',
    ]);
    const replicasUp = async (): Promise<boolean> => {
      if (!o.replicas) return true;
      const infos = await Promise.all(nodes.map((n) => cli(n.port, 'info', 'replication')));
      return infos.filter((i) => /master_link_status:up/.test(i)).length === masters * o.replicas;
    };
    await waitFor(async () => (await healthy()) && (await replicasUp()), 20_000, 'cluster_state:ok', 100);
  } catch (err) {
    await stop();
    throw err;
  }
  const ports = nodes.map((n) => n.port);
  return {
    ports,
    nodes,
    url: `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(',')}`,
    cli,
    masterOf,
    keySlot: async (key) => Number((await cli(alive()[0]!.port, 'cluster', 'keyslot', key)).trim()),
    healthy,
    stop,
  };
}

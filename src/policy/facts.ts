/**
 * What the decision core knows about one key: the key, its project and its owner's
 * wallet, as the replica returns them in one lookup. Defined here, beside the decisions
 * that read it; the replica produces it and the proxy carries it.
 */

export interface FactsKey {
  id: string;
  kind: 'personal' | 'team';
  userId: string | null;
  projectId: string | null;
  status: 'active' | 'deleted';
  budget: number | null;
  spent: number;
  models: string[] | null;
  routing: string | null;
  rpm: number | null;
  tpm: number | null;
  concurrency: number | null;
  epoch: number;
  ips: string[] | null;
  allowBrowser: boolean;
  modelLimits: ModelLimit[] | null;
  period: 'day' | 'week' | 'month' | null;
}

/** Limits for the models a glob names, in addition to the key's own; the first matching entry applies. */
export interface ModelLimit {
  models: string;
  rpm: number | null;
  tpm: number | null;
}

export interface FactsProject {
  id: string;
  status: 'enabled' | 'disabled';
  budget: number | null;
  spent: number;
  epoch: number;
}

/** Everything the policy needs about one key. */
export interface KeyFacts {
  key: FactsKey;
  project: FactsProject | null;
  /** null when the console sent no wallet for the key's user */
  walletBalance: number | null;
  walletEpoch: number | null;
}

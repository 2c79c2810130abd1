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
}

export interface FactsProject {
  id: string;
  status: 'enabled' | 'disabled';
  budget: number | null;
  spent: number;
}

/** Everything the policy needs about one key. */
export interface KeyFacts {
  key: FactsKey;
  project: FactsProject | null;
  /** null when the console sent no wallet for the key's user */
  walletBalance: number | null;
}

/** cluster-key-slot ships no types: its default export is Redis Cluster's HASH_SLOT of a key (hash tags honoured). */
declare module 'cluster-key-slot' {
  function calculateSlot(key: string | Buffer): number;
  export default calculateSlot;
}

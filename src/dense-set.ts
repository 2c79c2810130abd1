/**
 * A set for objects that come and go once per request (responses in flight, body watches),
 * kept in the cells of an array instead of a Map or Set.
 *
 * Why not a Set: V8 stores a Set in a hash table that is replaced by a new one again and
 * again as entries are added and deleted. The table left behind keeps pointers to its
 * successor and to every entry it held; once such a table is in the old generation, each
 * young-generation collection treats those pointers as live, so whole request graphs are
 * promoted and the promoted successor does the same to the next table. An array's cells
 * are overwritten in place, so nothing links one request's objects to the next
 * (docs/performance.md has the figures).
 */
export class DenseSet<T> {
  private readonly cells: (T | undefined)[] = [];
  /** indexes of empty cells, reused before the array grows */
  private readonly free: number[] = [];
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** Adds `item`; returns its index, which `delete` takes. */
  add(item: T): number {
    const index = this.free.length > 0 ? this.free.pop()! : this.cells.length;
    if (index === this.cells.length) this.cells.push(item);
    else this.cells[index] = item;
    this.count++;
    return index;
  }

  /**
   * Empties cell `index` (an empty cell stays so). Once emptied, the index may go to the
   * next `add`: its holder gives it back once and forgets it.
   */
  delete(index: number): void {
    if (index < 0 || index >= this.cells.length || this.cells[index] === undefined) return;
    this.cells[index] = undefined;
    this.free.push(index);
    this.count--;
  }

  /** Calls `fn` for each item; an item deleted during the walk is not visited after. */
  forEach(fn: (item: T) => void): void {
    for (let i = 0; i < this.cells.length; i++) {
      const item = this.cells[i];
      if (item !== undefined) fn(item);
    }
  }
}

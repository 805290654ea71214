#!/usr/bin/env python3
"""A model of PyTorch's CUDA caching allocator, for the memory a training step *reserves*.

`torch.cuda.max_memory_reserved()` is what a GPU run of `measure-training-memory.py` reports
and what a device must hold; the trace (`--trace`) sees only the allocations. Between the two
lie the allocator's rules, which are deterministic given the order of allocations and frees:
this module replays that order through the same rules, so a traced case also gets the peak a
GPU's allocator would reserve. It follows `c10/cuda/CUDACachingAllocator.cpp` in its default
configuration (PyTorch 2.x, `PYTORCH_CUDA_ALLOC_CONF` unset: no expandable segments, no
`max_split_size_mb`, no garbage-collection threshold); the constants are those of
`c10/core/AllocatorConfig.h` as shipped with torch 2.11.

* Every request is rounded up to a multiple of 512 bytes; requests of up to 1 MiB come from
  the small pool, larger ones from the large pool, and a block never moves between pools.
* A request takes the smallest free block of its pool that is large enough (the lowest address
  among equals). With none, the allocator reserves a new segment (`cudaMalloc`): 2 MiB for a
  small request, 20 MiB for a request under 10 MiB, otherwise the request rounded up to 2 MiB.
* A block larger than the request is split, the request taking its start, when what remains
  is at least 512 bytes (small pool) or more than 1 MiB (large pool); otherwise the request
  keeps the whole block, and the allocated figure counts the whole block.
* A freed block merges with its free neighbours of the same segment and returns to its pool.
  Segments are never given back while memory lasts; when a new segment does not fit the
  device, every wholly free segment is released and the request retried once, and a request
  that still does not fit is out of memory.

Not modelled: several streams (training on one GPU uses one), CUDA graphs' private pools, and
the blocks' stream-use events (a block freed while another stream uses it is held back).

    scripts/caching_allocator.py --self-test      # the rules above, on worked examples
"""

from __future__ import annotations

import bisect
import sys

KIB = 1 << 10
MIB = 1 << 20

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MIB  # kSmallSize: the largest small-pool request
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: a segment for a request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge


class OutOfMemory(Exception):
    """A request that no free block meets and no new segment fits, after releasing the cache."""


class Block:
    """A range of one segment: allocated, or free in its pool's list."""

    __slots__ = ("addr", "size", "small", "prev", "next", "allocated")

    def __init__(self, addr: int, size: int, small: bool):
        self.addr = addr
        self.size = size
        self.small = small
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False


class CachingAllocator:
    """One device's allocator. `capacity` is what `cudaMalloc` can still hand out (the device's
    memory less the CUDA context and anything else resident); `None` never runs out, so
    `peak_reserved` is what the program reserves when memory is not short."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        # Free blocks of each pool, ordered as the allocator's BlockComparatorSize orders them:
        # by size, then address. `(size, addr)` keys, and the blocks by address.
        self._free_keys: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._free_blocks: dict[int, Block] = {}
        self._next_addr = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0
        self.retries = 0

    @staticmethod
    def round_size(nbytes: int) -> int:
        return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def malloc(self, nbytes: int) -> Block:
        """Allocates `nbytes` (rounded) and returns the block; raises `OutOfMemory`."""
        size = self.round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_free(small, size)
        if block is None:
            block = self._new_segment(small, self.segment_size(size))
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = Block(block.addr + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._put_free(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        """Returns `block` to its pool, merged with its free neighbours."""
        if not block.allocated:
            raise ValueError("block freed twice")
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._take_block(neighbour)
                if neighbour is block.prev:
                    block.addr = neighbour.addr
                    block.prev = neighbour.prev
                    if block.prev is not None:
                        block.prev.next = block
                else:
                    block.next = neighbour.next
                    if block.next is not None:
                        block.next.prev = block
                block.size += neighbour.size
        self._put_free(block)

    def reset_peaks(self) -> None:
        """As `torch.cuda.reset_peak_memory_stats()`: peaks restart from the current figures."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def _new_segment(self, small: bool, size: int) -> Block:
        if self.capacity is not None and self.reserved + size > self.capacity:
            self._release_cached()
            self.retries += 1
            if self.reserved + size > self.capacity:
                raise OutOfMemory(
                    f"{size} bytes more do not fit: {self.reserved} reserved, {self.allocated} allocated, capacity {self.capacity}"
                )
        block = Block(self._next_addr, size, small)
        # Segments never touch, so blocks only ever merge within their own segment.
        self._next_addr += size + MIB
        self.reserved += size
        self.segments += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached(self) -> None:
        """Gives back every segment that is one free block (release_cached_blocks)."""
        for small in (True, False):
            for size, addr in list(self._free_keys[small]):
                block = self._free_blocks[addr]
                if block.prev is None and block.next is None:
                    self._take_block(block)
                    self.reserved -= size
                    self.segments -= 1

    def _take_free(self, small: bool, size: int) -> Block | None:
        keys = self._free_keys[small]
        i = bisect.bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        block = self._free_blocks.pop(keys[i][1])
        del keys[i]
        return block

    def _take_block(self, block: Block) -> None:
        keys = self._free_keys[block.small]
        del keys[bisect.bisect_left(keys, (block.size, block.addr))]
        del self._free_blocks[block.addr]

    def _put_free(self, block: Block) -> None:
        bisect.insort(self._free_keys[block.small], (block.size, block.addr))
        self._free_blocks[block.addr] = block


def self_test() -> None:
    """Worked examples of each rule; raises AssertionError on the first that fails."""
    a = CachingAllocator()
    # Small requests share a 2 MiB segment; sizes round up to 512 bytes.
    x = a.malloc(1)
    y = a.malloc(1000)
    assert (x.size, y.size, a.allocated, a.reserved, a.segments) == (512, 1024, 1536, 2 * MIB, 1)
    # A request under 10 MiB takes a 20 MiB segment; its 15 MiB remainder stays free.
    b = a.malloc(5 * MIB)
    assert (a.reserved, a.segments) == (22 * MIB, 2)
    # The remainder serves the next large request: no new segment.
    c = a.malloc(15 * MIB)
    assert (a.reserved, a.segments, c.size) == (22 * MIB, 2, 15 * MIB)
    # Freeing both merges them back into the 20 MiB block, which a 20 MiB request then takes.
    a.free(b)
    a.free(c)
    d = a.malloc(20 * MIB)
    assert (a.reserved, d.size) == (22 * MIB, 20 * MIB)
    a.free(d)
    # A large request rounds its segment up to 2 MiB; the smallest fitting block is taken.
    e = a.malloc(11 * MIB + 1)
    assert (e.size, a.reserved) == (11 * MIB + MIN_BLOCK, 22 * MIB)  # from the free 20 MiB block
    f = a.malloc(25 * MIB + 1)
    # ... and keeps the whole 26 MiB segment: 1 MiB less 512 bytes would remain, too little to split.
    assert (a.reserved, f.size) == (22 * MIB + 26 * MIB, 26 * MIB)
    # A large block is not split when 1 MiB or less would remain: the request keeps it whole.
    a.free(e)
    g = a.malloc(19 * MIB + 512)
    assert g.size == 20 * MIB and a.allocated == x.size + y.size + f.size + 20 * MIB
    # Fragmentation: two 40 MiB blocks freed apart from each other cannot serve 80 MiB.
    h = CachingAllocator()
    p, q, r = h.malloc(40 * MIB), h.malloc(4 * MIB), h.malloc(40 * MIB)
    assert h.reserved == 40 * MIB + 20 * MIB + 40 * MIB
    h.free(p)
    h.free(r)
    h.malloc(80 * MIB)
    assert h.reserved == 180 * MIB and h.allocated == 4 * MIB + 80 * MIB
    # With a capacity, the cache is released before running out, and then it runs out.
    k = CachingAllocator(capacity=100 * MIB)
    s = k.malloc(60 * MIB)
    k.free(s)
    k.malloc(70 * MIB)  # the free 60 MiB segment is given back first
    assert (k.reserved, k.retries) == (70 * MIB, 1)
    try:
        k.malloc(40 * MIB)
    except OutOfMemory:
        pass
    else:
        raise AssertionError("a request beyond the capacity must run out of memory")
    t = k.malloc(1)
    k.free(t)
    try:
        k.free(t)
    except ValueError:
        pass
    else:
        raise AssertionError("freeing a free block must fail")


if __name__ == "__main__":
    if sys.argv[1:] != ["--self-test"]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    self_test()
    print("caching_allocator: self-test passed")

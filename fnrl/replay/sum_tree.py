"""A vectorized sum tree in one flat tensor (Schaul et al. 2016, arXiv:1511.05952, App. B.2.1).

Layout: each inner node has K = `ARITY` (32) children, and the levels are stored one after
the other in a flat float64 tensor, root first: level l holds K^l nodes at offsets
(K^l - 1) / (K - 1) ..., node j of level l has children K j .. K j + K - 1 on level l + 1,
and the last level (D = ceil(log_K(num_leaves))) holds the leaves, padded with zeros.
Every inner node holds exactly the sum of its K children (recomputed from them, never
incremented, so duplicate indices in a batch and float drift cannot break it).

Both operations work on a whole batch at once and loop only over the D levels:
- `sum_tree_set` writes a batch of leaves, then recomputes the distinct parents of the
  touched nodes one level at a time (gather [M, K] children, sum);
- `sum_tree_find` descends all N query masses from the root together (per level: gather
  [N, K] children, cumulative sum, pick the child the mass falls in).
A 32-ary tree has 4 levels for 1M leaves instead of a binary tree's 20, so a batch costs
5x fewer tensor ops (measured ~3x faster on CPU for both operations).

The tree is updated in place: a replay buffer is preallocated and mutated, never copied.
"""
from __future__ import annotations

import torch

__all__ = ["ARITY", "sum_tree_init", "sum_tree_levels", "sum_tree_set", "sum_tree_get", "sum_tree_total",
           "sum_tree_find", "sum_tree_sample"]

ARITY = 32


def _depth_for(num_leaves: int) -> int:
    depth = 0
    while ARITY ** depth < num_leaves:
        depth += 1
    return depth


def sum_tree_levels(tree: torch.Tensor) -> list[torch.Tensor]:
    """Views of the levels of `tree`, root ([1]) first, leaves ([K^D]) last."""
    levels, offset, width = [], 0, 1
    while offset < tree.shape[0]:
        levels.append(tree[offset:offset + width])
        offset, width = offset + width, width * ARITY
    return levels


def sum_tree_init(num_leaves: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """An all-zero tree with room for `num_leaves` leaves: float64 [sum_{l<=D} K^l]."""
    if num_leaves < 1:
        raise ValueError(f"num_leaves must be >= 1, got {num_leaves}")
    size = sum(ARITY ** level for level in range(_depth_for(num_leaves) + 1))
    return torch.zeros(size, dtype=torch.float64, device=device)


def sum_tree_set(tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor, dedup: bool = True) -> torch.Tensor:
    """Set leaves `index` [M] (int64) to `value` [M] (>= 0) and fix their ancestors; returns `tree`.

    For each level from the leaves up, each distinct parent p = node // K gets
    sum_k child[K p + k] (deduplicating keeps the work at (distinct parents) x K per level:
    a rollout's leaves share few parents; on a GPU this costs one sync per level).
    dedup=False recomputes a shared parent once per child instead (same sums, M x K work per
    level, no data-dependent shapes, and writes by flat index into `tree` rather than into
    views of its levels, so that under torch.compile they stay in place instead of copying
    the whole tree).
    Duplicate indices are allowed; if they carry different values, which one wins is
    unspecified (as with any index_put).
    """
    if not dedup:
        return _sum_tree_set_flat(tree, index, value)
    levels = sum_tree_levels(tree)
    levels[-1][index] = value.to(tree.dtype)
    node = index
    for parent, children in zip(reversed(levels[:-1]), reversed(levels[1:])):
        node = torch.unique(torch.div(node, ARITY, rounding_mode="floor"))
        parent[node] = children.view(-1, ARITY).index_select(0, node).sum(-1)
    return tree


def _sum_tree_set_flat(tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`sum_tree_set(..., dedup=False)`: the same writes as index_put_ on `tree` itself."""
    starts = [0]
    for level in sum_tree_levels(tree)[:-1]:
        starts.append(starts[-1] + level.shape[0])   # start of each level in the flat tree
    tree.index_put_((starts[-1] + index,), value.to(tree.dtype))
    child_rank = torch.arange(ARITY, device=tree.device)
    node = index
    for depth in range(len(starts) - 2, -1, -1):
        node = torch.div(node, ARITY, rounding_mode="floor")
        children = starts[depth + 1] + node.unsqueeze(-1) * ARITY + child_rank      # [M, K]
        tree.index_put_((starts[depth] + node,), tree[children].sum(-1))
    return tree


def sum_tree_get(tree: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Leaf values at `index` [...]: float64 [...]."""
    return sum_tree_levels(tree)[-1][index]


def sum_tree_total(tree: torch.Tensor) -> torch.Tensor:
    """Sum of all leaves (the root): float64 []."""
    return tree[0]


def sum_tree_find(tree: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Leaf index j with cumsum(leaves)[j-1] <= mass < cumsum(leaves)[j], for each of N masses.

    mass: [N] in [0, total). At each level a query moves to the first child whose running
    sum exceeds its mass and subtracts the sum of the children before it. Empty children
    add nothing to the running sum, so they are never chosen; a mass that rounding pushes
    past the end is sent to the last non-empty child. Hence, when the tree holds any
    positive leaf, every result is a leaf with positive value (masses >= total land on
    the last one). Returns int64 [N].
    """
    node = torch.zeros_like(mass, dtype=torch.int64)
    mass = mass.to(tree.dtype)
    child_rank = torch.arange(ARITY, device=tree.device)
    for children in sum_tree_levels(tree)[1:]:
        weight = children.view(-1, ARITY).index_select(0, node)                  # [N, K]
        running = weight.cumsum(-1)
        pick = (running <= mass.unsqueeze(-1)).sum(-1)
        pick = torch.minimum(pick, ((weight > 0) * child_rank).amax(-1)).unsqueeze(-1)
        mass = mass - (running - weight).gather(-1, pick).squeeze(-1)
        node = node * ARITY + pick.squeeze(-1)
    return node


def sum_tree_sample(tree: torch.Tensor, n: int, *, stratified: bool,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw n leaves with P(j) = leaf_j / total; returns int64 [n].

    stratified=True splits [0, total) into n equal segments and draws one mass in each
    (Schaul et al. 2016), so the batch covers the distribution evenly and comes out in
    leaf order; stratified=False draws n independent masses.
    """
    u = torch.rand(n, dtype=tree.dtype, device=tree.device, generator=generator)
    if stratified:
        u = (torch.arange(n, dtype=tree.dtype, device=tree.device) + u) / n
    return sum_tree_find(tree, u * sum_tree_total(tree))

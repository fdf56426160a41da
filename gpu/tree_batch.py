"""A batch of draft trees as padded tensors (theory.md §0), plus converters and the tree-attention mask.

Layout (``B`` trees, ``N`` slots per tree, the largest tree's node count)::

    parent    [B, N] long   parent slot of every node; −1 for the root (slot 0) and for padded slots
    token     [B, N] long   drafted token of every node; −1 for the root and for padded slots
    num_nodes [B]    long   valid slots ``0..num_nodes−1`` of each tree (ragged trees allowed)
    vocab_size      int     (optional) the vocabulary V the trees' tokens come from: every token is below it, and
                            a validating call given rows of another V refuses them (as the exact core does a
                            tree's)

Exactly as in :class:`univer_theory.DraftTree`: parents precede children, siblings keep their drafting order
(= slot order), i.i.d. duplicates are separate children.  Derived tensors (``depth``, ``children``, the
per-depth lists of internal nodes) are computed once per batch and cached; computing them is the batch's one
host synchronisation (a level rule may add its own for data-dependent shapes: :mod:`gpu.engine`).  Batches of
one skeleton share them (:meth:`TreeBatch.with_tokens`: a decode step of a static tree derives nothing).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from univer_theory import DraftTree
from univer_theory.nx import get_backend
from univer_theory.orders import order_ranks
from univer_theory.validation import check_int

from .host import on_host
from .unique import unique_rows


def _shape_ids(children, height, max_depth: int):
    """:attr:`TreeBatch.subtree_shapes` from the batch's ``children [B, N, K]`` (dump slot N) and ``height
    [B, N]``, on one backend (:mod:`univer_theory.nx`; numpy views on the CPU, :func:`gpu.host.on_host`)."""
    nx = get_backend(children)
    B, N, _ = children.shape
    ids = nx.full((B, N + 1), -1, children)
    ids[:, :N][height == 0] = 0
    keys = ["."]
    for h in range(1, max_depth + 1):
        at = height == h
        rows = nx.take(ids, children.reshape(B, -1)).reshape(B, N, -1)[at]     # [M, K], −1 = no child
        uniq, inverse = unique_rows(rows)
        ids[:, :N][at] = len(keys) + inverse
        keys += ["(" + ",".join(keys[c] for c in row if c >= 0) + ")" for row in uniq.tolist()]
    return ids[:, :N], tuple(keys)


def _depths(parent, valid):
    """:attr:`TreeBatch.depth` by pointer jumping: ``d(u)`` starts at 1 below a parent (0 at a root) and ``a(u)``
    at the parent (the root itself); each round ``d(u) += d(a(u))``, ``a(u) = a(a(u))`` doubles the span summed,
    so ⌈log₂ N⌉ rounds reach every root.  numpy or torch (:mod:`univer_theory.nx`)."""
    nx = get_backend(parent)
    N = parent.shape[1]
    has = parent >= 0
    depth = nx.where(has, 1, 0) + 0 * parent
    anc = nx.where(has, parent, nx.arange(N, parent)[None, :] + 0 * parent)
    for _ in range(max(N - 1, 1).bit_length()):
        depth = depth + nx.take(depth, anc)
        anc = nx.take(anc, anc)
    return nx.where(valid, depth, -1)


def _heights(children, internal, valid, max_depth: int):
    """:attr:`TreeBatch.height` from ``children [B, N, K]`` (dump slot N): ``max_depth`` rounds of
    ``h(u) = 1 + max_j h(child_j)`` (round t makes every height ≤ t + 1 right).  numpy or torch."""
    nx = get_backend(children)
    B, N, _ = children.shape
    height = nx.full((B, N + 1), 0, children)
    height[:, N] = -1                                     # the dump slot ``children`` pads with
    for _ in range(max_depth):
        below = nx.amax(nx.take(height, children.reshape(B, -1)).reshape(B, N, -1))
        height[:, :N] = nx.where(internal, below + 1, 0)
    return nx.where(valid, height[:, :N], -1)


def _level_nodes(num_children, valid, depth, children, max_depth: int):
    """:attr:`TreeBatch.level_nodes` on one backend (:mod:`univer_theory.nx`): per depth one stable sort of the
    branching, largest first, and the count of rows with a j-th child (a host read: the level's shapes)."""
    nx = get_backend(num_children)
    N = num_children.shape[1]
    k = nx.where((num_children > 0) & valid, num_children, 0).reshape(-1)
    depth = depth.reshape(-1)
    out = []
    for d in range(max_depth):
        k_d = nx.where(depth == d, k, 0)
        order = nx.argsort(-k_d)                          # largest branching first, ties in (tree, slot) order
        counts = (k_d[:, None] > nx.arange(int(k_d.max()), k_d)).sum(0).tolist()
        order = order[:counts[0]]
        tree, slot = order // N, order % N
        out.append((tree, slot, children[tree, slot, :len(counts)], tuple(counts)))
    return tuple(out)


def integer_dtype(dtype: torch.dtype) -> bool:
    """True for the integer dtypes (not float, complex or bool): what token ids, links and indices must be."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _as_long(x, where: str, name: str, device) -> torch.Tensor:
    """``x`` (a tensor, array or nested list of integers) as a long tensor on ``device``; ValueError naming the
    argument (or the device) where torch cannot make a tensor of it."""
    try:
        t = torch.as_tensor(x, device=device)
    except (TypeError, ValueError, RuntimeError, AssertionError) as err:    # (CUDA missing: an AssertionError)
        try:
            torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as why:
            raise ValueError(f"{where}: {name} must be an integer array, got {type(x).__name__} ({why})") from None
        raise ValueError(f"{where}: device {device!r} cannot hold {name}: {err}") from None
    if not integer_dtype(t.dtype):
        raise ValueError(f"{where}: {name} must hold integers, got dtype {t.dtype}")
    return t.to(torch.long)


def _long_pair(where: str, a, a_name: str, b, b_name: str, device):
    """Two integer arrays of one ``[B, N]`` shape (N ≥ 1) as long tensors on one device."""
    a = _as_long(a, where, a_name, device)
    b = _as_long(b, where, b_name, a.device)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] == 0:
        raise ValueError(f"{where}: {a_name} and {b_name} must both be [B, N] with N ≥ 1, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    return a, b


#: The derived properties of a :class:`TreeBatch` — cached on first use — that read its parents and node counts
#: only, never a token: what :meth:`TreeBatch.with_tokens` shares between batches of one skeleton.
STRUCTURE = ("valid", "num_children", "depth", "max_depth", "sibling_rank", "children", "level_nodes", "height",
             "subtree_shapes")


@dataclass(frozen=True)
class TreeBatch:
    """``B`` draft trees padded to ``N`` slots (see the module docstring for the layout).

    Build with :meth:`from_trees` (a list of :class:`univer_theory.DraftTree`), :meth:`from_tensors`
    (validated ``parent`` / ``token`` tensors) or :meth:`from_sglang`.

    >>> from univer_theory import DraftTree
    >>> b = TreeBatch.from_trees([DraftTree((-1, 0, 0, 1), (-1, 2, 0, 1)), DraftTree.chain([3])])
    >>> b.depth.tolist()
    [[0, 1, 1, 2], [0, 1, -1, -1]]
    """

    parent: torch.Tensor      # [B, N] long
    token: torch.Tensor       # [B, N] long
    num_nodes: torch.Tensor   # [B] long
    vocab_size: int | None = None

    # ---------------------------------------------------------------------------------------------------
    # Constructors
    # ---------------------------------------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, parent, token, num_nodes=None, vocab_size: int | None = None,
                     device=None) -> "TreeBatch":
        """Validate and wrap ``parent [B, N]``, ``token [B, N]`` (``num_nodes [B]``, default: all ``N``).

        Rules (checked by the constructor itself, see :meth:`__post_init__`; each broken rule raises ValueError
        naming the tree and slot): slot 0 is the only root (parent = token = −1); a valid node ``v ≥ 1`` has
        ``0 ≤ parent < v`` and ``0 ≤ token`` (``< vocab_size`` when given: the batch keeps it, and a validating call
        given rows of another V refuses them); padded slots have parent = token = −1.
        """
        where = "TreeBatch.from_tensors"
        parent, token = _long_pair(where, parent, "parent", token, "token", device)
        B, N = parent.shape
        if num_nodes is None:
            num_nodes = torch.full((B,), N, dtype=torch.long, device=parent.device)
        num_nodes = _as_long(num_nodes, where, "num_nodes", parent.device)
        return cls(parent.contiguous(), token.contiguous(), num_nodes.contiguous(), vocab_size)   # the layout rules

    def __post_init__(self):
        """The layout rules, checked on every construction (raw ``TreeBatch(...)`` included); each broken rule
        raises ValueError naming the tree, the slot and the rule."""
        where = "TreeBatch"
        for name in ("parent", "token", "num_nodes"):
            t = getattr(self, name)
            if not torch.is_tensor(t) or t.dtype != torch.long:
                raise ValueError(f"{where}: {name} must be a torch.long tensor, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} (TreeBatch.from_tensors converts)")
        parent, token, num_nodes = self.parent, self.token, self.num_nodes
        if parent.ndim != 2 or parent.shape != token.shape or parent.shape[1] == 0:
            raise ValueError(f"{where}: parent and token must both be [B, N] with N ≥ 1, got "
                             f"{tuple(parent.shape)} and {tuple(token.shape)}")
        B, N = parent.shape
        if B == 0:
            raise ValueError(f"{where}: the batch is empty (B = 0 trees)")
        if num_nodes.shape != (B,):
            raise ValueError(f"{where}: num_nodes must be [B] = [{B}], got {tuple(num_nodes.shape)}")
        if not (token.device == parent.device == num_nodes.device):
            raise ValueError(f"{where}: parent, token and num_nodes must share one device, got {parent.device}, "
                             f"{token.device}, {num_nodes.device}")
        if self.vocab_size is not None:
            object.__setattr__(self, "vocab_size", check_int(self.vocab_size, where, "vocab_size", 1))
        sizes = (num_nodes < 1) | (num_nodes > N)
        slot = torch.arange(N, device=parent.device)
        valid = slot[None, :] < num_nodes[:, None]
        checks = [
            ((parent[:, 0] != -1) | (token[:, 0] != -1))[:, None] & (slot[None, :] == 0),
            "slot 0 must be the root with parent −1 and token −1",
            valid & (slot[None, :] > 0) & ((parent < 0) | (parent >= slot[None, :])),
            "parents must precede their children (0 ≤ parent < slot; this also excludes cycles and parents out "
            "of range) and only slot 0 may be a root",
            valid & (slot[None, :] > 0) & (token < 0),
            "drafted tokens must be ≥ 0",
            ~valid & ((parent != -1) | (token != -1)),
            "padded slots (≥ num_nodes) must have parent −1 and token −1",
        ]
        if self.vocab_size is not None:
            checks += [valid & (token >= self.vocab_size),
                       f"token ids must lie in [0, {self.vocab_size}) (the vocabulary)"]
        sizes_broken, *broken = torch.stack([sizes.any()] + [mask.any() for mask in checks[::2]]).tolist()
        if sizes_broken:                                                  # (one host read for every rule)
            b = int(sizes.nonzero()[0, 0])
            raise ValueError(f"{where}: tree {b} has num_nodes {int(num_nodes[b])}, outside [1, N = {N}]")
        for mask, rule, bad in zip(checks[::2], checks[1::2], broken):
            if bad:
                b, v = (int(i) for i in mask.nonzero()[0])
                raise ValueError(f"{where}: tree {b} slot {v} (parent {int(parent[b, v])}, token "
                                 f"{int(token[b, v])}) breaks the rule: {rule}")

    @classmethod
    def from_trees(cls, trees, device=None) -> "TreeBatch":
        """Pad a list of :class:`univer_theory.DraftTree` into one batch.  Trees that declare a ``vocab_size`` must
        declare the same one, and the batch keeps it (:attr:`vocab_size`: a validating call given rows of another V
        refuses them, as the exact core refuses a tree's)."""
        if isinstance(trees, DraftTree):
            raise ValueError("TreeBatch.from_trees: trees must be a non-empty list of DraftTree, got one DraftTree "
                             "(wrap it in a list)")
        try:
            trees = list(trees)
        except TypeError:
            raise ValueError(f"TreeBatch.from_trees: trees must be a non-empty list of DraftTree, got "
                             f"{type(trees).__name__}") from None
        if not trees or not all(isinstance(t, DraftTree) for t in trees):
            raise ValueError("TreeBatch.from_trees: trees must be a non-empty list of DraftTree")
        declared = sorted({t.vocab_size for t in trees if t.vocab_size is not None})
        if len(declared) > 1:
            raise ValueError(f"TreeBatch.from_trees: the trees declare different vocab_size values {declared}")
        N = max(t.num_nodes for t in trees)
        parent = torch.full((len(trees), N), -1, dtype=torch.long)
        token = torch.full((len(trees), N), -1, dtype=torch.long)
        for b, t in enumerate(trees):
            parent[b, :t.num_nodes] = torch.tensor(t.parent)
            token[b, :t.num_nodes] = torch.tensor(t.token)
        num_nodes = torch.tensor([t.num_nodes for t in trees], dtype=torch.long)
        return cls(parent.to(device), token.to(device), num_nodes.to(device), declared[0] if declared else None)

    @classmethod
    def from_sglang(cls, retrive_next_token, retrive_next_sibling, token, num_nodes=None,
                    vocab_size: int | None = None, return_order: bool = False):
        """Build from SGLang-style linked lists: ``retrive_next_token[b, u]`` = first child of u,
        ``retrive_next_sibling[b, u]`` = next sibling of u (−1 for none), ``token [B, N]`` (root −1).

        The lists may be stored in any slot order (a child or a next sibling may sit in an earlier slot); the
        batch is laid out in the topological order of :func:`sglang_slot_order` (the storage order itself when
        that is already topological), each sibling list in list order.  With ``return_order`` the result is
        ``(batch, order)``, ``order[b, v]`` = storage slot of the batch's slot v (per-slot values ``[B, N]`` are
        moved with ``x.gather(1, order)``, probability rows ``[B, N, V]`` with
        ``rows.gather(1, order[..., None].expand(-1, -1, V))``).  Malformed links raise ValueError naming the
        array and slot; the result is validated like :meth:`from_tensors`.
        """
        where = "TreeBatch.from_sglang"
        parent, order = sglang_slot_order(retrive_next_token, retrive_next_sibling, num_nodes)
        token = _as_long(token, where, "token", parent.device)
        if token.shape != parent.shape:
            raise ValueError(f"{where}: token must be [B, N] = {list(parent.shape)}, got {list(token.shape)}")
        batch = cls.from_tensors(parent, token.gather(1, order), num_nodes, vocab_size)
        return (batch, order) if return_order else batch

    # ---------------------------------------------------------------------------------------------------
    # Basic properties
    # ---------------------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.parent.shape[0]

    @property
    def max_nodes(self) -> int:
        """``N``, the padded number of slots."""
        return self.parent.shape[1]

    @property
    def device(self) -> torch.device:
        return self.parent.device

    def to(self, device) -> "TreeBatch":
        return TreeBatch(self.parent.to(device), self.token.to(device), self.num_nodes.to(device), self.vocab_size)

    def with_tokens(self, token) -> "TreeBatch":
        """The same trees — parents and node counts — carrying the drafted tokens ``token [B, N]`` (−1 at the
        root and on padded slots), validated as any batch, and sharing this batch's derived structure
        (:data:`STRUCTURE`: depths, children, the per-depth node lists, subtree shapes — none reads a token).

        A decode step with a fixed draft skeleton (a static tree: every step drafts the same shape) builds its
        batch this way from one batch of that skeleton (:func:`gpu.drafting.draft_tree` does), so the structure
        is derived once instead of at every step (~1.3–2 ms of small host operations for a 31-node tree on the
        CPU, and the per-depth host reads on an accelerator).  This batch's structure is derived here the first
        time; the shared tensors are read-only for every caller, as a batch's are."""
        where = "TreeBatch.with_tokens"
        token = _as_long(token, where, "token", self.device)
        if token.shape != self.parent.shape:
            raise ValueError(f"{where}: token must be [B, N] = {list(self.parent.shape)} (the batch's slots), got "
                             f"{list(token.shape)}")
        batch = TreeBatch(self.parent, token.contiguous(), self.num_nodes, self.vocab_size)
        batch.__dict__.update({name: getattr(self, name) for name in STRUCTURE})
        return batch

    @cached_property
    def valid(self) -> torch.Tensor:
        """``[B, N]`` bool: slot holds a node (root included)."""
        return torch.arange(self.max_nodes, device=self.device)[None, :] < self.num_nodes[:, None]

    @cached_property
    def depth(self) -> torch.Tensor:
        """``[B, N]`` long: depth of every node (root 0, a drafted child of the root 1); −1 for padding.  By pointer
        jumping (:func:`_depths`)."""
        return on_host(_depths, self.parent, self.valid)

    @cached_property
    def max_depth(self) -> int:
        """``D``: the largest depth in the batch (0 when every tree is just a root)."""
        return int(self.depth.max())

    def positions(self, offset) -> torch.Tensor:
        """``[B, N]`` position ids: ``offset[b] + depth`` (``offset`` = position of the root: an integer scalar or
        ``[B]`` integers, else a ValueError)."""
        B = self.parent.shape[0]
        try:
            offset = torch.as_tensor(offset, device=self.device)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"TreeBatch.positions: offset must be an integer scalar or {B} integers (one per tree), "
                             f"got {type(offset).__name__} ({err})") from None
        if not integer_dtype(offset.dtype) or offset.ndim > 1 or offset.numel() not in (1, B):
            raise ValueError(f"TreeBatch.positions: offset must be an integer scalar or {B} integers (one per tree), "
                             f"got {offset.dtype} of shape {list(offset.shape)}")
        return offset.reshape(-1, 1) + self.depth.clamp(min=0)

    @cached_property
    def sibling_rank(self) -> torch.Tensor:
        """``[B, N]`` long: index of each node among its parent's children (drafting order); −1 for root/pad."""
        same = self.parent[:, :, None] == self.parent[:, None, :]            # [B, N, N]
        earlier = torch.ones(self.max_nodes, self.max_nodes, dtype=torch.bool, device=self.device).tril(-1)
        rank = (same & earlier[None]).sum(-1)
        return torch.where(self.parent >= 0, rank, -1)

    @cached_property
    def num_children(self) -> torch.Tensor:
        """``[B, N]`` long: number of children of every node."""
        B, N = self.parent.shape
        out = torch.zeros(B, N + 1, dtype=torch.long, device=self.device)
        out.scatter_add_(1, torch.where(self.parent >= 0, self.parent, N), torch.ones_like(self.parent))
        return out[:, :N]

    @cached_property
    def height(self) -> torch.Tensor:
        """``[B, N]`` long: height of every node (a leaf 0, its parent 1, …); −1 for padding (:func:`_heights`)."""
        return on_host(_heights, self.children, self.num_children > 0, self.valid, self.max_depth)

    @cached_property
    def subtree_shapes(self) -> tuple[torch.Tensor, tuple[str, ...]]:
        """``(ids [B, N] long, keys)``: the ordered subtree under every node as an index into ``keys``, its
        nested form (``"."`` a leaf, ``"(k1,k2,…)"``, as :attr:`univer_theory.DraftTree.subtree_keys`); −1 for
        padding.  Built bottom-up, one :func:`gpu.unique.unique_rows` over the nodes of each height (no loop over
        trees); only the distinct shapes are spelled out on the host (:func:`_shape_ids`)."""
        return on_host(_shape_ids, self.children, self.height, self.max_depth)

    @cached_property
    def children(self) -> torch.Tensor:
        """``[B, N, K]`` long: ``children[b, u, j]`` = slot of the j-th child of u; ``N`` (one past the last
        slot, a dump index) where u has fewer than ``j+1`` children.  ``K`` = largest branching (≥ 1)."""
        B, N = self.parent.shape
        K = max(int(self.num_children.max()), 1)
        out = torch.full((B, (N + 1) * K), N, dtype=torch.long, device=self.device)
        has = self.parent >= 0
        flat = torch.where(has, self.parent * K + self.sibling_rank, N * K)
        out.scatter_(1, flat, torch.where(has, torch.arange(N, device=self.device).expand(B, N), N))
        return out.view(B, N + 1, K)[:, :N]

    @cached_property
    def level_nodes(self) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...]], ...]:
        """Per depth ``d < D``, the internal nodes at depth d of all trees packed into ``R_d`` rows (no padding
        across trees): ``(tree [R_d], slot [R_d], kids [R_d, K_d], active)``.  Rows are sorted by branching,
        largest first (ties in (tree, slot) order), so ``active[j]`` — the number of rows with a j-th child —
        makes every row ``≥ active[j]`` childless at sibling index j; ``kids`` is padded with ``N``
        (:func:`_level_nodes`)."""
        return on_host(_level_nodes, self.num_children, self.valid, self.depth, self.children, self.max_depth)

    # ---------------------------------------------------------------------------------------------------
    # Conversions
    # ---------------------------------------------------------------------------------------------------
    def to_trees(self, vocab_size: int | None = None) -> list[DraftTree]:
        """The batch as a list of :class:`univer_theory.DraftTree` (host copies), declaring ``vocab_size`` (None:
        the batch's own, :attr:`vocab_size`)."""
        parent, token, n = self.parent.tolist(), self.token.tolist(), self.num_nodes.tolist()
        vocab_size = self.vocab_size if vocab_size is None else vocab_size
        return [DraftTree(tuple(parent[b][:n[b]]), tuple(token[b][:n[b]]), vocab_size) for b in range(len(n))]

    def to_sglang(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(retrive_next_token, retrive_next_sibling)`` ``[B, N]``: first child / next sibling, −1 for none."""
        N = self.max_nodes
        first = self.children[:, :, 0]
        first = torch.where(first < N, first, -1)
        # next sibling of v = children[parent[v], rank[v] + 1]
        ch = torch.cat([self.children, torch.full_like(self.children[:, :, :1], N)], dim=2)   # [B, N, K+1]
        K1 = ch.shape[2]
        has = self.parent >= 0
        flat = ch.reshape(ch.shape[0], -1)
        idx = torch.where(has, self.parent.clamp(min=0) * K1 + self.sibling_rank + 1, 0)
        nxt = torch.where(has, flat.gather(1, idx), N)
        return first.contiguous(), torch.where(nxt < N, nxt, -1)


def tree_attention_mask(batch: TreeBatch) -> torch.Tensor:
    """``[B, N, N]`` bool: ``mask[b, i, j]`` is True iff node j is an ancestor of node i or i itself.

    Padded slots see only themselves (keeps a softmax over each row finite) and no valid node sees them.
    """
    B, N = batch.parent.shape
    eye = torch.eye(N, dtype=torch.bool, device=batch.device).expand(B, N, N)
    mask = eye.clone()
    cur = torch.arange(N, device=batch.device).expand(B, N)
    for _ in range(max(batch.max_depth, 0)):
        up = batch.parent.gather(1, cur.clamp(min=0))
        cur = torch.where(cur >= 0, up, -1)
        mask |= (cur[:, :, None] == torch.arange(N, device=batch.device)[None, None, :])
    return mask & (batch.valid[:, :, None] | eye)


def sglang_slot_order(retrive_next_token, retrive_next_sibling, num_nodes=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check SGLang's first-child / next-sibling links ``[B, N]`` and lay the trees out topologically.

    Returns ``(parent, order)`` ``[B, N]`` long: ``order[b, v]`` is the storage slot placed at slot v,
    ``parent[b, v]`` the (new) slot of its parent (−1 for the root and for padding).  The order is Kahn's
    topological order taking the lowest storage slot among the nodes whose parent and previous sibling are
    placed — the identity whenever the storage order already has parents before children and every sibling
    list in increasing slot order.

    Rules, each a ValueError naming the array and slot: entries lie in ``[−1, N)`` and point at valid slots
    (``< num_nodes``); slot 0 is the root (no link reaches it, it has no sibling); every other valid slot is
    reached by exactly one link (a first-child or a next-sibling entry) and from the root (no cycles);
    padded slots (``≥ num_nodes``) have no links.
    """
    where = "TreeBatch.from_sglang"
    first, nxt = _long_pair(where, retrive_next_token, "retrive_next_token", retrive_next_sibling,
                            "retrive_next_sibling", None)
    B, N = first.shape
    dev = first.device
    n = torch.full((B,), N, dtype=torch.long, device=dev) if num_nodes is None else \
        _as_long(num_nodes, where, "num_nodes", dev).reshape(-1)
    if n.shape != (B,) or ((n < 1) | (n > N)).any():
        raise ValueError(f"{where}: num_nodes must be [B] = [{B}] with entries in [1, {N}], got {n.tolist()}")
    slot = torch.arange(N, device=dev).expand(B, N)
    valid = slot < n[:, None]

    def fail(mask, name, arr, rule):
        if mask.any():
            b, u = (int(i) for i in mask.nonzero()[0])
            raise ValueError(f"{where}: {name}[{b}, {u}] = {int(arr[b, u])} breaks the rule: {rule}")

    for name, arr in (("retrive_next_token", first), ("retrive_next_sibling", nxt)):
        fail((arr < -1) | (arr >= N), name, arr, f"entries must lie in [-1, {N})")
        fail((arr >= 0) & ~valid, name, arr, "padded slots (≥ num_nodes) have no links")
        fail((arr >= 0) & (arr >= n[:, None]), name, arr, "links must point at valid slots (< num_nodes)")
        fail(arr == 0, name, arr, "slot 0 is the root: no link may reach it")
    fail((slot == 0) & (nxt >= 0), "retrive_next_sibling", nxt, "the root has no siblings")
    # in-degree: every valid non-root slot is reached by exactly one link
    hits = torch.zeros(B, N + 1, dtype=torch.long, device=dev)
    for arr in (first, nxt):
        hits.scatter_add_(1, torch.where(arr >= 0, arr, N), torch.ones_like(arr))
    hits = hits[:, :N]
    for name, arr in (("retrive_next_token", first), ("retrive_next_sibling", nxt)):
        fail((arr >= 0) & (hits.gather(1, arr.clamp(min=0)) > 1), name, arr,
             "a slot is reached by more than one link (a node reached twice)")
    # pred[v] = the slot whose link reaches v (root and padding: themselves); kind: reached as first child
    pred = slot.clone()
    as_child = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)
    for arr, child in ((first, True), (nxt, False)):
        dump = torch.where(arr >= 0, arr, N)
        ext = torch.cat([pred, slot[:, :1]], 1)
        ext.scatter_(1, dump, torch.where(arr >= 0, slot, 0))
        pred = ext[:, :N]
        if child:
            as_child.scatter_(1, dump, arr >= 0)
    as_child = as_child[:, :N]
    unreached = valid & (slot > 0) & (hits == 0)
    if unreached.any():
        b, u = (int(i) for i in unreached.nonzero()[0])
        raise ValueError(f"{where}: slot [{b}, {u}] is reached by no link in retrive_next_token or "
                         f"retrive_next_sibling (every valid slot must hang under the root)")
    # reachability from the root by pointer jumping on pred (a cycle never reaches slot 0)
    anc = pred
    for _ in range(max(1, (N - 1).bit_length()) + 1):
        anc = anc.gather(1, anc)
    cyc = valid & (anc != 0)
    if cyc.any():
        b, u = (int(i) for i in cyc.nonzero()[0])
        arr, name = (first, "retrive_next_token") if bool(as_child[b, u]) else (nxt, "retrive_next_sibling")
        v = int(pred[b, u])
        raise ValueError(f"{where}: {name}[{b}, {v}] = {u} breaks the rule: links must form a tree under "
                         f"slot 0 (slot {u} lies on a cycle)")
    # parent in storage slots: a first child's parent is its pred; a later sibling's is its list head's pred
    head = torch.where(as_child | (slot == 0) | ~valid, slot, pred)
    for _ in range(max(1, (N - 1).bit_length()) + 1):
        head = head.gather(1, head)
    par = torch.where(valid & (slot > 0), pred.gather(1, head), -1)
    prev = torch.where(valid & (slot > 0) & ~as_child, pred, -1)
    # Kahn's order, lowest storage slot first among the ready nodes
    placed = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)
    placed[:, N] = True                                   # dump: "no parent / no previous sibling"
    par_ext, prev_ext = torch.where(par >= 0, par, N), torch.where(prev >= 0, prev, N)
    order = slot.clone()
    for v in range(N):
        ready = ~placed[:, :N] & placed.gather(1, par_ext) & placed.gather(1, prev_ext) & valid
        pick = torch.where(ready.any(1), ready.to(torch.int8).argmax(1), v)
        order[:, v] = pick
        placed.scatter_(1, pick[:, None], True)
    parent = torch.where(par >= 0, order_ranks(order).gather(1, par.clamp(min=0)), -1).gather(1, order)
    return parent.contiguous(), order.contiguous()

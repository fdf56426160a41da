"""The one draft-tree data model: flat ``parent`` / ``token`` arrays (theory.md §0).

Node 0 is the root (the current context, ``parent = token = −1``); every other node carries one drafted
token and the index of its parent, which precedes it.  Siblings keep their drafting order and i.i.d.
duplicates are kept as separate children.  A :class:`TreeShape` is the same skeleton without tokens: the
branching of every node, e.g. ``TreeShape.parse("2,2")`` (root has 2 children, each has 2), the nested
form ``TreeShape.parse("((..),.)")`` for irregular trees, or a named shape (``binary:3``, ``chain:4``, ``eagle``:
the 24-node EAGLE-like tree of :func:`eagle_like_shape`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import cached_property

import numpy as np


def as_int_tuple(values, where: str, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints; ValueError for bools, floats and anything else that is not an
    integer (``int(0.5)`` would silently read a float parent as node 0, ``True`` as token 1)."""
    try:
        items = tuple(values)
    except TypeError:
        raise ValueError(f"{where}: {name} must be a sequence of integers, got {type(values).__name__}") from None
    for i, v in enumerate(items):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise ValueError(f"{where}: {name}[{i}] must be an integer, got {v!r} ({type(v).__name__})")
    return tuple(int(v) for v in items)


def _check_parents(parent: tuple[int, ...], where: str) -> None:
    if len(parent) == 0:
        raise ValueError(f"{where}: a tree needs a root node, got an empty parent array")
    if parent[0] != -1:
        raise ValueError(f"{where}: node 0 must be the root (parent −1), got parent {parent[0]}")
    for u in range(1, len(parent)):
        if not 0 <= parent[u] < u:
            raise ValueError(
                f"{where}: node {u} has parent {parent[u]}; parents must precede their children "
                f"(0 ≤ parent < {u}) and only node 0 may be a root")


def _children_of(parent: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    kids: list[list[int]] = [[] for _ in parent]
    for u in range(1, len(parent)):
        kids[parent[u]].append(u)
    return tuple(tuple(k) for k in kids)


def split_key(key: str) -> tuple[str, ...]:
    """Children keys of a nested subtree key ``"(k1,k2,…)"`` (``()`` for a leaf ``"."``); the commas between
    children are optional, as in :meth:`TreeShape.parse` (``"((..),.)"``).  Raises ValueError on anything else."""
    if key == ".":
        return ()
    if len(key) < 3 or key[0] != "(" or key[-1] != ")":
        raise ValueError(f"split_key: {key!r} is not a nested subtree key ('.' or '(…)' with children)")
    out, depth, start = [], 0, None
    for i, ch in enumerate(key[1:-1], 1):
        if ch not in "().,":
            raise ValueError(f"split_key: unexpected character {ch!r} in {key!r}")
        if depth == 0 and ch == ".":
            out.append(".")
        elif ch == "(":
            start = i if depth == 0 else start
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"split_key: unbalanced ')' in {key!r}")
            if depth == 0:
                out.append(key[start:i + 1])
    if depth or not out:
        raise ValueError(f"split_key: {key!r} is not one balanced subtree with children")
    return tuple(out)


def canonical_key(key: str) -> str:
    """The comma-separated form of a nested subtree key, as :attr:`TreeShape.subtree_keys` writes it."""
    kids = split_key(key)
    return "(" + ",".join(canonical_key(c) for c in kids) + ")" if kids else "."


def key_size(key: str) -> int:
    """Number of nodes of the subtree written as ``key`` (each ``.`` and each ``(`` is one node)."""
    return key.count(".") + key.count("(")


class _Skeleton:
    """Structure shared by :class:`TreeShape` and :class:`DraftTree` (derived from ``parent``)."""

    parent: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """``children[u]``: the children of node u in drafting order."""
        return _children_of(self.parent)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        d = [0] * len(self.parent)
        for u in range(1, len(self.parent)):
            d[u] = d[self.parent[u]] + 1
        return tuple(d)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @cached_property
    def subtree_size(self) -> tuple[int, ...]:
        """Number of nodes in the subtree of u, u included."""
        size = [1] * len(self.parent)
        for u in range(len(self.parent) - 1, 0, -1):
            size[self.parent[u]] += size[u]
        return tuple(size)

    @cached_property
    def subtree_keys(self) -> tuple[str, ...]:
        """Nested form of the ordered subtree under every node (``"."`` for a leaf, ``"(k1,k2,…)"`` with the
        children's keys in drafting order) — what a node rule may know of its children's subtrees."""
        keys = ["."] * len(self.parent)
        for u in range(len(self.parent) - 1, -1, -1):
            if self.children[u]:
                keys[u] = "(" + ",".join(keys[c] for c in self.children[u]) + ")"
        return tuple(keys)

    @property
    def max_children(self) -> int:
        """The most children any node has (k of the widest node; 0 for a lone root)."""
        return max(len(c) for c in self.children)

    @property
    def is_chain(self) -> bool:
        """True when every node has at most one child (a single draft sequence)."""
        return all(len(c) <= 1 for c in self.children)


#: The most nodes a generated shape may have (:meth:`TreeShape.uniform`, :func:`eagle_like_shape`):
#: a draft tree is tens to hundreds of nodes, and a spec like ``1000,1000,1000`` or ``binary:64`` is a typo that
#: would otherwise be built node by node until the memory runs out.
MAX_SHAPE_NODES = 1 << 20


def check_shape_size(nodes: int, where: str, spec) -> None:
    """A ``ValueError`` when a shape of ``nodes`` nodes (``spec``: what names it) exceeds :data:`MAX_SHAPE_NODES`."""
    if nodes > MAX_SHAPE_NODES:
        raise ValueError(f"{where}: {spec!r} has {nodes} nodes or more, beyond the {MAX_SHAPE_NODES} a shape may have")


@dataclass(frozen=True)
class TreeShape(_Skeleton):
    """A tree skeleton: ``parent[u]`` for every node, no tokens."""

    parent: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "parent", as_int_tuple(self.parent, "TreeShape", "parent"))
        _check_parents(self.parent, "TreeShape")
        if len(self.parent) < 2:
            raise ValueError("TreeShape: the shape has no drafted node (empty tree)")

    @classmethod
    def uniform(cls, branching) -> "TreeShape":
        """Shape with ``branching[d]`` children under every node of depth d, e.g. ``[2, 2]``."""
        if not hasattr(branching, "__iter__"):                  # an int: list() would be a TypeError
            raise ValueError(f"TreeShape.uniform: branching must be a non-empty list of positive ints, got "
                             f"{branching!r}")
        branching = list(branching)
        if not branching or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1 for b in branching):
            raise ValueError(f"TreeShape.uniform: branching must be a non-empty list of positive ints, got {branching}")
        level, nodes = 1, 1
        for b in branching:
            level *= b
            nodes += level
            check_shape_size(nodes, "TreeShape.uniform",
                             ",".join(map(str, branching)) if len(branching) <= 8 else f"{len(branching)} levels")
        parent, frontier = [-1], [0]
        for b in branching:
            nxt = []
            for u in frontier:
                for _ in range(b):
                    parent.append(u)
                    nxt.append(len(parent) - 1)
            frontier = nxt
        return cls(tuple(parent))

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        """Parse ``"2,2"`` (uniform branching), a nested form like ``"((..),.)"``, or a named shape:
        ``binary:D`` (branching 2 to depth D), ``chain:D`` (one child per node to depth D), ``eagle`` /
        ``eagle:W`` (:func:`eagle_like_shape`, W = 4 by default).

        In the nested form the outer parentheses are the root; ``.`` is a leaf child and ``( … )`` a child
        with children of its own, in drafting order.
        """
        if not isinstance(text, str):
            raise ValueError(f"TreeShape.parse: expected a shape's text like '2,2' or '((..),.)', got "
                             f"{type(text).__name__}")
        text = text.strip().replace(" ", "")
        kind, sep, arg = text.partition(":")
        if sep or kind == "eagle":
            return _named_shape(kind, arg, text)
        if not text.startswith("("):
            try:
                parts = text.split(",")
                if not all(b.isascii() and b.isdigit() for b in parts):     # int() reads '2_2' as 22
                    raise ValueError("branching per depth is ASCII digits joined by commas, like '2,2'")
                return cls.uniform(int(b) for b in parts)
            except ValueError as err:
                raise ValueError(f"TreeShape.parse: cannot read shape {text!r} ({err})") from None
        parent: list[int] = []
        stack: list[int] = []
        for i, ch in enumerate(text):
            if ch == "," and not (0 < i < len(text) - 1 and text[i - 1] in ".)" and text[i + 1] in ".("):
                raise ValueError(f"TreeShape.parse: the comma at position {i} of {text!r} does not separate two "
                                 f"children (write a leaf as '.', e.g. '(.,.)')")
            if ch == ")" and text[i - 1] == "(" and i > 1:  # "()" alone is the empty tree, refused below
                raise ValueError(f"TreeShape.parse: empty '()' at position {i - 1} of {text!r} (a node with "
                                 f"children needs at least one; write a leaf as '.')")
            if ch == "(":
                parent.append(stack[-1] if stack else -1)
                stack.append(len(parent) - 1)
            elif ch == ")":
                if not stack:
                    raise ValueError(f"TreeShape.parse: unbalanced ')' in {text!r}")
                stack.pop()
            elif ch == ".":
                if not stack:
                    raise ValueError(f"TreeShape.parse: leaf outside the root in {text!r}")
                parent.append(stack[-1])
            elif ch != ",":
                raise ValueError(f"TreeShape.parse: unexpected character {ch!r} in {text!r}")
        if stack or parent.count(-1) != 1:
            raise ValueError(f"TreeShape.parse: {text!r} is not one balanced tree")
        # relabel breadth-first, so both forms give the same node order for the same tree
        kids = _children_of(tuple(parent))
        order, new_parent = [0], [-1]
        for u in order:
            for c in kids[u]:
                new_parent.append(order.index(u))
                order.append(c)
        return cls(tuple(new_parent))

    def __str__(self) -> str:
        return self.subtree_keys[0]


def _named_shape(kind: str, arg: str, text: str) -> TreeShape:
    """The named shape ``kind[:arg]`` of :meth:`TreeShape.parse` (``text``: the whole spec, for errors); its size is
    checked before it is built (``chain:1000000000`` would build a list of 10⁹ levels first, ``eagle:1000000000``
    its root's 10⁹ children)."""
    names = "['binary:D', 'chain:D', 'eagle[:W]']"
    if kind not in ("binary", "chain", "eagle"):
        raise ValueError(f"TreeShape.parse: unknown shape kind {kind!r} in {text!r}; choose one of {names}, "
                         f"branching per depth like '2,2' or a nested form like '((..),.)'")
    if text == "eagle":
        return eagle_like_shape()
    if not (arg.isascii() and arg.isdigit() and int(arg) >= 1):
        what = "width, e.g. eagle:4" if kind == "eagle" else f"depth, e.g. {kind}:4"
        raise ValueError(f"TreeShape.parse: {text!r} needs a positive {what}")
    if kind == "eagle":
        return eagle_like_shape(int(arg))
    depth = int(arg)
    check_shape_size(depth + 1 if kind == "chain" else 2 ** min(depth + 1, 64) - 1, "TreeShape.parse", text)
    return TreeShape.uniform([2 if kind == "binary" else 1] * depth)


def eagle_like_shape(width: int = 4) -> TreeShape:
    """Sparse tree in the spirit of EAGLE's static tree: a node of depth d whose rank among its siblings is r
    (0 = drafted first) gets ``max(0, W − d − r)`` children, the root ``W``.  ``W = 4`` gives 24 nodes, depth 4:
    the first-drafted branches are the widest and deepest."""
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
        raise ValueError(f"eagle_like_shape: width must be an integer ≥ 1, got {width!r}")
    parent, frontier = [-1], [(0, 0, 0)]          # (node, depth, sibling rank)
    while frontier:
        nxt = []
        for u, d, r in frontier:
            count = width if u == 0 else max(0, width - d - r)
            check_shape_size(len(parent) + count, "eagle_like_shape", f"eagle:{width}")     # before they are listed
            for j in range(count):
                parent.append(u)
                nxt.append((len(parent) - 1, d + 1, j))
        frontier = nxt
    return TreeShape(tuple(parent))


def as_shape(shape, where: str) -> TreeShape:
    """A :class:`TreeShape` as given or read from its text form (``"2,2"``, ``"((..),.)"``); ValueError naming
    ``where`` for anything else."""
    if isinstance(shape, TreeShape):
        return shape
    if isinstance(shape, str):
        return TreeShape.parse(shape)
    raise ValueError(f"{where}: shape must be a TreeShape or its text like '2,2', got {type(shape).__name__}")


@dataclass(frozen=True)
class DraftTree(_Skeleton):
    """A drafted tree: ``parent[N]`` (−1 for the root) and ``token[N]`` (−1 for the root).

    Nodes are in topological order (parents first), siblings in drafting order, duplicates allowed.
    ``vocab_size`` (optional) lets the constructor check token ranges.

    >>> t = DraftTree(parent=(-1, 0, 0, 1), token=(-1, 2, 0, 1))
    >>> t.path(3)
    (2, 1)
    """

    parent: tuple[int, ...]
    token: tuple[int, ...]
    vocab_size: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "parent", as_int_tuple(self.parent, "DraftTree", "parent"))
        object.__setattr__(self, "token", as_int_tuple(self.token, "DraftTree", "token"))
        if self.vocab_size is not None:
            object.__setattr__(self, "vocab_size", as_int_tuple([self.vocab_size], "DraftTree", "vocab_size")[0])
            if self.vocab_size < 1:                 # (a root-only tree has no token to catch it)
                raise ValueError(f"DraftTree: vocab_size must be ≥ 1, got {self.vocab_size}")
        _check_parents(self.parent, "DraftTree")
        if len(self.token) != len(self.parent):
            raise ValueError(f"DraftTree: token has {len(self.token)} entries but parent has {len(self.parent)}")
        if self.token[0] != -1:
            raise ValueError(f"DraftTree: the root's token must be −1, got {self.token[0]}")
        hi = self.vocab_size
        for u in range(1, len(self.token)):
            t = self.token[u]
            if t < 0 or (hi is not None and t >= hi):
                raise ValueError(f"DraftTree: node {u} has token {t}, outside [0, {'∞' if hi is None else hi})")

    @classmethod
    def chain(cls, tokens, vocab_size: int | None = None) -> "DraftTree":
        """A single draft sequence ``x_1 … x_γ``."""
        tokens = list(as_int_tuple(tokens, "DraftTree.chain", "tokens"))
        return cls(tuple([-1] + list(range(len(tokens)))), tuple([-1] + tokens), vocab_size)

    @classmethod
    def from_shape(cls, shape: TreeShape, tokens, vocab_size: int | None = None) -> "DraftTree":
        """Fill a skeleton with one token per non-root node (in node order)."""
        shape = as_shape(shape, "DraftTree.from_shape")
        tokens = list(as_int_tuple(tokens, "DraftTree.from_shape", "tokens"))
        if len(tokens) != shape.num_nodes - 1:
            raise ValueError(f"DraftTree.from_shape: shape has {shape.num_nodes - 1} drafted nodes, got {len(tokens)} tokens")
        return cls(shape.parent, tuple([-1] + tokens), vocab_size)

    @property
    def shape(self) -> TreeShape:
        return TreeShape(self.parent)

    def path(self, u: int) -> tuple[int, ...]:
        """Tokens on the path root → u (the prefix ``s(u)`` relative to the context)."""
        out = []
        while u > 0:
            out.append(self.token[u])
            u = self.parent[u]
        return tuple(reversed(out))

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self.path(u) for u in range(self.num_nodes))

    def child_tokens(self, u: int) -> tuple[int, ...]:
        return tuple(self.token[c] for c in self.children[u])

    def check_vocab(self, vocab_size: int, where: str) -> None:
        """ValueError unless every token lies in ``[0, vocab_size)`` and a declared ``vocab_size`` is this one."""
        if self.vocab_size is not None and self.vocab_size != vocab_size:
            raise ValueError(f"{where}: the tree declares vocab_size {self.vocab_size} but the rows have "
                             f"V = {vocab_size}")
        for u in range(1, self.num_nodes):
            if not 0 <= self.token[u] < vocab_size:
                raise ValueError(f"{where}: tree node {u} has token {self.token[u]}, outside [0, {vocab_size})")

"""YAML for documents a user (or an attacker) hands in: bounded, unambiguous.

PyYAML's safe loader still composes nesting recursively (50,000 '[' crash it with
RecursionError), follows aliases without counting what they expand to (a few lines of
anchors make billions of nodes for whoever walks the result), builds cycles (``&a [*a]``:
json.dumps and every recursive walk fail on them) and lets a duplicate key silently replace
the first (the reviewer reads one ``metadata``, the loader keeps the other). This loader
refuses all four with a ``yaml.YAMLError`` whose text says why.
yaml is imported on first use: the serving agent handles JSON only.
"""

from __future__ import annotations

from functools import cache
from typing import Any

#: Deeper than any document of ours (a profile is ~6 levels) and far from Python's stack limit.
MAX_DEPTH = 64
#: Nodes a document may expand to, aliases counted each time they are used.
MAX_NODES = 200_000
#: Parts of a YAML 1.1 base-60 number (``1:30:00`` has three). PyYAML builds one in time
#: quadratic in its parts (a 1 MiB body of four such integers: 13 s of CPU), and a float of
#: some 200 parts overflows (OverflowError, not a YAMLError).
MAX_BASE60_PARTS = 16


@cache
def _loader() -> type[Any]:
    import yaml
    from yaml.composer import ComposerError
    from yaml.nodes import MappingNode, Node, SequenceNode

    def expanded(root: Node) -> int:
        """Nodes of ``root`` with every alias expanded, counted without expanding them."""
        sizes: dict[int, int] = {}
        pending: set[int] = set()
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, children_done = stack.pop()
            if id(node) in sizes or (not children_done and id(node) in pending):
                continue
            if isinstance(node, SequenceNode):
                kids: list[Node] = list(node.value)
            elif isinstance(node, MappingNode):
                kids = [n for pair in node.value for n in pair]
            else:
                kids = []
            if children_done or not kids:
                sizes[id(node)] = 1 + sum(sizes.get(id(k), 0) for k in kids)
                if sizes[id(node)] > MAX_NODES:
                    return sizes[id(node)]
                continue
            stack.append((node, True))
            pending.add(id(node))
            if any(id(k) in pending for k in kids):
                raise ComposerError(None, None, "an alias refers to a node that holds it (a cycle)",
                                    node.start_mark)
            stack.extend((k, False) for k in kids if id(k) not in sizes)
        return sizes[id(root)]

    class Loader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent: Node | None, index: int) -> Node | None:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                        self.peek_event().start_mark)  # type: ignore[no-untyped-call]
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_document(self) -> Node | None:
            node: Node | None = super().compose_document()
            if node is not None and expanded(node) > MAX_NODES:
                raise ComposerError(None, None, f"the document expands to more than {MAX_NODES} nodes"
                                                " (aliases counted each time they are used)",
                                    node.start_mark)
            return node

        def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
            _no_duplicate_keys(self, node)
            return super().construct_mapping(node, deep)

    _bound_base60(Loader)
    return Loader


def _no_duplicate_keys(loader: Any, node: Any) -> None:
    from yaml.constructor import ConstructorError
    from yaml.nodes import ScalarNode

    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise ConstructorError("while reading a mapping", node.start_mark,
                                   f"found duplicate key {key!r:.80}", key_node.start_mark)
        seen.add(key)


def _bound_base60(loader: type[Any]) -> None:
    """Make ``loader`` refuse base-60 numbers of more than MAX_BASE60_PARTS parts."""
    from yaml.constructor import ConstructorError

    def bounded(construct: Any) -> Any:
        def construct_number(self: Any, node: Any) -> Any:
            if str(node.value).count(":") >= MAX_BASE60_PARTS:
                raise ConstructorError(None, None, f"found a base-60 number (like 1:30:00) of more than "
                                       f"{MAX_BASE60_PARTS} parts; quote it if it is text", node.start_mark)
            return construct(self, node)
        return construct_number

    for kind in ("int", "float"):
        tag = f"tag:yaml.org,2002:{kind}"
        loader.add_constructor(tag, bounded(loader.yaml_constructors[tag]))


@cache
def _walked_loader() -> type[Any]:
    import yaml

    # libyaml's composer when PyYAML has it: the pure-Python one takes seconds for a MiB.
    base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            _no_duplicate_keys(self, node)
            result: dict[Any, Any] = super().construct_mapping(node, deep)
            return result

    _bound_base60(Loader)
    return Loader


def load_all_walked(data: bytes) -> list[Any]:
    """Every document of ``data``, duplicate keys refused, for input whose events the caller has
    already walked: this loader neither bounds depth nor counts what aliases expand to."""
    import yaml

    return list(yaml.load_all(data, Loader=_walked_loader()))


def load_all(text: str) -> list[Any]:
    """Every document of ``text``; ``yaml.YAMLError`` for bad, too deep, too large or ambiguous YAML."""
    import yaml

    try:
        return list(yaml.load_all(text, Loader=_loader()))
    except RecursionError:  # a construct the depth bound missed: still the user's input at fault
        raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels") from None

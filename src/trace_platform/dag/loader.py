"""The bounded YAML loader every DAG file goes through (`trace dag validate`, deploy, the API).

A DAG file is untrusted input. Before any Python object is built, the document is measured:

- its size: at most MAX_DOCUMENT_BYTES (256 KiB);
- while it is composed into YAML nodes: nesting at most MAX_DEPTH (64) levels, at most
  MAX_NODES (20,000) nodes and MAX_ALIASES (100) alias uses (`*name`), stopping at the first
  one over, so a 100,000-deep document costs 65 levels of work and never a RecursionError;
- then the node graph as it would be expanded, following every alias (anchors are allowed, for
  shared config, but an alias counts as everything it repeats): again MAX_NODES nodes and
  MAX_DEPTH levels, plus MAX_TEXT_BYTES (1 MiB) of scalar text, so an alias bomb (each level
  repeating the one below ten times) is refused in microseconds, and an alias to one of its
  own ancestors (a recursive structure) is refused.

Only then does PyYAML construct the data (SafeLoader: plain data, no Python objects). Keys
must be unique and hashable. Each refusal names the limit."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DOCUMENT_BYTES = 256 * 1024
MAX_DEPTH = 64
MAX_NODES = 20_000
MAX_ALIASES = 100
MAX_TEXT_BYTES = 1024 * 1024


class YamlRefused(ValueError):
    """The document breaks one of the loader's limits (or is not loadable YAML data)."""

    def __init__(self, message: str, where: str = "") -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def _at(mark: Any) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts while it composes, refuses duplicate and unhashable keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise YamlRefused(f"document uses more than {MAX_ALIASES} aliases{_at(mark)}")
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        self._nodes += 1
        if self._nodes > MAX_NODES:
            mark = self.peek_event().start_mark
            raise YamlRefused(f"document has more than {MAX_NODES:,} nodes{_at(mark)}")
        if not self.check_event(SequenceStartEvent, MappingStartEvent):
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlRefused(f"document nests deeper than {MAX_DEPTH} levels{_at(mark)}")
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1


def _construct_mapping(loader: BoundedLoader, node: MappingNode, deep: bool = False) -> Any:
    """PyYAML silently keeps the last of two equal keys; a DAG file must not."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a mapping key must be a plain value, not a list or mapping",
                key_node.start_mark,
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key '{key}' (first on line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def measure(root: Node) -> None:
    """Refuses a node graph whose alias-expanded form breaks MAX_NODES, MAX_DEPTH or
    MAX_TEXT_BYTES, or that contains itself. Iterative and linear in the graph (each distinct
    node is measured once), with sums capped, so no document can make this expensive."""
    cap = MAX_NODES + 1
    text_cap = MAX_TEXT_BYTES + 1
    # id(node) -> (expanded nodes, expanded depth in collection levels, expanded text bytes)
    done: dict[int, tuple[int, int, int]] = {}
    open_: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            kids = _children(node)
            nodes = min(cap, 1 + sum(done[id(k)][0] for k in kids))
            depth = 1 + max((done[id(k)][1] for k in kids), default=0)
            text = min(text_cap, sum(done[id(k)][2] for k in kids))
            open_.discard(key)
            done[key] = (nodes, depth, text)
            if nodes > MAX_NODES:
                raise YamlRefused(
                    f"document has more than {MAX_NODES:,} nodes once its aliases are expanded"
                )
            if depth > MAX_DEPTH:
                raise YamlRefused(
                    f"document nests deeper than {MAX_DEPTH} levels once its aliases are expanded"
                )
            if text > MAX_TEXT_BYTES:
                raise YamlRefused(
                    f"document holds more than {MAX_TEXT_BYTES // 1024} KiB of text once its "
                    "aliases are expanded"
                )
            continue
        if key in done:
            continue
        if isinstance(node, ScalarNode):
            done[key] = (1, 0, len(node.value.encode("utf-8", "surrogatepass")))
            continue
        if key in open_:
            raise YamlRefused(
                f"an alias refers to a collection that contains it (a recursive structure)"
                f"{_at(node.start_mark)}"
            )
        open_.add(key)
        stack.append((node, True))
        for kid in _children(node):
            kid_key = id(kid)
            if kid_key in open_:
                raise YamlRefused(
                    "an alias refers to a collection that contains it (a recursive structure)"
                    f"{_at(kid.start_mark)}"
                )
            if kid_key not in done:
                stack.append((kid, False))


def load_yaml(text: str) -> Any:
    """One YAML document as plain data, within every limit above; YamlRefused otherwise (a
    yaml.YAMLError for malformed YAML)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_DOCUMENT_BYTES:
        raise YamlRefused(
            f"document is {size:,} bytes; the limit is {MAX_DOCUMENT_BYTES:,} "
            f"({MAX_DOCUMENT_BYTES // 1024} KiB)"
        )
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        measure(node)
        try:
            return loader.construct_document(node)
        except (ValueError, OverflowError) as e:  # e.g. an integer past Python's digit limit
            raise YamlRefused(f"invalid YAML: {str(e)[:200]}") from None
    finally:
        loader.dispose()

"""The bounded YAML loader every DAG file goes through (`trace dag validate`, deploy, the API).

A DAG file is untrusted input. Before any Python object is built, the document is measured:

- its size: at most MAX_DOCUMENT_BYTES (256 KiB);
- while it is composed into YAML nodes, as it would be expanded (anchors are allowed, for
  shared config, but an alias counts as everything it repeats): nesting at most MAX_DEPTH (64)
  levels, at most MAX_NODES (20,000) nodes, MAX_TEXT_BYTES (1 MiB) of scalar text and
  MAX_ALIASES (100) alias uses (`*name`), stopping at the first one over. So a 100,000-deep
  document costs 65 levels of work and never a RecursionError, an alias bomb (each level
  repeating the one below ten times) is refused in microseconds, and an alias to one of its
  own ancestors (a recursive structure) is refused.

Only then does PyYAML construct the data (SafeLoader: plain data, no Python objects). Keys
must be unique and hashable. Each refusal names the limit."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode

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
    """SafeLoader that measures the document while it composes it, aliases expanded, and
    refuses duplicate and unhashable keys.

    An alias counts as everything its anchored node holds (known once that node is composed:
    an alias met while its node is still open is a recursive structure), so the running totals
    are those of the fully expanded document and the first node over a limit stops the work."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0  # collection levels open, aliases expanded
        self._reach = 0  # the deepest level reached under the node being composed
        self._nodes = 0
        self._text = 0
        self._aliases = 0
        # id(anchored node) -> (nodes, collection levels, text bytes), aliases expanded
        self._sizes: dict[int, tuple[int, int, int]] = {}

    def _grow(self, nodes: int, depth: int, text: int, mark: Any) -> None:
        self._nodes += nodes
        self._text += text
        self._reach = max(self._reach, depth)
        # Once aliases are in play, where a limit is crossed says little about why: no position.
        where = " once its aliases are expanded" if self._aliases else _at(mark)
        if self._nodes > MAX_NODES:
            raise YamlRefused(f"document has more than {MAX_NODES:,} nodes{where}")
        if depth > MAX_DEPTH:
            raise YamlRefused(f"document nests deeper than {MAX_DEPTH} levels{where}")
        if self._text > MAX_TEXT_BYTES:
            raise YamlRefused(
                f"document holds more than {MAX_TEXT_BYTES // 1024} KiB of text{where}"
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlRefused(
                    f"document uses more than {MAX_ALIASES} aliases{_at(event.start_mark)}"
                )
            node: Node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise YamlRefused(
                    "an alias refers to a collection that contains it (a recursive structure)"
                    f"{_at(event.start_mark)}"
                )
            nodes, levels, text = size
            self._grow(nodes, self._depth + levels, text, event.start_mark)
            return node
        outer = self._depth
        nodes, text, reach = self._nodes, self._text, self._reach
        self._depth += isinstance(event, (SequenceStartEvent, MappingStartEvent))
        self._reach = self._depth
        try:
            self._grow(1, self._depth, 0, event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth = outer
        if isinstance(node, ScalarNode):
            self._grow(0, 0, len(node.value.encode("utf-8", "surrogatepass")), event.start_mark)
        if getattr(event, "anchor", None) is not None:
            self._sizes[id(node)] = (self._nodes - nodes, self._reach - outer, self._text - text)
        self._reach = max(reach, self._reach)
        return node


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
        try:
            return loader.construct_document(node)
        except (ValueError, OverflowError) as e:  # e.g. an integer past Python's digit limit
            raise YamlRefused(f"invalid YAML: {str(e)[:200]}") from None
    finally:
        loader.dispose()

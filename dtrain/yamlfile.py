"""YAML files whose errors name a line: the image specs (images/spec.py) and job files
(launch/jobs/jobfile.py) read them with the same rule."""

from __future__ import annotations

from typing import Any

import yaml


def line_of(root: yaml.Node | None, path: tuple[Any, ...]) -> int | None:
    """1-based line of the node at `path` (keys and list indexes), following `<<` merges."""
    node, line = root, None
    for key in path:
        if isinstance(node, yaml.MappingNode):
            found = _mapping_get(node, str(key))
            if found is None:
                break
            key_node, node = found
            line = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _mapping_get(node: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    """(key node, value node) for `key`, looking into `<<` merged mappings last."""
    merged = None
    for k, v in node.value:
        if k.value == key:
            return k, v
        if k.value == "<<" and isinstance(v, yaml.MappingNode):
            merged = merged or _mapping_get(v, key)
    return merged

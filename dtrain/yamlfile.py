"""YAML files whose errors name a line: the image specs (images/spec.py) and job files
(launch/jobs/jobfile.py) read them with the same rule."""

from __future__ import annotations

import sys
from typing import Any

import yaml


class TooDeep(yaml.YAMLError):
    """A YAML text nested deeper, or with a number longer, than a file of ours holds."""


def compose_load(text: str) -> tuple[yaml.Node | None, Any]:
    """(node tree, data) of a YAML text, safe_load's rules. Nesting too deep for the parser
    (RecursionError) or an integer of thousands of digits (Python's int-string limit, a
    ValueError): TooDeep, a yaml.YAMLError, so callers' one `except yaml.YAMLError` holds."""
    try:
        return yaml.compose(text), yaml.safe_load(text)
    except RecursionError:
        raise TooDeep("nested too deep (lists or mappings inside each other)") from None
    except ValueError as e:  # int("9" * 5000) in the int constructor
        if "digits" in str(e):
            raise TooDeep(f"a number of more than {sys.get_int_max_str_digits()} digits") from None
        raise TooDeep(f"a value YAML cannot read ({' '.join(str(e).split())[:100]})") from None


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

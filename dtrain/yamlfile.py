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


def duplicate_key(root: yaml.Node | None) -> tuple[str, int, int] | None:
    """The first key given twice in one mapping anywhere in the tree: (key, its line, the first
    one's line), 1-based; None where every key is given once. YAML's loader keeps the last one
    silently: a file that says `count: 2` and, further down, `count: 3` means what it says last,
    which the writer did not see."""
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    line = k.start_mark.line + 1
                    if k.value in seen:
                        return k.value, line, seen[k.value]
                    seen[k.value] = line
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def plain_text(node: yaml.Node | None, key: str) -> dict[str, str]:
    """For the mapping under top-level `key`: {name: the value's text as written} for each plain
    (unquoted) scalar YAML would read as a number or a yes/no (`0755`, `yes`, `12:30`, `0x10`:
    YAML 1.1 reads 493, True, 750, 16). Where a value is text for a program (an environment
    variable's), what the user wrote is the value."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    found = _mapping_get(node, key)
    if found is None or not isinstance(found[1], yaml.MappingNode):
        return {}
    out = {}
    for k, v in found[1].value:
        if (isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode) and v.style is None
                and v.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")):
            out[k.value] = v.value
    return out

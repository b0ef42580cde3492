"""The operators' own CRD schemas (schemas/crd-*.json) and the strict check of a document
against one.

A stored schema is the `openAPIV3Schema` of one served version of a CustomResourceDefinition
as its project releases it (the source, tag and commit in its `$comment`), with only the
`description` texts dropped (they are 80% of the bytes). `strict(schema)` makes every object
that lists its fields refuse others (`additionalProperties: false` unless the CRD says
`x-kubernetes-preserve-unknown-fields`), as `kubectl apply --validate=strict` does: the API
server would otherwise prune an unknown field (`contaners`) without a word. The top-level
`metadata` (the CRDs leave it open) is core/v1 ObjectMeta from k8s-1.27-podtemplatespec.json.

    python -m dtrain.launch.other_tools.crds CRD.yaml VERSION OUT.json "SOURCE"   # store a new one
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"
OBJECT_META = SCHEMAS / "k8s-1.27-podtemplatespec.json"


def _drop_descriptions(node: Any) -> Any:
    if isinstance(node, list):
        return [_drop_descriptions(n) for n in node]
    if not isinstance(node, dict):
        return node
    return {k: _drop_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}


def extract(crd_text: str, version: str, source: str) -> dict[str, Any]:
    """The stored form of one version of the CRD in crd_text (a file of one or more YAML
    documents; the CustomResourceDefinition among them)."""
    crd = next(d for d in yaml.safe_load_all(crd_text) if d and d.get("kind") == "CustomResourceDefinition")
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    names = crd["spec"]["names"]
    return {"$comment": (f"openAPIV3Schema of {crd['metadata']['name']} {version} ({crd['spec']['group']}/{version} "
                         f"{names['kind']}). Source: {source}. Changed: `description` texts dropped, nothing else. "
                         "Apache-2.0, as its project. Written by `python -m dtrain.launch.other_tools.crds`."),
            "x-dtrain-kind": [f"{crd['spec']['group']}/{version}", names["kind"]],
            **_drop_descriptions(served["schema"]["openAPIV3Schema"])}


def strict(node: Any) -> Any:
    """A CRD schema as JSON Schema that refuses unknown fields."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def stored(file: str) -> dict[str, Any]:
    """The stored CRD schema `file` (schemas/), as it is."""
    return json.loads((SCHEMAS / file).read_text())


@functools.cache
def schema(file: str) -> dict[str, Any]:
    """The strict JSON Schema a document is checked against."""
    raw = stored(file)
    out = strict({k: v for k, v in raw.items() if not k.startswith(("$comment", "x-dtrain"))})
    meta = json.loads(OBJECT_META.read_text())["$defs"]
    out["properties"]["metadata"] = {"$ref": "#/$defs/V1ObjectMeta"}
    out["required"] = ["apiVersion", "kind", "metadata", "spec"]
    out["$defs"] = meta
    return out


def kind(file: str) -> tuple[str, str]:
    """(apiVersion, kind) of the stored schema."""
    api, name = stored(file)["x-dtrain-kind"]
    return api, name


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def problems(file: str, doc: Any) -> list[str]:
    """Every problem of doc against the stored schema `file`, one line each naming the field
    ([] when valid), the apiVersion/kind included."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema(file))
    out = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        where = _path(err.absolute_path)
        if err.validator == "additionalProperties" and err.validator_value is False:
            known = set(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - known):
                out.append(f"{_path([*err.absolute_path, extra])}: unknown field {extra!r}")
        elif err.validator == "pattern" and "KMGTPE" in err.validator_value:
            out.append(f"{where}: {err.instance!r} is not a Kubernetes quantity (e.g. 8, 500m, 16Gi)")
        elif err.validator == "anyOf" and isinstance(err.instance, str) and any(
                "KMGTPE" in str(s.get("pattern", "")) for s in [err.schema, *err.schema.get("anyOf", [])]):
            out.append(f"{where}: {err.instance!r} is not a Kubernetes quantity (e.g. 8, 500m, 16Gi)")
        else:
            out.append(f"{where}: {err.message}")
    api, name = kind(file)
    if isinstance(doc, dict) and (doc.get("apiVersion"), doc.get("kind")) != (api, name):
        out.append(f"apiVersion/kind: expected {api} {name}, got {doc.get('apiVersion')} {doc.get('kind')}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m dtrain.launch.other_tools.crds CRD.yaml VERSION OUT.json SOURCE", file=sys.stderr)
        return 2
    src, version, out, source = argv
    text = json.dumps(extract(Path(src).read_text(), version, source), indent=None, separators=(",", ":"),
                      sort_keys=True)
    Path(out).write_text(text + "\n")
    print(f"wrote {out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

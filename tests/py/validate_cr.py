#!/usr/bin/env python3
"""Validate custom resources against their CRD's openAPIV3Schema, the way the API server
would keep them: every object must match its version's schema, and no field may be one
the schema does not declare (the API server prunes undeclared fields silently, so a
writer would keep rewriting a field that is never stored).

Usage: validate_cr.py CRDS.yaml OBJECT.json...   Exit 0 when every object passes;
otherwise one line per problem on stdout ("FILE: problem") and exit 1. Exit 3 when
jsonschema or PyYAML is missing.
"""
import json
import sys

try:
    import jsonschema
    import yaml
except ImportError:
    print("jsonschema or PyYAML is not installed", file=sys.stderr)
    sys.exit(3)


def strict(schema):
    """The schema with undeclared fields refused where the API server would prune them."""
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k in ("items", "additionalProperties") else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            out["additionalProperties"] = False
    if schema.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def schemas(path):
    found = {}
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for v in spec["versions"]:
                schema = strict(v["schema"]["openAPIV3Schema"])
                # apiVersion, kind and metadata (ObjectMeta) are the API server's own at the
                # root of every object, whether the CRD declares them or not.
                schema["properties"]["apiVersion"] = {"type": "string"}
                schema["properties"]["kind"] = {"type": "string"}
                schema["properties"]["metadata"] = {"type": "object"}
                found[(spec["group"] + "/" + v["name"], spec["names"]["kind"])] = schema
    return found


def main():
    known = schemas(sys.argv[1])
    problems = []
    for path in sys.argv[2:]:
        with open(path) as f:
            obj = json.load(f)
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key not in known:
            problems.append(f"{path}: no CRD for {key}")
            continue
        for e in jsonschema.Draft7Validator(known[key]).iter_errors(obj):
            where = "/".join(str(p) for p in e.absolute_path)
            problems.append(f"{path}: {where}: {e.message}")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

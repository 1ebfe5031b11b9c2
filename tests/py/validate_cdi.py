#!/usr/bin/env python3
"""Validate CDI spec files: against tests/schemas/cdi-spec.schema.json (jsonschema), and
check that each file's cdiVersion is exactly the minimum its fields need.

Usage: validate_cdi.py SCHEMA FILE...   Exit 0 when every file passes; otherwise one line
per problem on stdout ("FILE: problem") and exit 1. Exit 3 when jsonschema is missing.

Minimum versions (CDI spec changelog): 0.4.0 mount `type`; 0.5.0 deviceNode `hostPath`, a
device name starting with a digit; 0.6.0 annotations (spec or device), a dot in the kind's
class; 0.7.0 `intelRdt`, `additionalGids`. Anything else: 0.3.0.
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("jsonschema is not installed", file=sys.stderr)
    sys.exit(3)


def version_key(v):
    return tuple(int(p) for p in v.split("."))


def all_edits(spec):
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    return edits


def minimum_version(spec):
    need = "0.3.0"

    def bump(v):
        nonlocal need
        if version_key(v) > version_key(need):
            need = v

    edits = all_edits(spec)
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        bump("0.4.0")
    if any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])):
        bump("0.5.0")
    if any(d.get("name", "a")[:1].isdigit() for d in spec.get("devices", [])):
        bump("0.5.0")
    kind = spec.get("kind", "")
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", [])):
        bump("0.6.0")
    if "/" in kind and "." in kind.split("/", 1)[1]:
        bump("0.6.0")
    if any("intelRdt" in e or e.get("additionalGids") for e in edits):
        bump("0.7.0")
    return need


def main(argv):
    with open(argv[1]) as f:
        schema = json.load(f)
    validator = jsonschema.Draft7Validator(schema)
    problems = []
    for path in argv[2:]:
        try:
            with open(path) as f:
                spec = json.load(f)
        except (OSError, ValueError) as e:
            problems.append(f"{path}: not JSON: {e}")
            continue
        for err in sorted(validator.iter_errors(spec), key=lambda e: list(e.path)):
            where = "/".join(str(p) for p in err.path) or "(root)"
            problems.append(f"{path}: {where}: {err.message}")
        declared = spec.get("cdiVersion") if isinstance(spec, dict) else None
        if isinstance(declared, str) and declared.count(".") == 2:
            need = minimum_version(spec)
            if declared != need:
                problems.append(
                    f"{path}: cdiVersion {declared} but its fields need exactly {need}"
                )
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

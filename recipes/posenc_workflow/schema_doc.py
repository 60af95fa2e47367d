#!/usr/bin/env python
"""The reference of a study's configuration keys, generated from recipes/conf/schema.yaml, as
recipes/README.md holds it between its ``reference`` markers (tests/docs/test_recipes_readme.py keeps
the two equal).

    python recipes/posenc_workflow/schema_doc.py             # print it
    python recipes/posenc_workflow/schema_doc.py --update    # write it into recipes/README.md
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, "recipes", "conf", "schema.yaml")
README = os.path.join(ROOT, "recipes", "README.md")
BEGIN = "<!-- reference: generated from recipes/conf/schema.yaml by recipes/posenc_workflow/schema_doc.py -->"
END = "<!-- end of reference -->"


def _default(sub) -> str:
    if "default" not in sub:
        return "(required)" if sub.get("_required") else "(absent)"
    value = sub["default"]
    if value == {}:
        return ""
    return "`" + json.dumps(value) + "`"


def _kind(sub) -> str:
    if "enum" in sub:
        return " \\| ".join(f"`{v}`" for v in sub["enum"])
    kind = sub.get("type", "")
    return "/".join(kind) if isinstance(kind, list) else kind


def rows(node, prefix="") -> list:
    out = []
    required = set(node.get("required", []))
    for key, sub in node.get("properties", {}).items():
        name = f"{prefix}{key}"
        sub = {**sub, "_required": key in required}
        if sub.get("type") == "object" and "properties" in sub:
            if sub.get("description"):
                out.append(f"| `{name}` | | | {sub['description']} |")
            out += rows(sub, name + ".")
        else:
            out.append(f"| `{name}` | {_kind(sub)} | {_default(sub)} | {sub.get('description', '')} |")
    return out


def reference() -> str:
    import yaml

    with open(SCHEMA, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    lines = [BEGIN, "", "| key | values | default | what |", "|---|---|---|---|", *rows(schema), "", END]
    return "\n".join(lines) + "\n"


def current() -> str:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    return text[start:end]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="write it into recipes/README.md")
    args = parser.parse_args(argv)
    if not args.update:
        print(reference(), end="")
        return
    with open(README, encoding="utf-8") as f:
        text = f.read()
    text = text.replace(current(), reference())
    with open(README, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()

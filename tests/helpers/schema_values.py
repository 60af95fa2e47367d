"""Another valid value of a schema field, from its schema alone: the walks over every field of
recipes/conf/schema.yaml (tests/workflow/test_settings_walk.py in-process, test_workflow_files.py
through run.sh) give each field one."""


def other_by_type(path, node, current):
    """A value of ``path`` other than ``current`` that its schema ``node`` allows: the next choice of
    an enum, the other boolean, a larger number, an array with a changed or an added item, a longer
    string. Fields whose type says too little (rows, files) are the walks' own."""
    if "enum" in node:
        return next(v for v in node["enum"] if v != current)
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "boolean" in types:
        return not current
    if "integer" in types:
        return current + 1 if isinstance(current, int) else max(3, node.get("minimum", 0))
    if "number" in types:
        return current * 2 + 0.25 if isinstance(current, (int, float)) else 0.25
    if "array" in types:
        changed = [v + 1 if isinstance(v, int) else v for v in current or []]
        return changed if changed != (current or []) else [*changed, 7]
    if "string" in types:
        return (current or "") + "x"
    raise AssertionError(f"{path}: no other value for the schema's {node}")

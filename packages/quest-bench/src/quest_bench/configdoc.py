"""What `quest-bench config` shows: every key of a task's config with its value, type, valid values and the comment
written beside the field in the config class (read from the source, so the comment is the documentation)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
from typing import Any

from quest_sdk.config import valid_values


def field_comments(config_class: type) -> dict[str, str]:
    """The ``# comment`` of each field of a dataclass: on the field's line and on comment-only lines right after it
    (a comment continued on the next line). Fields of base classes come from their own source."""
    comments: dict[str, str] = {}
    for cls in reversed(config_class.__mro__[:-1]):
        try:
            source = inspect.getsource(inspect.getmodule(cls))
        except (OSError, TypeError):
            continue  # no source (e.g. a class built at run time)
        lines = source.splitlines()
        line_comments = {tok.start[0]: tok.string.lstrip("#").strip()
                         for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                         if tok.type == tokenize.COMMENT}
        node = next((n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
        for field_node in node.body if node is not None else []:
            if isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name):
                end = field_node.end_lineno
                text = [line_comments[end]] if end in line_comments else []
                row = end + 1
                while row <= len(lines) and lines[row - 1].strip().startswith("#"):
                    text.append(line_comments[row])
                    row += 1
                if text or field_node.target.id not in comments:  # an overriding default keeps the base's comment
                    comments[field_node.target.id] = " ".join(text)
    return comments


def describe_config(config: Any) -> list[dict[str, Any]]:
    """One row per field: key, value, type, valid values, comment."""
    comments = field_comments(type(config))
    rows = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        valid = valid_values(type(config), f.name)  # declared by the field or the base class it overrides
        rows.append({"key": f.name, "value": value, "type": type(value).__name__,
                     "valid": valid.describe() if valid is not None else f"any {type(value).__name__}",
                     "comment": comments.get(f.name, "")})
    return rows

"""Reading a YAML file of ``conf/``: safe loading, a key given twice refused, errors that never quote the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from insitu.conf.errors import ConfigError, format_loc


class DuplicateKeyError(yaml.YAMLError):
    """A mapping in a YAML file gives one key twice."""

    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class ConfLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping key given twice, at any depth.

    Plain YAML keeps the last of two equal keys without a word, so a setting pasted twice (a new ``lr``
    above an old one, a second ``storage`` under a site) would silently win.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._refuse_duplicate_keys(node)
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, root: yaml.Node) -> None:
        todo: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(root, ())]
        done: set[int] = set()
        while todo:
            node, at = todo.pop()
            if id(node) in done:  # an alias of a node already checked (or a recursive one)
                continue
            done.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                todo.extend((item, (*at, i)) for i, item in enumerate(node.value))
            elif isinstance(node, yaml.MappingNode):
                first: dict[Any, int] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base': its keys may be overridden
                        todo.append((value_node, at))
                        continue
                    if not isinstance(key_node, yaml.ScalarNode):
                        continue  # a mapping or list as a key: the constructor refuses it
                    # Compared as constructed, as the dict would: 'true' and 'True' are one key.
                    key = self.construct_object(key_node)
                    line = key_node.start_mark.line + 1
                    if key in first:
                        raise DuplicateKeyError(format_loc((*at, str(key))), line, first[key])
                    first[key] = line
                    todo.append((value_node, (*at, str(key))))


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what, without PyYAML's excerpt of the file (the offending line could hold a secret)."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}{context}"
    return type(e).__name__


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: file not found (expected a YAML file; see conf/ in the repository)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ConfLoader)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__}); "
                          "point at a YAML file") from None
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}: line {e.line}: key '{e.key}': duplicate key (first at line {e.first_line}); "
                          "YAML would silently keep only the last: remove or rename one of them") from None
    except yaml.YAMLError as e:
        # 'from None': the YAML error's own text quotes the file, and a traceback would carry it into logs.
        raise ConfigError(f"{path}: not valid YAML at {_yaml_problem(e)}; fix the syntax there") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data

"""How distfl reads YAML (config files, override values, the Slurm time limit): `yaml.safe_load`
without YAML 1.1's surprises, and errors as one line."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from distfl.errors import ConfigError


def read_yaml(path: str):
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        return yaml.load(text, Loader=ConfigLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse config file {path} as YAML: {_one_line(e)}") from None


def _one_line(e: yaml.YAMLError) -> str:
    """A YAML error as one line: what is wrong, and where (PyYAML's own text quotes the line below)."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(e).split())
    context = f"{e.context} " if getattr(e, "context", None) else ""
    return f"{context}{problem} (line {mark.line + 1}, column {mark.column + 1})"


class ConfigLoader(yaml.SafeLoader):
    """`yaml.safe_load` without YAML 1.1's surprises, for config files and override values.

    - Only `true`/`false` are booleans, only plain decimals are integers (`1:30`, `0x10`, `010` stay
      strings, so an integer key refuses them instead of reading 90, 16 or 8), `1e-3` is a float, and
      dates stay strings; `yes`, `no`, `on` and `off` are strings.
    - Aliases (`*name`) are refused: a few lines of nested aliases expand to billions of nodes.
    - A key given twice in one mapping is refused instead of the last one silently winning.
    """

    MAX_DEPTH = 64  # a config is 3 levels deep; 5,000 would end in a RecursionError

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor}: YAML anchors and aliases are not accepted "
                "in distfl configs; write the value out", event.start_mark)
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > self.MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {self.MAX_DEPTH} levels; a "
                                                  "distfl config is a mapping of sections of keys", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {seen[key] + 1}); "
                    "give each key once", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


ConfigLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in [
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?(?:0|[1-9][0-9_]*)", "-+0123456789"),
    ("float", r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+0123456789."),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
]:
    ConfigLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), list(_first))

"""The dependency rule of docs/architecture.md, checked on every import statement of the project.

Every module of the four packages is parsed (never imported) and each ``import``/``from``
statement is checked, including imports inside functions and ``TYPE_CHECKING`` blocks and
relative imports (resolved to absolute names), plus ``importlib.import_module("...")`` calls
with a literal absolute name.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("launcher", "bridge", "rollout_server", "tunnel")

# Which project modules each layer may import (besides its own modules). A layer is the
# longest prefix below that names an importing module; an imported name is allowed when it is
# one of the listed modules or inside one.
RULES: dict[str, frozenset[str]] = {
    "launcher": frozenset(
        {
            "bridge",
            "tunnel",
            "rollout_server.protocol",
            "rollout_server.client",
            "rollout_server.net",
            # Pure file work (repack/build a wheel): the supervisor makes its own wheel with it
            # for rollout environments (launcher.selfwheel).
            "rollout_server.harbor.wheelhouse",
            # File work too (stdlib and the wheelhouse): the rollout's offline bundle, which
            # --ray ships to the other nodes (launcher.cluster.ship).
            "rollout_server.harbor.bundle",
            # Stdlib file locks: the node cache of rollout environments is pruned like the
            # bundle cache, with the same use locks (launcher.cluster.ship).
            "rollout_server.harbor.cachekeep",
        }
    ),
    "bridge": frozenset({"rollout_server.net", "rollout_server.protocol"}),
    "tunnel": frozenset(),
    "rollout_server": frozenset(),
    # The floor: anything may stand on it, it stands on nothing of the project.
    "rollout_server.protocol": frozenset(),
    "rollout_server.net": frozenset(),
}

# Third-party packages rollout_server must never import: it is installed into every rollout
# environment with the base dependencies only. The cli extra, and what quart-trio brings.
ROLLOUT_SERVER_FORBIDDEN = frozenset(
    {
        "litellm",
        "uv",
        "pycloudflared",
        "psutil",
        "click",
        "rich",
        # python-dotenv (--secrets-file): the distribution's name, and the module it installs.
        "python_dotenv",
        "dotenv",
        "quart",
        "quart_trio",
        "flask",
        "werkzeug",
    }
)


@dataclass(frozen=True)
class Import:
    """One imported module name, where it was written."""

    source: str
    target: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


MODULES = dict(_modules())


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = _package_of(module, path).split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            for alias in node.names:
                # `from pkg import mod` imports the module pkg.mod when there is one.
                candidate = f"{target}.{alias.name}"
                yield Import(
                    module, candidate if candidate in MODULES else target, path, node.lineno
                )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield Import(module, node.args[0].value, path, node.lineno)


ALL_IMPORTS = [found for module, path in MODULES.items() for found in _imports(module, path)]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _layer(module: str) -> str:
    return max((layer for layer in RULES if _within(module, layer)), key=len)


def test_every_module_was_found_and_parsed() -> None:
    for package in PACKAGES:
        assert package in MODULES, f"{package}/__init__.py is missing"
    assert "rollout_server.net.asgi" in MODULES
    assert any(i.target == "rollout_server.net.asgi" for i in ALL_IMPORTS)


def _violations(imports: list[Import]) -> list[str]:
    offenders = []
    for found in imports:
        if found.target.partition(".")[0] not in PACKAGES:
            continue
        layer = _layer(found.source)
        if any(_within(found.target, allowed) for allowed in {layer, *RULES[layer]}):
            continue
        may = ", ".join(sorted(RULES[layer])) or "nothing else of the project"
        offenders.append(
            f"{found.where()}: {found.source} imports {found.target}; {layer} may import only {may}"
        )
    return offenders


def test_imports_follow_the_dependency_rule() -> None:
    offenders = _violations(ALL_IMPORTS)
    assert offenders == [], "dependency rule broken:\n" + "\n".join(offenders)


def test_the_checker_sees_every_kind_of_wrong_arrow() -> None:
    path = REPO / "bridge" / "app.py"
    wrong = [
        ("bridge.app", "launcher.cli"),
        ("bridge.app", "rollout_server"),
        ("bridge.app", "rollout_server.service"),
        ("tunnel.plan", "rollout_server.net.asgi"),
        ("rollout_server.server", "bridge.app"),
        ("rollout_server.net.asgi", "rollout_server.protocol"),
        ("rollout_server.protocol", "rollout_server.jsonsafe"),
        ("launcher.cli", "rollout_server.service"),
    ]
    right = [
        ("launcher.cli", "rollout_server.client"),
        ("launcher.cli", "bridge.server"),
        ("bridge.app", "rollout_server.net.asgi"),
        ("rollout_server.server", "rollout_server.net.leanserve"),
        ("rollout_server.net", "rollout_server.net.asgi"),
    ]
    found = _violations([Import(s, t, path, 1) for s, t in wrong + right])
    assert len(found) == len(wrong), found


def test_relative_imports_resolve_to_absolute_names() -> None:
    def resolve(module: str, file: str, statement: str) -> str:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _resolve(module, REPO / file, node)

    asgi = ("rollout_server.net.asgi", "rollout_server/net/asgi.py")
    assert resolve(*asgi, "from ..protocol import X") == "rollout_server.protocol"
    assert resolve(*asgi, "from . import leanserve") == "rollout_server.net"
    net = ("rollout_server.net", "rollout_server/net/__init__.py")
    assert resolve(*net, "from .asgi import header") == "rollout_server.net.asgi"


def test_rollout_server_imports_no_cli_or_web_framework_package() -> None:
    offenders = [
        f"{found.where()}: {found.source} imports {found.target}"
        for found in ALL_IMPORTS
        if _within(found.source, "rollout_server")
        and found.target.partition(".")[0] in ROLLOUT_SERVER_FORBIDDEN
    ]
    assert offenders == [], "rollout_server must run on the base install only:\n" + "\n".join(
        offenders
    )


def test_forbidden_list_covers_the_cli_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {
        re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0].lower().replace("-", "_")
        for spec in project["optional-dependencies"]["cli"]
    }
    assert names <= ROLLOUT_SERVER_FORBIDDEN


def _circles(imports: list[Import]) -> list[list[str]]:
    """The import circles among the project's modules: strongly connected groups of two or
    more (Tarjan's algorithm). Every import counts, including those for type checking only and
    inside functions: each is a place where two modules know each other's names. A module's
    import of its own package (the package's ``__init__``) is left out: importing a sibling
    through the package is the ordinary package-init pattern, not a tangle."""
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    for found in imports:
        target = found.target
        if target not in MODULES or target == found.source:
            continue
        if MODULES[target].name == "__init__.py" and _within(found.source, target):
            continue
        edges[found.source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return groups


def test_no_import_circles() -> None:
    circles = _circles(ALL_IMPORTS)
    shown = "\n".join(" <-> ".join(group) for group in circles)
    assert circles == [], "import circles (cut one arrow of each):\n" + shown


def test_the_circle_finder_sees_a_circle() -> None:
    path = REPO / "bridge" / "app.py"
    made_up = [
        Import("bridge.app", "bridge.codec", path, 1),
        Import("bridge.codec", "bridge.policy", path, 1),
        Import("bridge.policy", "bridge.app", path, 1),
    ]
    assert ["bridge.app", "bridge.codec", "bridge.policy"] in _circles(made_up)

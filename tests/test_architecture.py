"""docs/architecture.md cannot drift from the tree: its layout block names only paths that exist, every
package, and every module of plan/ and run/ (where strategies and backends are added); its python block
runs; and adding a loop strategy touches the files the page says."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.md").read_text()
PACKAGE = ROOT / "rnngraph"


def layout() -> set:
    """Every path the layout block names, relative to rnngraph/ (folders end in '/')."""
    block = re.search(r"```text\nrnngraph/\n(.*?)```", PAGE, re.S).group(1)
    stack, out = [], set()
    for line in block.splitlines():
        indent, names = len(line) - len(line.lstrip()), line.strip().split("  ", 1)[0]
        depth = indent // 2 - 1
        stack = stack[:depth]
        for name in (n.strip() for n in names.split(",")):
            out.add("".join(stack) + name)
        if names.endswith("/"):
            stack.append(names)
    return out


def test_every_path_in_the_layout_exists():
    missing = sorted(p for p in layout() if not (PACKAGE / p).exists())
    assert not missing, missing


def test_the_layout_names_every_package_and_every_core_module():
    packages = {str(p.parent.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    core = {str(p.relative_to(PACKAGE)) for floor in ("plan", "run") for p in (PACKAGE / floor).rglob("*.py")
            if p.name != "__init__.py" or p.parent.name == "loops"}
    unlisted = sorted((packages | core) - layout())
    assert not unlisted, f"add to the layout in docs/architecture.md: {unlisted}"


def test_the_page_runs():
    for block in re.findall(r"```python\n(.*?)```", PAGE, re.S):
        exec(compile(block, "architecture.md", "exec"), {"__name__": "architecture"})


def test_a_loop_strategy_is_one_record_registered_in_one_place():
    """No module names a strategy's loop item but the strategy modules, the registry and the cuda module
    (or folder) of the strategy's name: the executor and the backends reach it through the record."""
    from rnngraph.plan.loops import STRATEGIES
    for s in STRATEGIES.values():
        item = s.item.__name__
        naming = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if re.search(rf"\b{item}\b", p.read_text()))
        allowed = {f"plan/loops/{other}.py" for other in STRATEGIES} | {"plan/loops/__init__.py"}   # one may build on another
        outside = [p for p in naming if p not in allowed and not p.startswith(f"run/backends/cuda/{s.name}")]
        assert not outside, (s.name, outside)

"""README.md and docs/*.md cannot drift: every fenced block is run or checked, and every link resolves.

What happens to a fenced block is decided by its language, and by an HTML comment on the line just
before its opening fence:

- ```python: run in-process as a program of its own (`__name__ == "__main__"`), in the page's working
  folder (a fresh temporary folder per page). A block that imports torch is marked `needs_torch`.
- `<!-- file: NAME.py -->` before a python block: the block is also saved as NAME.py in that folder
  before any other block of the page runs, so the page's console transcripts and python blocks can
  import it (as the page tells the reader to save it).
- `<!-- gpu -->` before a block: the block runs under the `gpu` marker (skipped without a usable GPU).
- ```console: a transcript. Each `$ command` line runs in the page's folder (programs: rnngraph,
  python) and must exit 0 with exactly the lines below it, up to the next `$` line, as its stdout.
- ```bash: commands to type, which install, train or measure for minutes; they are checked, not run.
  Each line (comments after `#` dropped, blank lines skipped) must match one rule of BASH_RULES:
  `rnngraph ...` and `torchrun ... -m rnngraph ...` parse with rnngraph's own argument parser;
  `pip install` names only extras setup.cfg defines, and the torch it pins; `pytest -q` is what .ci/run
  runs. A line no rule knows fails, so a new kind of command needs a rule here.
- ```text: output shown for illustration (a sample of generated text), not run.
- Any other language, or none, fails.

Links: every relative `[text](path#anchor)` and `![alt](path)` must name a file or folder that exists
(an image: a real one, over 10 kB), and an anchor must be a heading of the page it points into
(GitHub's anchors: lower case, punctuation dropped, spaces as hyphens).
"""
import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from numerics import needs_torch
from rnngraph import CELLS, CellGraph, build_schedule

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:^<!-- (?P<mark>[^>]*?) -->\n)?^```(?P<lang>\S*)\n(?P<body>.*?)^```\n", re.M | re.S)
LANGS = ("python", "console", "bash", "text")


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path) -> list:
    """(language, mark, body, line) of every fenced block of a page; mark is the comment before it or ''."""
    text = page.read_text()
    return [(m["lang"], m["mark"] or "", m["body"], text.count("\n", 0, m.start("lang")) + 1)
            for m in FENCE.finditer(text)]


def files(page: Path) -> dict:
    """The page's `<!-- file: NAME -->` blocks: NAME -> text."""
    return {mark.removeprefix("file: "): body for _, mark, body, _ in blocks(page) if mark.startswith("file: ")}


def cases(lang: str) -> list:
    """pytest params of every block of `lang` across the pages, gpu- and torch-marked as the module docstring says."""
    out = []
    for page in PAGES:
        for lang_, mark, body, line in blocks(page):
            if lang_ != lang:
                continue
            marks = [pytest.mark.gpu] if mark == "gpu" else []
            if lang == "python" and re.search(r"^\s*(import|from) (torch|rnngraph\.torch)\b", body, re.M):
                marks.append(needs_torch)
            out.append(pytest.param(page, body, marks=marks, id=f"{rel(page)}:{line}"))
    return out


@pytest.fixture
def folder(tmp_path, monkeypatch, request):
    """The page's working folder: its file blocks saved there, the working directory and first on sys.path."""
    page = request.node.callspec.params["page"]
    for name, text in files(page).items():
        (tmp_path / name).write_text(text)
        monkeypatch.delitem(sys.modules, Path(name).stem, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in files(page):
        sys.modules.pop(Path(name).stem, None)


def test_every_block_has_a_known_language():
    bad = [f"{rel(p)}:{line} ```{lang}" for p in PAGES for lang, _, _, line in blocks(p) if lang not in LANGS]
    assert not bad, f"fenced blocks of an unknown language (use one of {LANGS}): {bad}"


def test_gpu_and_file_marks_are_spelled_right():
    text = "\n".join(p.read_text() for p in PAGES)
    marks = re.findall(r"^<!-- ((?:gpu|file)\b[^>]*?) -->$", text, re.M)
    assert all(m == "gpu" or re.fullmatch(r"file: [\w.]+\.py", m) for m in marks), marks
    placed = sum(1 for p in PAGES for _, mark, _, _ in blocks(p) if mark.startswith(("gpu", "file")))
    assert placed == len(marks), "a gpu or file mark is not on the line just before a fence"


@pytest.mark.parametrize("page, body", cases("python"))
def test_python_block(page, body, folder, capsys):
    runpy.run_path(str(_saved(folder, page, body)), run_name="__main__")


def _saved(folder: Path, page: Path, body: str) -> Path:
    """The block as a file: its own file name if the page saves it, else a scratch name."""
    name = next((n for n, text in files(page).items() if text == body), "block.py")
    (folder / name).write_text(body)
    return folder / name


def transcripts(body: str) -> list:
    """(command, expected stdout) for every `$ command` line of a console block."""
    out = []
    for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        out.append((command, output))
    return out


@pytest.mark.parametrize("page, body", cases("console"))
def test_console_block(page, body, folder):
    assert transcripts(body), "a console block with no `$ command` line"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for command, expected in transcripts(body):
        program, *args = shlex.split(command)
        argv = {"rnngraph": [sys.executable, "-m", "rnngraph"], "python": [sys.executable]}[program]
        r = subprocess.run(argv + args, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == expected, command


# -- bash blocks: checked, not run -----------------------------------------------------------------

def _rnngraph(argv: list) -> None:
    """The arguments parse with rnngraph's own parser (argparse exits 2 on an unknown option or value)."""
    from rnngraph.lab.cli import build_parser
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"rnngraph {shlex.join(argv)} does not parse: {err.getvalue().strip() or e}")


def _torchrun(argv: list) -> None:
    assert "-m" in argv and argv[argv.index("-m") + 1] == "rnngraph", argv
    _rnngraph(argv[argv.index("-m") + 2:])


def _pip(argv: list) -> None:
    setup = (ROOT / "setup.cfg").read_text()
    assert argv[0] == "install", argv
    for arg in argv[1:]:
        if m := re.fullmatch(r"-e|\.\[(\w+)\]", arg):
            assert m[1] is None or re.search(rf"^{m[1]} =$", setup, re.M), f"setup.cfg has no extra {m[1]}"
        elif arg.startswith("torch=="):
            assert f"\n    {arg}\n" in setup, f"setup.cfg's test extra does not pin {arg}"
        else:
            assert arg in ("--index-url", "https://download.pytorch.org/whl/cpu"), arg


def _pytest(argv: list) -> None:
    assert argv == ["-q"] and re.search(r"^pytest -q$", (ROOT / ".ci" / "run").read_text(), re.M)


BASH_RULES = {"rnngraph": _rnngraph, "torchrun": _torchrun, "pip": _pip, "pytest": _pytest}


def commands(body: str) -> list:
    """The command lines of a bash block, each split into words (`&&` separates two commands)."""
    out = []
    for line in body.splitlines():
        words = shlex.split(line, comments=True)
        while "&&" in words:
            out.append(words[:words.index("&&")])
            words = words[words.index("&&") + 1:]
        if words:
            out.append(words)
    return out


@pytest.mark.parametrize("page, body", cases("bash"))
def test_bash_block(page, body):
    assert commands(body), "a bash block with no command"
    for program, *argv in commands(body):
        assert program in BASH_RULES, f"no rule checks `{program}` lines (see this module's docstring)"
        BASH_RULES[program](argv)


# -- links -----------------------------------------------------------------------------------------

def anchors(page: Path) -> set:
    """GitHub's anchors of a page's headings: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return re.findall(r"(!?)\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_resolve(page):
    for image, target in links(page):
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: {target} does not exist"
        if image:
            assert dest.stat().st_size > 10_000, f"{rel(page)}: {target} is not a real image"
        if anchor:
            assert dest.suffix == ".md" and anchor in anchors(dest), f"{rel(page)}: no heading for #{anchor}"


def test_docs_name_no_commit_or_issue():
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"\bissue #?\d+", text, re.I), f"{rel(page)} names an issue"
        hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
        assert not hashes, f"{rel(page)} names commits: {hashes}"


# -- what the README promises ----------------------------------------------------------------------

def test_the_readme_cell_is_the_builtin_mgu():
    namespace = {"__name__": "readme"}
    exec(files(ROOT / "README.md")["mycells.py"], namespace)
    cell = namespace["mgu"](32, 64)
    assert isinstance(cell, CellGraph) and "mgu" in CELLS
    s = build_schedule(cell)
    assert s.summary() == build_schedule(CELLS["mgu"][0](32, 64)).summary()
    assert [len(stage) for stage in s.loop] == [1, 1, 1, 1]         # the four stages the README explains
    assert s.pre[0].weights == ("W_f", "W_n")


def test_the_readme_install_is_what_ci_runs():
    readme = ROOT / "README.md"
    (setup,) = [body for lang, _, body, _ in blocks(readme) if lang == "bash" and "pip install" in body]
    lines = setup.splitlines()
    assert "download.pytorch.org/whl/cpu" in lines[0]                # the small torch before the install
    assert lines[1].startswith('pip install -e ".[test]" && rnngraph demo') and lines[2].startswith("pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]"' in ci and re.search(r"^pytest -q\b", ci, re.M)


def test_readme_length():
    assert 150 <= len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_demo_numbers_come_from_its_committed_output():
    out = (ROOT / "experiments" / "results" / "demo_cpu" / "output.txt").read_text()
    seconds = re.search(r"rnngraph demo: done in (\d+) s", out).group(1)
    val = re.search(r"validation bpc (\d\.\d{3}) after", out).group(1)
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"It takes {seconds} s on two CPU cores, reaching a validation bpc of {val}" in text
    reference = (ROOT / "experiments" / "results" / "demo_numpy" / "output.txt").read_text()
    numpy_seconds = re.search(r"rnngraph demo: done in (\d+) s", reference).group(1)
    assert f"{numpy_seconds} s on the numpy reference engine" in text


def test_the_cpu_training_numbers_come_from_the_stored_log():
    from rnngraph.train.logs import read_log
    log = read_log(ROOT / "experiments" / "results" / "training_cpu_default" / "log.json")
    text = " ".join((ROOT / "docs" / "training.md").read_text().split())
    first = next(v for v in log["val_bpc"] if v == v)                          # the first epoch's end
    steps, seconds, val = log["step"][-1], log["elapsed_s"][-1], log["val_bpc"][-1]
    chars = steps * 32 * 32                                                    # the default streams × bptt
    assert (f"validation bpc of {val:.3f}** after {steps:,.0f} steps and {seconds:.0f} s of training "
            f"({first:.3f} after the first epoch), about {round(chars / seconds, -2):,.0f} "
            "characters per second") in text


def test_the_gpu_page_states_autos_limits_as_the_runner_keeps_them():
    """gpu.md says, by hand, up to which B `auto` runs the tensor-core kernel at each width: the same pairs as
    runner.AUTO_TENSOR_CORE_ROWS (the widest as 'wider cells as ...')."""
    from rnngraph.run.backends.cuda.persistent.runner import AUTO_TENSOR_CORE_ROWS
    text = " ".join((ROOT / "docs" / "gpu.md").read_text().split())
    said = re.search(r"`auto` runs the kernel on tensor cores (up to .*?) \(wider cells", text)
    assert said, "gpu.md no longer says where auto runs the tensor-core kernel"
    pairs = tuple((int(h), int(b)) for b, h in re.findall(r"B = (\d+) at H ≤ (\d+)", said.group(1)))
    assert pairs == AUTO_TENSOR_CORE_ROWS

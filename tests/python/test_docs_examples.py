"""Every Python example of the README and of the docs site runs as written, and its assertions hold.

The pages are ``README.md`` and ``docs/**/*.md``. Their examples are fenced code blocks:

- ```` ```python ````: saved as a script and run as ``__main__`` in the test's process. One
  that starts processes itself (``multiprocessing``, spawn) is marked ``multiprocess``.
- ```` ```{code-block} python ```` with a caption naming a launcher, e.g.
  ``:caption: Run with `mpirun -n 2 python example.py` ``: saved as ``example.py`` and run
  by that command (``python``, ``mpirun`` and ``torchrun`` are the test environment's).
  Marked ``multiprocess``.
- a caption that starts with "Needs a CUDA GPU" (the page shows it): marked ``cuda``, run
  where torch sees a CUDA device, skipped elsewhere with the reason.

Blocks in other languages (shell commands, output) are not examples and are not run.

The API reference's examples are the ``>>>`` examples in the docstrings of the public
modules (``docs/_ext/reference_coverage.py`` lists them): they run as doctests.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import importlib.util
import os
import pathlib
import re
import runpy
import shlex
import subprocess
import sys
from typing import List, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LAUNCHERS = {"python": sys.executable,
             "mpirun": os.path.join(os.path.dirname(sys.executable), "mpirun"),
             "torchrun": os.path.join(os.path.dirname(sys.executable), "torchrun")}
GPU_CAPTION = "Needs a CUDA GPU"
SCRIPT_NAME = "example.py"


@dataclasses.dataclass
class Example:
    """One Python block of a page: where it is, its code and how it runs."""

    page: str  # relative to the checkout
    line: int  # of the opening fence
    heading: str  # the nearest heading above it
    code: str
    caption: str = ""

    @property
    def launcher(self) -> Optional[List[str]]:
        """The command of a "Run with `...`" caption, or None (the block runs in-process)."""
        match = re.search(r"Run with `([^`]+)`", self.caption)
        return shlex.split(match.group(1)) if match else None

    @property
    def needs_gpu(self) -> bool:
        return self.caption.startswith(GPU_CAPTION)

    @property
    def test_id(self) -> str:
        return f"{self.page}:{self.line} {self.heading}"


_FENCE = re.compile(r"^(`{3,})\s*(.*?)\s*$")


def examples_in(path: pathlib.Path, root: pathlib.Path = ROOT) -> List[Example]:
    """The page's Python blocks, each with the nearest heading above it (paths relative to ``root``)."""
    examples: List[Example] = []
    heading = ""
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if not fence:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            index += 1
            continue
        ticks, info = fence.groups()
        start = index
        index += 1
        caption = ""
        if info == "{code-block} python":
            while index < len(lines) and lines[index].startswith(":"):
                option, _, value = lines[index][1:].partition(":")
                if option == "caption":
                    caption = value.strip()
                index += 1
        body = []
        while index < len(lines) and lines[index].rstrip() != ticks:
            body.append(lines[index])
            index += 1
        index += 1  # the closing fence
        if info in ("python", "{code-block} python"):
            examples.append(Example(str(path.relative_to(root)), start + 1, heading, "\n".join(body) + "\n", caption))
    return examples


def pages() -> List[pathlib.Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def all_examples() -> List[Example]:
    return [example for page in pages() for example in examples_in(page)]


def example_params() -> list:
    """One param per example; its markers give its tier (tests/python/conftest.py)."""
    params = []
    for example in all_examples():
        marks = []
        multiprocess = example.launcher is not None or "multiprocessing" in example.code
        if multiprocess:
            marks.append(pytest.mark.multiprocess)
        if example.needs_gpu:
            marks.append(pytest.mark.cuda)
            if multiprocess:
                # scripts/gpu_check.sh runs the cuda-marked tests in the default (fast) tier;
                # without a GPU the example is skipped at once, so the fast tier pays nothing.
                marks.append(pytest.mark.fast)
        params.append(pytest.param(example, id=example.test_id, marks=marks))
    return params


def test_the_readme_has_an_example_per_job():
    headings = " / ".join(example.heading for example in examples_in(README))
    for job in ("ring", "refit", "torch.distributed"):
        assert job in headings.lower() or job in headings, f"no README example for {job}: {headings}"


def test_every_guide_has_examples():
    guides = sorted((DOCS / "guides").glob("*.md"))
    assert guides, "docs/guides/ has no pages"
    for guide in guides:
        assert examples_in(guide), f"{guide.relative_to(ROOT)} has no Python example"


def test_the_parser_finds_blocks_headings_captions_and_skips_other_languages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n```bash\necho no\n```\n\n## Section\n\n```python\nx = 1\n```\n\n"
                    "```{code-block} python\n:caption: Run with `mpirun -n 2 python example.py`\n\ny = 2\n```\n\n"
                    "```{code-block} python\n:caption: Needs a CUDA GPU (not run here)\n\nz = 3\n```\n")
    found = [(e.page, e.line, e.heading, e.code.strip(), e.launcher, e.needs_gpu) for e in examples_in(page, tmp_path)]
    assert found == [("page.md", 9, "Section", "x = 1", None, False),
                     ("page.md", 13, "Section", "y = 2", ["mpirun", "-n", "2", "python", "example.py"], False),
                     ("page.md", 19, "Section", "z = 3", None, True)]


def _skip_without_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False")


def _launch(command: List[str], script: pathlib.Path) -> None:
    argv = [LAUNCHERS.get(word, word) if position == 0 or word == "python" else word
            for position, word in enumerate(command)]
    argv = [str(script) if word == SCRIPT_NAME else word for word in argv]
    env = dict(os.environ)
    if command[0] == "mpirun":
        # as the MPI tests run it: as root, and with more ranks than cores allowed
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    result = subprocess.run(argv, cwd=script.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    assert result.returncode == 0, f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout[-6000:]}"


@pytest.mark.parametrize("example", example_params())
def test_example_runs(example: Example, tmp_path):
    if example.needs_gpu:
        _skip_without_a_gpu()
    script = tmp_path / SCRIPT_NAME
    script.write_text(example.code)
    if example.launcher is not None:
        _launch(example.launcher, script)
        return
    # runpy makes the script sys.modules["__main__"] while it runs, so an example that
    # starts processes with multiprocessing "spawn" works: a spawned child re-imports the
    # script (as __mp_main__, skipping the `if __name__ == "__main__":` part) and finds
    # the functions it is to run.
    runpy.run_path(str(script), run_name="__main__")


def _public_modules() -> List[str]:
    spec = importlib.util.spec_from_file_location("reference_coverage", DOCS / "_ext" / "reference_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.PUBLIC_MODULES)


def test_docstrings_have_examples_that_run():
    assert any(doctest.DocTestFinder().find(importlib.import_module("tensorxfer.ipc.pack"))), \
        "no docstring example found: the doctest collection below would test nothing"


@pytest.mark.parametrize("module_name", _public_modules())
def test_docstring_examples_run(module_name: str):
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, module_name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {module_name} failed"


def test_the_readme_fits_on_two_screens():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: it keeps to 200 (the detail belongs in docs/)"

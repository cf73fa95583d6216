"""The README's Python examples run as written and their assertions hold."""

from __future__ import annotations

import pathlib
import re
import runpy

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    blocks = []
    # A block belongs to the nearest heading above it: the text between may not
    # hold another heading (a section whose block is not Python gets none).
    for match in re.finditer(r"^### ([^\n]+)$(?:(?!^#).)*?^```python\n(.*?)^```", text, re.S | re.M):
        blocks.append((match.group(1), match.group(2)))
    return blocks


def test_readme_has_an_example_per_capability():
    titles = [title for title, _ in python_blocks()]
    assert len(titles) >= 4, titles


def example_params() -> list:
    """One param per block; a block that starts processes is marked multiprocess (its tier)."""
    return [pytest.param(title, code, id=title,
                         marks=[pytest.mark.multiprocess] if "multiprocessing" in code else [])
            for title, code in python_blocks()]


@pytest.mark.parametrize("title,code", example_params())
def test_readme_example_runs(title, code, tmp_path):
    # Each block runs as a user runs it: saved as a script and run as __main__.
    # runpy makes the script sys.modules["__main__"] while it runs, so the
    # examples that start processes with multiprocessing "spawn" work: a
    # spawned child re-imports the script (as __mp_main__, skipping the
    # `if __name__ == "__main__":` part) and finds the functions it is to run.
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")

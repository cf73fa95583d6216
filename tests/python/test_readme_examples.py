"""The README's Python examples run as written and their assertions hold."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    blocks = []
    for match in re.finditer(r"^### (.+?)$.*?^```python\n(.*?)^```", text, re.S | re.M):
        blocks.append((match.group(1), match.group(2)))
    return blocks


def test_readme_has_an_example_per_capability():
    titles = [title for title, _ in python_blocks()]
    assert len(titles) >= 4, titles


@pytest.mark.parametrize("title,code", python_blocks(), ids=[t for t, _ in python_blocks()])
def test_readme_example_runs(title, code, capsys):
    exec(compile(code, f"README.md:{title}", "exec"), {"__name__": "readme_example"})

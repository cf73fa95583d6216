"""The package as installed: typed, self-contained, and polite to the process that imports it.

- It ships ``py.typed`` and the ``_core.pyi`` stub beside the extension.
- Importing or using it changes no global state of the caller: the matplotlib
  backend stays what the caller chose, and a ``tensorxfer`` directory elsewhere on
  ``sys.path`` is never merged into the package.
- Every public call is annotated (mypy checks the annotations in scripts/test.sh).
- The C++ core builds without a system ``dlpack/dlpack.h`` (the project declares
  the DLPack ABI itself; tests/cpp/common/dlpack_abi_test.cc checks the two agree).
"""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import tensorxfer

PACKAGE_DIR = pathlib.Path(tensorxfer.__file__).resolve().parent
CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


def run_python(code: str, *, extra_path: list[str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter that imports this same tensorxfer."""
    path = [str(PACKAGE_DIR.parent)] + (extra_path or [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("MPLBACKEND", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_package_ships_py_typed_and_the_core_stub():
    assert (PACKAGE_DIR / "py.typed").is_file()
    stub = PACKAGE_DIR / "_core.pyi"
    assert stub.is_file()
    # The stub describes the extension that is really there.
    text = stub.read_text()
    for name in ("class SlotRing", "class PackLayout", "class CopyEngine", "build_info"):
        assert name in text, name


def test_reporting_keeps_the_callers_matplotlib_backend(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_python(f"""
        import sys
        import matplotlib
        matplotlib.use("pdf")                     # the caller's choice
        from tensorxfer.benchmarks.report import Report
        report = Report("backend check")
        report.add("case", "tensorxfer", "time", [1.0, 1.1], "s", lower_is_better=True)
        report.add("case", "numpy", "time", [2.0, 2.1], "s", lower_is_better=True)
        report.compare("case", "time", "tensorxfer", "numpy", target=1.5)
        json_path, png_path = report.write({str(tmp_path)!r}, "check")
        assert png_path is not None and png_path.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    backend, imported_pyplot = result.stdout.split()
    assert backend == "pdf"
    assert imported_pyplot == "False"


def test_a_tensorxfer_directory_elsewhere_on_sys_path_is_not_merged(tmp_path):
    stranger = tmp_path / "tensorxfer"
    stranger.mkdir()
    (stranger / "__init__.py").write_text("")
    (stranger / "stranger_module.py").write_text("LOADED = True\n")
    result = run_python("""
        import tensorxfer
        print(list(tensorxfer.__path__))
        try:
            import tensorxfer.stranger_module
        except ModuleNotFoundError:
            print("not merged")
    """, extra_path=[str(tmp_path)])
    assert result.returncode == 0, result.stderr
    path_line, verdict = result.stdout.splitlines()
    assert str(stranger) not in path_line
    assert verdict == "not merged"


def _dlpack_including_files(root: pathlib.Path) -> list[str]:
    pattern = re.compile(r"^\s*#\s*include\s*<dlpack/dlpack\.h>", re.M)
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix in (".h", ".cc", ".cu", ".cpp") and pattern.search(path.read_text(errors="replace")):
            found.append(path.relative_to(CHECKOUT).as_posix())
    return found


needs_checkout = pytest.mark.skipif(not (CHECKOUT / "cpp" / "src").is_dir(),
                                    reason="the C++ sources are not beside this test (run from a checkout)")


@needs_checkout
def test_only_the_dlpack_selector_and_its_layout_test_include_the_system_header():
    assert _dlpack_including_files(CHECKOUT / "cpp") == ["cpp/include/tensorxfer/common/dlpack.h"]
    assert _dlpack_including_files(CHECKOUT / "tests" / "cpp") == ["tests/cpp/common/dlpack_abi_test.cc"]


@needs_checkout
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++) on PATH")
def test_core_sources_preprocess_with_the_system_dlpack_header_poisoned(tmp_path):
    # A dlpack/dlpack.h first on the include path that fails if anything reaches it: the
    # core as a machine without libdlpack-dev compiles it (TENSORXFER_USE_SYSTEM_DLPACK off).
    poison = tmp_path / "dlpack"
    poison.mkdir()
    (poison / "dlpack.h").write_text('#error "the system dlpack/dlpack.h was included"\n')
    sources = sorted(str(p) for p in (CHECKOUT / "cpp" / "src").rglob("*.cc"))
    assert sources
    result = subprocess.run(
        ["c++", "-std=c++17", "-E", f"-I{tmp_path}", f"-I{CHECKOUT / 'cpp' / 'include'}", *sources],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]


def _public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(tensorxfer.__path__, "tensorxfer."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return names


def _unannotated(function: Any, where: str) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    missing = [f"{where}({name})" for name, parameter in signature.parameters.items()
               if name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append(f"{where} -> ?")
    return missing


def test_public_signatures_are_annotated():
    missing: list[str] = []
    modules = _public_modules()
    assert "tensorxfer.ipc.slot_ring" in modules
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module_name:
                continue
            if inspect.isfunction(value):
                missing += _unannotated(value, f"{module_name}.{name}")
            elif inspect.isclass(value):
                for member_name, member in vars(value).items():
                    if member_name.startswith("_") and member_name != "__init__":
                        continue
                    function = getattr(member, "__func__", member)  # staticmethod, classmethod
                    # Methods written in the class (not, e.g., typing.Protocol's generated __init__).
                    if inspect.isfunction(function) and function.__qualname__ == f"{name}.{member_name}":
                        missing += _unannotated(function, f"{module_name}.{name}.{member_name}")
    assert not missing, "public calls without type annotations:\n" + "\n".join(missing)


@needs_checkout
def test_readme_user_sections_name_no_files_of_the_checkout():
    readme = (CHECKOUT / "README.md").read_text()
    user_part, developer_marker, _ = readme.partition("## Developing tensorxfer")
    assert developer_marker, "README.md lost its 'Developing tensorxfer' section"
    # A user who ran `pip install` has none of these.
    checkout_paths = re.findall(r"(?<![\w/.])(?:examples|bench/python|bench/cpp|shared|tests|scripts|cpp|\.ci)/[\w./<>*-]*",
                                user_part)
    assert not checkout_paths, checkout_paths

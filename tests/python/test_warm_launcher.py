"""The tests' warm launcher: a forked worker behaves as ``python worker.py`` would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import warm_launcher

pytestmark = pytest.mark.multiprocess

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import helper_beside_the_script
    what = sys.argv[1]
    if what == "report":
        print(json.dumps({"argv": sys.argv, "pid": os.getpid(), "cwd": os.getcwd(),
                          "marker": os.environ.get("WARM_TEST_MARKER"), "name": __name__,
                          "beside": helper_beside_the_script.VALUE}), flush=True)
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "raise":
        raise ValueError("raised in the worker")
    elif what == "wait":
        import time
        print("READY", flush=True)
        time.sleep(60)
    elif what == "atexit":
        import atexit
        atexit.register(lambda: print("atexit ran", flush=True))
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(SCRIPT)
    (tmp_path / "helper_beside_the_script.py").write_text("VALUE = 42\n")
    return str(path)


def start(script, *args, env=None, cwd=None):
    return warm_launcher.popen([sys.executable, script, *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=cwd)


def test_a_warm_worker_is_a_process_of_its_own_with_the_argv_environment_and_folder_given(script, tmp_path):
    import json

    env = dict(os.environ, WARM_TEST_MARKER="set for this launch")
    process = start(script, "report", env=env, cwd=str(tmp_path))
    assert isinstance(process, warm_launcher.WarmProcess)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    report = json.loads(out)
    assert report == {"argv": [script, "report"], "pid": process.pid, "cwd": str(tmp_path),
                      "marker": "set for this launch", "name": "__main__", "beside": 42}
    assert process.pid != os.getpid()
    second = start(script, "report", env=env, cwd=str(tmp_path))
    assert json.loads(second.communicate(timeout=60)[0])["pid"] == second.pid != process.pid


def test_exit_status_uncaught_exception_and_atexit_are_those_of_a_fresh_interpreter(script):
    process = start(script, "exit", "7")
    process.communicate(timeout=60)
    assert process.returncode == 7
    process = start(script, "raise")
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "ValueError: raised in the worker" in out and "Traceback" in out
    process = start(script, "atexit")
    assert process.communicate(timeout=60)[0] == "atexit ran\n"
    assert process.returncode == 0


def test_a_killed_worker_reports_the_signal_and_a_wait_times_out_before(script):
    process = start(script, "wait")
    assert process.stdout.readline() == "READY\n"
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    with pytest.raises(subprocess.TimeoutExpired):
        process.communicate(timeout=0.2)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL


def test_commands_a_fork_cannot_reproduce_start_fresh(script, monkeypatch):
    fresh = warm_launcher.popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    fresh.communicate(timeout=60)
    assert isinstance(fresh, subprocess.Popen)
    monkeypatch.setenv("TENSORXFER_TEST_FRESH_RANKS", "1")
    process = start(script, "exit", "3")
    assert isinstance(process, subprocess.Popen)
    process.communicate(timeout=60)
    assert process.returncode == 3


def test_a_different_import_time_environment_gets_a_zygote_of_its_own(script):
    check = ("import os, sys, tensorxfer; "
             "print(os.environ.get('TENSORXFER_CPU_VECTOR_SET'), tensorxfer._core.cpu_features()['vector_set'])")
    path = os.path.join(os.path.dirname(script), "features.py")
    with open(path, "w") as file:
        file.write(check + "\n")
    baseline = start(path, env=dict(os.environ, TENSORXFER_CPU_VECTOR_SET="baseline"))
    out, _ = baseline.communicate(timeout=60)
    assert out.split() == ["baseline", "baseline"], out


@pytest.mark.skipif(os.geteuid() != 0, reason="entering namespaces (nsenter, setns) needs root")
def test_an_nsenter_prefix_puts_the_warm_worker_in_those_namespaces(tmp_path):
    import json

    holder = subprocess.Popen(["unshare", "--net", "--ipc", "--mount", "--propagation", "private",
                               "sleep", "60"])
    try:
        path = tmp_path / "where.py"
        path.write_text("import json, os\nprint(json.dumps({n: os.stat(f'/proc/self/ns/{n}').st_ino "
                        "for n in ('net', 'ipc', 'mnt')} | {'cwd': os.getcwd()}))\n")
        expected = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until unshare has moved into its namespaces and exec'd sleep
            expected = {n: os.stat(f"/proc/{holder.pid}/ns/{n}").st_ino for n in ("net", "ipc", "mnt")}
            if expected["net"] != os.stat("/proc/self/ns/net").st_ino:
                break
            time.sleep(0.01)
        process = warm_launcher.popen(["nsenter", "-t", str(holder.pid), "--net", "--ipc", "--mount", "--",
                                       sys.executable, str(path)], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        assert isinstance(process, warm_launcher.WarmProcess)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out
        assert json.loads(out) == {**expected, "cwd": "/"}
    finally:
        holder.kill()
        holder.wait()

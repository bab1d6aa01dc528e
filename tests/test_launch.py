"""The launcher: readiness (line or discovery), log capture, timeout errors, whole-group stop, exit clean-up."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ECHO_WORKER, ROOT, group_gone, pid_alive, pid_gone, until

import dynamo_nb
from dynamo_nb import ConfigError, DistributedRuntime, LaunchError, LocalServices, launch, launched
from dynamo_nb.launch import launcher

CHATTY = ROOT / "tests" / "programs" / "chatty.py"

pytestmark = pytest.mark.processes  # launching programs is what this file tests


async def test_ready_line_logs_and_stop(tmp_path: Path) -> None:
    proc = await launch(CHATTY, "--ready-after", "0.2", "--lines", "3", log_dir=tmp_path, show_logs=False)
    try:
        assert proc.running and proc in launched()
        assert proc.ready_line.startswith("READY chatty")
        assert proc.url == "http://127.0.0.1:1/" and proc.instance_id == 0xABC123
        assert proc.logs() == ["line 0", "line 1", "line 2", proc.ready_line]
        assert proc.tail(1) == proc.ready_line
        assert proc.log_path.parent == tmp_path and proc.log_path.name == f"chatty-{proc.pid}.log"
        assert repr(proc) == f"<ManagedProcess chatty pid={proc.pid} ready>"
        assert proc.cpu_seconds() > 0  # a Python interpreter started
    finally:
        code = await proc.stop()
    assert code == -signal.SIGTERM and not proc.running and proc not in launched()
    assert proc.log_path.read_text().splitlines()[:3] == ["line 0", "line 1", "line 2"]
    assert await group_gone(proc.pid)
    assert await proc.stop() == code  # twice is harmless


async def test_stderr_is_captured_and_shown_on_stdout_in_a_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = await launch(CHATTY, "--stderr", "--ready-after", "0", name="noisy", log_dir=tmp_path)
    await proc.stop()
    shown = capsys.readouterr().out.splitlines()
    assert "[noisy] line 0" in shown and "[noisy] line 2" in shown
    assert any(line.startswith("[noisy] READY") for line in shown)
    assert "line 1" in proc.log_path.read_text()


async def test_the_log_view_ends_with_the_real_exit_of_a_killed_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed, its output closes a moment before it is reaped: the view still says ``exited -9``
    (not ``closed``); stopped by `stop`, it says ``stopped``."""
    killed = await launch(CHATTY, "--ready-after", "0", name="killed", log_dir=tmp_path)
    killed.send_signal(signal.SIGKILL)
    shown: list[str] = []
    ends = ("[killed] -- exited", "[killed] -- closed", "[killed] -- stopped")
    await until(lambda: shown.extend(capsys.readouterr().out.splitlines()) or any(
        line.startswith(ends) for line in shown), timeout=30)  # fmt: skip
    assert [line for line in shown if line.startswith(ends)] == ["[killed] -- exited -9"]
    await killed.stop()
    stopped = await launch(CHATTY, "--ready-after", "0", name="stopped", log_dir=tmp_path)
    await stopped.stop()
    assert "[stopped] -- stopped" in capsys.readouterr().out.splitlines()
    # the record the browser test holds the log boxes to, kept after stop
    assert (launcher._ENDED[killed.pid], launcher._ENDED[stopped.pid]) == ("exited -9", "stopped")


async def test_a_program_that_is_never_ready_times_out_with_its_last_lines(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        await launch(CHATTY, "--lines", "30", "--grandchild", timeout=5.0, log_dir=tmp_path, show_logs=False)
    error = caught.value
    assert "chatty was not ready within 5 s" in str(error) and "'^READY\\\\b'" in str(error)
    assert error.returncode is None
    assert error.log_tail.splitlines()[-1] == "line 29" and "line 29" in str(error)
    assert len(error.log_tail.splitlines()) == 20
    grandchild = int(
        re.search(r"grandchild (\d+)", (tmp_path / os.listdir(tmp_path)[0]).read_text()).group(1)
    )
    assert await pid_gone(grandchild)
    assert launched() == []


async def test_a_program_that_exits_before_ready_reports_its_status(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="exited with status 3 before it was ready") as caught:
        await launch(CHATTY, "--exit-code", "3", log_dir=tmp_path, show_logs=False)
    assert caught.value.returncode == 3 and caught.value.log_tail.endswith("line 2")


async def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    proc = await launch(
        CHATTY, "--grandchild", "--ignore-term", "--ready-after", "0", log_dir=tmp_path, show_logs=False
    )
    grandchild = int(proc.logs()[0].split()[1])
    assert os.getpgid(grandchild) == proc.pid  # the grandchild is in the launched group
    code = await proc.stop(timeout=0.5)
    assert code == -signal.SIGKILL
    assert await group_gone(proc.pid)
    assert await pid_gone(grandchild)


async def test_a_leader_that_exits_leaves_no_grandchild_behind(tmp_path: Path) -> None:
    proc = await launch(CHATTY, "--grandchild", "--ready-after", "0", log_dir=tmp_path, show_logs=False)
    grandchild = int(proc.logs()[0].split()[1])
    proc.send_signal(signal.SIGTERM)  # the leader dies, the grandchild (ignoring SIGTERM) stays
    assert await proc.wait(timeout=5) == -signal.SIGTERM
    assert pid_alive(grandchild)
    await proc.stop()  # stopping an exited program still clears its group
    assert await group_gone(proc.pid)


async def test_ready_when_the_instance_appears_in_discovery(services: LocalServices, tmp_path: Path) -> None:
    runtime = await DistributedRuntime.create(discovery=services.etcd_url)
    try:
        proc = await launch(
            ECHO_WORKER,
            "--discovery",
            services.etcd_url,
            "--endpoint",
            "launchtest.echo.generate",
            ready=None,
            instance="launchtest.echo.generate",
            runtime=runtime,
            log_dir=tmp_path,
            show_logs=False,
        )
        client = await runtime.endpoint("launchtest.echo.generate").client()
        assert proc.instance_id in client.instance_ids()
        assert proc.ready_line == ""
        items = [item async for item in client.direct({"text": "a b"}, proc.instance_id)]
        assert items
        await proc.stop()
        assert await group_gone(proc.pid)
    finally:
        await runtime.shutdown()


async def test_bad_arguments_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no_such\.py not found"):
        await launch("components/no_such.py")
    with pytest.raises(ConfigError, match="needs runtime="):
        await launch(CHATTY, instance="a.b.c")
    with pytest.raises(ConfigError, match=r"not a \.py file"):
        await launch("no-such-binary-anywhere")
    assert launched() == []


async def test_relative_components_are_found_from_the_notebooks_folder(tmp_path: Path) -> None:
    proc = await launch(
        "components/echo_worker.py", cwd=ROOT / "notebooks", log_dir=tmp_path, show_logs=False
    )
    assert proc.command[2] == str(ECHO_WORKER) and proc.ready_line.startswith("READY dynamo.echo.generate")
    await proc.stop()


EXITING_SCRIPT = """
import asyncio
import dynamo_nb

async def main():
    proc = await dynamo_nb.launch({chatty!r}, "--grandchild", "--ready-after", "0",
                                  show_logs=False)
    print(proc.pid, proc.logs()[0].split()[1], flush=True)
    # no stop(): the exit clean-up must take the group down (the grandchild ignores SIGTERM)

asyncio.run(main())
"""


async def test_launched_programs_stop_when_the_interpreter_exits(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(EXITING_SCRIPT.format(chatty=str(CHATTY)))
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    pid, grandchild = map(int, result.stdout.split())
    assert await group_gone(pid) and await pid_gone(grandchild)


async def test_parent_death_signal_stops_a_well_behaved_component(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, os
            import dynamo_nb

            async def main():
                proc = await dynamo_nb.launch({str(ECHO_WORKER)!r}, show_logs=False)
                print(proc.pid, flush=True)
                os.kill(os.getpid(), 9)

            asyncio.run(main())
            """
        )
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert await group_gone(int(result.stdout.split()[0]))


def test_the_package_exports_the_launcher() -> None:
    assert dynamo_nb.launch is launch and dynamo_nb.ManagedProcess.__module__ == "dynamo_nb"
    assert issubclass(LaunchError, dynamo_nb.errors.ProcessStartError)


def test_in_a_kernel_logs_go_to_a_widget_and_shutdown_stops_the_group() -> None:
    """A real kernel: the log widget is displayed and filled; a kernel shutdown stops what it launched."""
    import jupyter_client

    manager, kernel = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        messages: list[dict] = []
        cell = (
            "import dynamo_nb\n"
            f"proc = await dynamo_nb.launch({str(CHATTY)!r}, '--grandchild', '--ready-after', '0', '--lines', '3')\n"
            "print(proc.pid, proc.logs()[0].split()[1])"
        )
        reply = kernel.execute_interactive(cell, timeout=60, output_hook=messages.append)
        assert reply["content"]["status"] == "ok", messages
        printed = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
        pid, grandchild = map(int, printed.split())
        shown = [m for m in messages if m["msg_type"] == "display_data"]
        assert any("application/vnd.jupyter.widget-view+json" in m["content"]["data"] for m in shown)
        states = [str(m["content"]["data"].get("state", {})) for m in messages if m["msg_type"] == "comm_msg"]
        assert any("line 2" in state and "READY chatty" in state for state in states)
        assert any("ready after" in state for state in states)  # the title says it is ready
        kernel.stop_channels()
        manager.shutdown_kernel(now=False)  # a shutdown request: the kernel exits normally
    finally:
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
    assert asyncio.run(group_gone(pid)) and asyncio.run(pid_gone(grandchild))


def test_a_program_runs_with_the_collector_tuned_for_serving() -> None:
    """`run_program` freezes start-up's objects out of the cyclic collector and collects the young
    generation less often; ``DYN_NB_GC=default`` keeps Python's settings."""
    program = textwrap.dedent(
        """
        import gc
        from dynamo_nb.runtime.program import run_program

        async def main():
            print(gc.get_threshold(), gc.get_freeze_count() > 0)
            return 0

        run_program(main)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "DYN_NB_GC"}
    tuned = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60
    )
    assert tuned.stdout.strip() == "(10000, 50, 100) True", tuned.stderr
    plain = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**env, "DYN_NB_GC": "default"},
        timeout=60,
    )
    assert plain.stdout.strip() == f"{gc_defaults()} False", plain.stderr


def gc_defaults() -> tuple[int, int, int]:
    """Python's own thresholds, read in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", "import gc; print(tuple(gc.get_threshold()))"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return tuple(int(n) for n in out.stdout.strip("()\n").split(","))  # type: ignore[return-value]


@pytest.mark.parametrize("launcher_ignores_sigint", [False, True], ids=["", "launcher-ignoring-sigint"])
async def test_a_launched_program_starts_with_the_signal_dispositions_of_a_terminal(
    tmp_path: Path, launcher_ignores_sigint: bool
) -> None:
    """SIGINT and SIGQUIT (which a kernel or a background job ignores) and SIGPIPE and SIGXFSZ
    (which every Python ignores, the launcher's wrapper too) are at their defaults in the program."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if launcher_ignores_sigint else None
    try:
        shell = await launch(
            "sh", "-c", "grep SigIgn /proc/$$/status; echo READY; sleep 60", log_dir=tmp_path, show_logs=False
        )
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
    try:
        [line] = [line for line in shell.logs() if line.startswith("SigIgn:")]
        ignored = int(line.split()[1], 16)
        for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
            assert not ignored & (1 << (signum - 1)), (signal.Signals(signum).name, line)
    finally:
        await shell.stop()


def test_the_browser_check_of_log_boxes_fails_on_a_status_that_disagrees() -> None:
    """What the browser test applies to the page after Run All: a killed process shown ``closed``
    (the launcher read its status before it was reaped), a running one shown as exited and a stopped
    one shown as exited all fail; the true titles pass."""
    from logbox_check import log_box_disagreements

    page = "prefill · pid 11 · closed\ndecode · pid 12 · host h1 · exited 0\nfront · pid 13 · exited 0\n"
    ends = {11: "exited -9", 12: None, 13: "stopped"}
    assert log_box_disagreements(page, ends) == [
        "pid 11's log box says 'closed', the process exited -9",
        "pid 12's log box says 'exited 0', the process still runs",
        "pid 13's log box says 'exited 0', the process stopped",
    ]
    truthful = "prefill · pid 11 · exited -9\ndecode · pid 12 · host h1 · ready after 1.2 s\nfront · pid 13 · stopped\n"
    assert log_box_disagreements(truthful, ends) == []
    assert log_box_disagreements("old · pid 99 · closed\n", ends) == []  # a pid not known is not judged

"""The mpiexec command ``mnify run`` builds, for Open MPI and MPICH, without launching anything."""

from __future__ import annotations

import pytest

from mnify.environment import LaunchWiring
from mnify.launch.command import LaunchSpec, build_command
from mnify.launch.mpiexec import MpiExec, parse_version_banner

OMPI = MpiExec("/opt/ompi/bin/mpiexec", "openmpi", "5.0.11", "mpiexec (Open MPI) 5.0.11")
MPICH = MpiExec("/opt/mpich/bin/mpiexec", "mpich", "4.1.2", "HYDRA build details:")
ENV = {
    "HOME": "/root",
    "MNIFY_DEBUG": "1",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "OTHER": "x",
    "MNIFY_HOSTNAME": "fake0",  # per host: never forwarded
}


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {"nprocs": 4, "script": "train.py", "script_args": ["--epoch", "1"]}
    base.update(kw)
    return LaunchSpec(python="/venv/bin/python", **base)  # type: ignore[arg-type]


def test_openmpi_one_host_oversubscribes_only_beyond_the_cores() -> None:
    many = build_command(spec(nprocs=4), OMPI, ENV, cores=2, is_root=False)
    few = build_command(spec(nprocs=2), OMPI, ENV, cores=2, is_root=False)
    assert "--oversubscribe" in many.argv
    assert "--oversubscribe" not in few.argv
    assert many.argv[-8:] == [
        "-n", "4", "/venv/bin/python", "-m", "mnify.launch.bootstrap",
        "train.py", "--epoch", "1",
    ]  # fmt: skip
    assert many.argv[:2] == [OMPI.path, "--tag-output"]


@pytest.mark.parametrize("hosts", [{"hostfile": "hosts.txt"}, {"hosts": "node1:4,node2:4"}])
def test_never_oversubscribes_with_a_hostfile_or_host_list(hosts: dict[str, str]) -> None:
    cmd = build_command(spec(nprocs=64, **hosts), OMPI, ENV, cores=2, is_root=False)
    assert "--oversubscribe" not in cmd.argv
    if "hostfile" in hosts:
        assert cmd.argv[cmd.argv.index("--hostfile") + 1] == "hosts.txt"
    else:
        assert cmd.argv[cmd.argv.index("--host") + 1] == "node1:4,node2:4"


def test_root_is_allowed_through_the_environment_for_open_mpi_only() -> None:
    as_root = build_command(spec(), OMPI, ENV, cores=8, is_root=True)
    as_user = build_command(spec(), OMPI, ENV, cores=8, is_root=False)
    mpich_root = build_command(spec(), MPICH, ENV, cores=8, is_root=True)
    assert as_root.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert as_root.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in as_user.env
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in mpich_root.env
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in as_root.forwarded


def test_open_mpi_forwards_mnify_cuda_and_watchdog_variables_with_x() -> None:
    cmd = build_command(spec(watchdog=30), OMPI, ENV, cores=8, is_root=False)
    assert cmd.env["MNIFY_WATCHDOG_TIMEOUT"] == "30"
    exported = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv) if a == "-x"]
    assert set(exported) == {
        "CUDA_VISIBLE_DEVICES", "MNIFY_DEBUG", "MNIFY_WATCHDOG_TIMEOUT",
    }  # fmt: skip
    assert "OTHER" not in exported and "HOME" not in exported


@pytest.mark.parametrize("mpiexec", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_rank_tags_can_be_left_out(mpiexec: MpiExec) -> None:
    tagged = build_command(spec(), mpiexec, ENV, cores=8, is_root=False).argv
    untagged = build_command(spec(tag_ranks=False), mpiexec, ENV, cores=8, is_root=False).argv
    assert set(tagged) - set(untagged) == {"--tag-output" if mpiexec is OMPI else "-prepend-rank"}


def test_mpich_uses_hydra_flags() -> None:
    cmd = build_command(
        spec(nprocs=8, hostfile="hf", watchdog=5), MPICH, ENV, cores=2, is_root=False
    )
    argv = cmd.argv
    assert "-prepend-rank" in argv and "--tag-output" not in argv
    assert argv[argv.index("-f") + 1] == "hf"
    assert "--oversubscribe" not in argv
    genv = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-genv"}
    assert genv["MNIFY_WATCHDOG_TIMEOUT"] == "5"
    assert genv["CUDA_VISIBLE_DEVICES"] == "0,1"
    hosts = build_command(spec(hosts="a:2,b:2"), MPICH, ENV, cores=2, is_root=False).argv
    assert hosts[hosts.index("-hosts") + 1] == "a:2,b:2"


def test_extra_mpi_args_and_exports_pass_through() -> None:
    cmd = build_command(
        spec(
            mpi_args=["--mca", "btl_tcp_if_include", "eth0", "--oversubscribe"],
            export=["LD_LIBRARY_PATH=/x y", "NOT_SET_ANYWHERE"],
        ),
        OMPI, ENV, cores=1, is_root=False,
    )  # fmt: skip
    argv = cmd.argv
    assert argv.count("--oversubscribe") == 1  # the user's, not a second one
    i = argv.index("--mca")
    assert argv[i : i + 3] == ["--mca", "btl_tcp_if_include", "eth0"]
    assert argv.index("--mca") < argv.index("-n")
    assert cmd.env["LD_LIBRARY_PATH"] == "/x y"
    assert "LD_LIBRARY_PATH" in cmd.forwarded
    assert "NOT_SET_ANYWHERE" not in cmd.forwarded
    assert any("NOT_SET_ANYWHERE" in note for note in cmd.notes)


def test_shell_text_is_quoted_and_reproduces_env_and_argv() -> None:
    cmd = build_command(
        spec(script_args=["--out", "my dir"], watchdog=2.5), OMPI, ENV, cores=8, is_root=True
    )
    text = cmd.shell_text()
    assert "export MNIFY_WATCHDOG_TIMEOUT=2.5" in text
    assert "export MNIFY_DEBUG=1" in text  # an inherited, forwarded value
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1" in text
    assert text.splitlines()[-1].endswith("train.py --out 'my dir'")


@pytest.mark.parametrize("mpiexec", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_the_launch_wiring_is_the_launchers_own_and_reaches_every_rank(mpiexec: MpiExec) -> None:
    """MNIFY_LAUNCH: never the caller's value; forwarded when the spec tells the ranks
    something; the runner's additions (the rank-state directory) reach MPICH's -genv too."""
    stale = {**ENV, "MNIFY_LAUNCH": '{"scale_updates": 9}'}
    plain = build_command(spec(), mpiexec, stale, cores=8, is_root=False)
    assert "MNIFY_LAUNCH" not in plain.forwarded and "MNIFY_LAUNCH" not in plain.shell_text()
    told = build_command(
        spec(wiring=LaunchWiring(verify_report=True)), mpiexec, stale, cores=8, is_root=False
    )
    assert "MNIFY_LAUNCH" in told.forwarded
    assert LaunchWiring.from_text(told.env["MNIFY_LAUNCH"]) == LaunchWiring(verify_report=True)
    here = LaunchWiring(verify_report=True, rank_state_dir="/tmp/state", rank_state_host="h0")
    running = told.with_wiring(here)
    assert LaunchWiring.from_text(running.full_env(stale)["MNIFY_LAUNCH"]) == here
    argv = running.argv
    genv = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-genv"}
    if mpiexec is MPICH:
        assert LaunchWiring.from_text(genv["MNIFY_LAUNCH"]) == here
    else:
        assert argv == told.argv and argv[argv.index("MNIFY_LAUNCH") - 1] == "-x"


def test_without_the_bootstrap_the_script_runs_unbuffered() -> None:
    cmd = build_command(spec(abort_on_error=False), OMPI, ENV, cores=8, is_root=False)
    assert cmd.argv[-5:] == ["/venv/bin/python", "-u", "train.py", "--epoch", "1"]
    assert "mnify.launch.bootstrap" not in cmd.argv


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError):
        build_command(spec(nprocs=0), OMPI, ENV, cores=2, is_root=False)
    with pytest.raises(ValueError):
        build_command(spec(hostfile="h", hosts="a:1"), OMPI, ENV, cores=2, is_root=False)


@pytest.mark.parametrize(
    ("banner", "flavor", "version"),
    [
        ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
         "openmpi", "5.0.11"),
        ("mpirun (Open MPI) 4.1.5\n", "openmpi", "4.1.5"),
        ("HYDRA build details:\n    Version:                                 4.1.2\n"
         "    Release Date:                            Wed Jun  7 15:22:45 CDT 2023\n",
         "mpich", "4.1.2"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n", "mpich", ""),
        ("something else 1.0\n", "unknown", ""),
    ],
)  # fmt: skip
def test_version_banner_tells_the_flavour(banner: str, flavor: str, version: str) -> None:
    assert parse_version_banner(banner) == (flavor, version)

"""Several hosts on one machine: network namespaces on a bridge, launched like a cluster over ssh.

A test bed of K hosts is K network namespaces, each joined to one Linux bridge by a veth pair and
given its own address on a private /24 (:data:`SUBNET`). The bridge carries no address in the root
namespace, so traffic between hosts never leaves these namespaces. ``mpiexec`` runs on the first
host and starts Open MPI's daemons on the others through ``scripts/testbed/agent.sh``, which Open
MPI calls instead of ssh; the agent enters the host's network namespace and a fresh UTS namespace
named after the host, so ``MPI.Get_processor_name()`` differs per host. TCP is restricted to the
bridge's subnet and shared memory is off (``btl tcp,self``, ``pml ob1``), so every byte between
ranks goes through a socket and every byte between hosts through that host's veth link, where it
can be counted (:meth:`TestBed.bytes_sent`), slowed (:meth:`TestBed.limit_rate`) or cut
(:meth:`TestBed.link_down`).

Every name starts with ``mnf<pid>`` of the process that built the bed; :func:`cleanup_stale`
removes the leftovers of processes that are gone (a killed test run), and :func:`testbed` always
tears its bed down, also when the test inside fails.

Command line (root), for trying things by hand::

    python testkit/testbed.py up 2 2     # two hosts with two slots each; prints how to use it
    python testkit/testbed.py down       # removes every test bed this machine has
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``testkit`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.ranks import REPO, RankRun, find_mpiexec, mpi_env

AGENT = REPO / "scripts" / "testbed" / "agent.sh"
PREFIX = "mnf"
SUBNET = "10.213.7.0/24"
"""Private addresses used only inside the test bed's namespaces (never assigned in the root one)."""
HOST_NAMES = "abcdefghijklmnopqrstuvwxyz"
KEEPALIVE_IDLE_S = 8
"""Seconds an idle daemon connection waits before keepalive probes (3 probes, 1 s apart)."""
TCP_RETRIES2 = 4
"""Retransmissions before a host's kernel drops an unanswered connection (about 6 s)."""
NETNS_DIR = Path("/run/netns")
STATE_ROOT = Path(tempfile.gettempdir()) / "mnify-testbed"


class TestBedUnavailable(RuntimeError):
    """The kernel refuses network or UTS namespaces here (no root, a locked-down container)."""


@dataclass(frozen=True)
class Host:
    """One simulated machine: its hostname, namespace, address and the root-side end of its link."""

    name: str
    netns: str
    address: str
    veth: str
    """The veth end in the root namespace, attached to the bridge: the host's network cable."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _require_tools() -> None:
    missing = [tool for tool in ("ip", "unshare", "tc", "hostname") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(
            f"the multi-host test bed needs {', '.join(missing)}: run scripts/install-testbed-deps.sh"
        )


def namespaces_refused() -> str | None:
    """Why this kernel/container refuses the namespaces the test bed needs, or None when it allows them.

    Missing tools are not a refusal: they raise, so a machine without iproute2 fails loudly
    instead of silently skipping the multi-host tests.
    """
    _require_tools()
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces, veth, bridge)"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"the kernel refuses network namespaces: ip netns add: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    uts = subprocess.run(
        ["unshare", "--uts", "--", "hostname", "mnfprobe"], capture_output=True, text=True
    )
    if uts.returncode != 0:
        return f"the kernel refuses UTS namespaces: unshare --uts: {uts.stderr.strip()}"
    bridge = f"{PREFIX}{os.getpid()}pb"
    made = _ip("link", "add", bridge, "type", "bridge", check=False)
    if made.returncode != 0:
        return f"the kernel refuses bridges: ip link add type bridge: {made.stderr.strip()}"
    _ip("link", "delete", bridge, check=False)
    return None


def _owner_pid(name: str) -> int | None:
    """The pid encoded in a test bed name (``mnf<pid>...``), or None for names that are not ours."""
    if not name.startswith(PREFIX):
        return None
    digits = ""
    for ch in name[len(PREFIX) :]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL everything running inside a namespace (ranks, Open MPI daemons, agents)."""
    for _ in range(5):
        listed = _ip("netns", "pids", netns, check=False)
        pids = [int(p) for p in listed.stdout.split() if p.strip().isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _our_netns() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip().startswith(PREFIX)]


def _our_links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(PREFIX):
                names.append(name)
    return names


def cleanup_stale(everything: bool = False) -> list[str]:
    """Delete test bed namespaces and links whose owning process is gone (all of them if asked).

    Returns the names removed. Beds of live processes (another test run) are left alone.
    """
    removed: list[str] = []
    for netns in _our_netns():
        owner = _owner_pid(netns)
        if everything or owner is None or not _alive(owner):
            _kill_netns_processes(netns)
            _ip("netns", "delete", netns, check=False)
            removed.append(netns)
    for link in _our_links():
        owner = _owner_pid(link)
        if everything or owner is None or not _alive(owner):
            _ip("link", "delete", link, check=False)
            removed.append(link)
    if STATE_ROOT.exists():
        for state in STATE_ROOT.iterdir():
            owner = _owner_pid(state.name)
            if everything or owner is None or not _alive(owner):
                shutil.rmtree(state, ignore_errors=True)
    return removed


@dataclass
class RankJob:
    """A job started on the test bed and still running: faults are injected while it trains."""

    cmd: list[str]
    proc: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    bed: TestBed
    started: float = field(default_factory=time.monotonic)

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(
            errors="replace"
        )

    def wait_for(self, text: str, timeout: float) -> None:
        """Block until ``text`` appears in the job's output; raise with the output if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{text!r} never appeared in the job's output "
            f"({'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'running'})"
            f"\n{self.output()}"
        )

    def wait(self, timeout: float) -> RankRun:
        """The finished job; past ``timeout`` it is killed (every process on every host)."""
        try:
            self.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            self.kill()
            timed_out = True
        return RankRun(
            self.cmd,
            -9 if timed_out else self.proc.returncode,
            self.stdout_path.read_text(errors="replace"),
            self.stderr_path.read_text(errors="replace"),
            timed_out=timed_out,
        )

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for host in self.bed.hosts:
            _kill_netns_processes(host.netns)
        self.proc.wait()


@dataclass
class TestBed:
    """K hosts on one bridge; launches MPI jobs across them and injects network faults."""

    name: str
    hosts: list[Host]
    bridge: str
    state_dir: Path
    intra_host_shm: bool = False
    """Let ranks on the same host use shared memory (``btl sm``), as on a real node. Off by
    default so even same-host traffic goes through sockets; ranks on different hosts never use
    it either way (Open MPI pairs only ranks its daemons report on one host)."""
    _jobs: int = 0

    __test__ = False  # not a pytest test class despite the name

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in test bed {self.name} ({[h.name for h in self.hosts]})")

    # -- launching ----------------------------------------------------------------------------

    def hostfile(self, slots: Sequence[int]) -> Path:
        """A hostfile giving the first ``len(slots)`` hosts these slot counts."""
        if len(slots) > len(self.hosts):
            raise ValueError(f"{len(slots)} hosts asked, test bed has {len(self.hosts)}")
        path = self.state_dir / ("hostfile-" + "-".join(str(s) for s in slots))
        path.write_text(
            "".join(f"{h.name} slots={s}\n" for h, s in zip(self.hosts, slots, strict=False))
        )
        return path

    def mpiexec_args(self) -> list[str]:
        """Open MPI flags that make the launch go through the agent and the bridge, like a cluster.

        ``btl tcp,self`` and ``pml ob1`` keep shared memory and UCX out, so ranks on different
        hosts can only talk through their veth links. All hosts share this machine's cores, so
        ranks are not bound (each host's daemon would pin its ranks to the same first cores) and
        waiting ranks yield the CPU instead of spinning: busy-polling ranks of two "hosts" on one
        core starve each other and turned a 0.8 s all-reduce into 15-60 s here.
        """
        return [
            "--bind-to",
            "none",
            "--mca",
            "mpi_yield_when_idle",
            "1",
            "--prtemca",
            "plm_ssh_agent",
            str(AGENT),
            "--prtemca",
            "oob_tcp_if_include",
            SUBNET,
            "--mca",
            "btl_tcp_if_include",
            SUBNET,
            "--mca",
            "btl",
            "tcp,sm,self" if self.intra_host_shm else "tcp,self",
            "--mca",
            "pml",
            "ob1",
            # Notice a daemon whose host dropped off the network in seconds, not minutes.
            *("--prtemca", "oob_tcp_keepalive_time", str(KEEPALIVE_IDLE_S)),
            *("--prtemca", "oob_tcp_keepalive_intvl", "1"),
            *("--prtemca", "oob_tcp_keepalive_probes", "3"),
        ]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The launch environment: the single-host one, less oversubscription, plus the bed's name."""
        env = mpi_env(extra)
        for key in list(env):
            if "oversubscribe" in key.lower() or key.startswith(("OMPI_MCA_btl", "OMPI_MCA_pml")):
                del env[key]
        env["MNIFY_TESTBED"] = self.name
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
        return env

    def launch_command(
        self,
        slots: Sequence[int],
        argv: Sequence[str],
        *,
        mpiexec_args: Sequence[str] = (),
        mpiexec: str | None = None,
    ) -> list[str]:
        """``agent --exec HOST0 mpiexec --hostfile ... -n N ARGV``: mpiexec runs on the first host."""
        return [
            str(AGENT),
            "--exec",
            self.hosts[0].name,
            mpiexec or find_mpiexec(),
            "--hostfile",
            str(self.hostfile(slots)),
            *self.mpiexec_args(),
            "--tag-output",
            *mpiexec_args,
            "-n",
            str(sum(slots)),
            *argv,
        ]

    def start(
        self,
        slots: Sequence[int],
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        mpiexec_args: Sequence[str] = (),
        command: Sequence[str] | None = None,
    ) -> RankJob:
        """Start ``argv`` on ``sum(slots)`` ranks placed by ``slots``; returns while it runs.

        ``command`` replaces the whole launch line (e.g. ``mnify run`` with the bed's flags); it
        still runs on the first host.
        """
        self._jobs += 1
        out = self.state_dir / f"job{self._jobs}.out"
        err = self.state_dir / f"job{self._jobs}.err"
        if command is None:
            cmd = self.launch_command(slots, argv, mpiexec_args=mpiexec_args)
        else:
            cmd = [str(AGENT), "--exec", self.hosts[0].name, *command]
        with out.open("wb") as fout, err.open("wb") as ferr:
            proc = subprocess.Popen(
                cmd,
                cwd=self.state_dir,
                env=self.env(env),
                stdout=fout,
                stderr=ferr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return RankJob(cmd, proc, out, err, self)

    def run(
        self,
        slots: Sequence[int],
        script: str | Path,
        args: Sequence[str] = (),
        *,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        check: bool = True,
        mpiexec_args: Sequence[str] = (),
    ) -> RankRun:
        """Run a Python script (a path, or source text) across the hosts and wait for it.

        Like :func:`testkit.ranks.run_ranks`, but ranks are placed by hostfile slots and
        never oversubscribed; ``check`` raises with every rank's output unless the job passed.
        """
        path = self.script_file(script)
        job = self.start(
            slots, [sys.executable, str(path), *args], env=env, mpiexec_args=mpiexec_args
        )
        result = job.wait(timeout)
        if check and (result.timed_out or result.returncode != 0):
            raise AssertionError(
                f"{sum(slots)}-rank run on hosts {self.describe(slots)} failed\n{result.describe()}"
            )
        return result

    def script_file(self, script: str | Path) -> Path:
        """A path for ``script``; source text is written into the bed's state directory."""
        if isinstance(script, str) and "\n" in script:
            import textwrap

            self._jobs += 1
            path = self.state_dir / f"script{self._jobs}.py"
            path.write_text(textwrap.dedent(script), encoding="utf-8")
            return path
        return Path(script).resolve()

    def describe(self, slots: Sequence[int]) -> str:
        return ", ".join(f"{h.name}x{s}" for h, s in zip(self.hosts, slots, strict=False))

    def on_host(
        self, host: str, argv: Sequence[str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run one command on one host (its network and hostname), outside MPI."""
        return subprocess.run(
            [str(AGENT), "--exec", host, *argv],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    # -- the network ------------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Pull the host's cable: its bridge-side veth goes down, packets to and from it drop."""
        _ip("link", "set", self.host(host).veth, "down")

    def link_up(self, host: str) -> None:
        _ip("link", "set", self.host(host).veth, "up")

    def limit_rate(
        self, rate: str = "1gbit", hosts: Sequence[str] | None = None, burst: str = "512kb"
    ) -> None:
        """Limit each host's link to ``rate`` in both directions with a token bucket (``tc tbf``)."""
        for host in [self.host(h) for h in hosts] if hosts else self.hosts:
            tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "100ms"]
            subprocess.run(["tc", "qdisc", "replace", "dev", host.veth, *tbf], check=True)
            subprocess.run(
                ["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", "eth0", *tbf],
                check=True,
            )

    def unlimit_rate(self) -> None:
        for host in self.hosts:
            subprocess.run(["tc", "qdisc", "del", "dev", host.veth, "root"], capture_output=True)
            subprocess.run(
                ["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                capture_output=True,
            )

    def bytes_sent(self, host: str) -> int:
        """Bytes the host has sent onto the bridge (its link's receive counter on the bridge side)."""
        return int(Path(f"/sys/class/net/{self.host(host).veth}/statistics/rx_bytes").read_text())

    def bytes_received(self, host: str) -> int:
        return int(Path(f"/sys/class/net/{self.host(host).veth}/statistics/tx_bytes").read_text())

    def pids(self, host: str) -> list[int]:
        """Processes running on a host (inside its network namespace)."""
        listed = _ip("netns", "pids", self.host(host).netns, check=False).stdout
        return [int(p) for p in listed.split() if p.strip().isdigit()]

    # -- lifetime --------------------------------------------------------------------------------

    def teardown(self) -> None:
        """Kill everything on the hosts, delete namespaces, links and the bridge. Idempotent."""
        for host in self.hosts:
            _kill_netns_processes(host.netns)
        for host in self.hosts:
            _ip("netns", "delete", host.netns, check=False)
            _ip("link", "delete", host.veth, check=False)
        _ip("link", "delete", self.bridge, check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _tune_tcp(netns: str) -> None:
    """Give up on an unanswered TCP connection after a few seconds (Linux default: ~15 minutes).

    When a host's link goes down after a rank has asked ``mpiexec`` to abort, ``mpiexec``'s kill
    order to that host's daemon sits unacknowledged; keepalives do not run while data is in
    flight, so only the retransmission limit ends the wait. The setting is per namespace: only
    the test bed's hosts get it.
    """
    write = f"echo {TCP_RETRIES2} > /proc/sys/net/ipv4/tcp_retries2"
    subprocess.run(
        ["ip", "netns", "exec", netns, "sh", "-c", write],
        check=True,
        capture_output=True,
        text=True,
    )


def build(n_hosts: int) -> TestBed:
    """Create ``n_hosts`` hosts (``mna``, ``mnb``, ...) on a fresh bridge; tear down on failure.

    Raises :class:`TestBedUnavailable` when the kernel refuses namespaces.
    """
    if not 1 <= n_hosts <= 26:
        raise ValueError("1..26 hosts")
    reason = namespaces_refused()
    if reason is not None:
        raise TestBedUnavailable(reason)
    cleanup_stale()
    # Names carry the owner's pid (for cleanup_stale) and a letter, so one process can hold several
    # beds; they must stay short: Linux interface names have at most 15 characters.
    taken = {ns.split("-", 1)[0] for ns in _our_netns()}
    free = [
        f"{PREFIX}{os.getpid()}{c}" for c in HOST_NAMES if f"{PREFIX}{os.getpid()}{c}" not in taken
    ]
    if not free:
        raise RuntimeError("26 test beds already exist in this process")
    name = free[0]
    base = SUBNET.rsplit(".", 1)[0]
    mask = SUBNET.rsplit("/", 1)[1]
    hosts = [
        Host(f"mn{HOST_NAMES[i]}", f"{name}-mn{HOST_NAMES[i]}", f"{base}.{i + 1}", f"{name}v{i}")
        for i in range(n_hosts)
    ]
    state_dir = STATE_ROOT / name
    state_dir.mkdir(parents=True, exist_ok=True)
    bed = TestBed(name, hosts, f"{name}br", state_dir)
    try:
        _ip("link", "add", bed.bridge, "type", "bridge")
        _ip("link", "set", bed.bridge, "up")
        for host in hosts:
            _ip("netns", "add", host.netns)
            _ip(
                "link",
                "add",
                host.veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            )
            _ip("link", "set", host.veth, "master", bed.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{mask}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _tune_tcp(host.netns)
    except subprocess.CalledProcessError as exc:
        bed.teardown()
        raise RuntimeError(f"building the test bed failed: {exc.cmd}: {exc.stderr}") from exc
    except BaseException:
        bed.teardown()
        raise
    return bed


@contextmanager
def testbed(n_hosts: int) -> Iterator[TestBed]:
    """A test bed of ``n_hosts`` hosts for the ``with`` block, always torn down afterwards."""
    bed = build(n_hosts)
    try:
        yield bed
    finally:
        bed.teardown()


testbed.__test__ = False  # type: ignore[attr-defined]


def _main(argv: list[str]) -> int:
    usage = "usage: testbed.py up SLOTS... | down"
    if not argv or argv[0] not in ("up", "down"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "down":
        for name in cleanup_stale(everything=True):
            print(f"removed {name}")
        return 0
    slots = [int(s) for s in argv[1:]] or [2, 2]
    bed = build(len(slots))
    # The bed outlives this process on purpose: `testbed.py down` removes it.
    hostfile = bed.hostfile(slots)
    flags = " ".join(bed.mpiexec_args())
    print(f"test bed {bed.name}: " + ", ".join(f"{h.name}={h.address}" for h in bed.hosts))
    print(
        f"export MNIFY_TESTBED={bed.name} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    )
    print(
        f"{AGENT} --exec {bed.hosts[0].name} {find_mpiexec()} --hostfile {hostfile} {flags} "
        f"-n {sum(slots)} {sys.executable} -c "
        "'from mpi4py import MPI; print(MPI.COMM_WORLD.rank, MPI.Get_processor_name())'"
    )
    mnify = Path(sys.executable).parent / "mnify"
    print(
        f"{AGENT} --exec {bed.hosts[0].name} {mnify} run -n {sum(slots)} --hostfile {hostfile} "
        f"--mpi-arg '{flags}' SCRIPT.py"
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

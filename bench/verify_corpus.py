"""Convert each corpus script (fixtures/corpus/scripts) and run it under ``mnify run -n 2
--verify`` with its tiny CPU arguments; print each run's category, batch and findings.

Run: ``PYTHONPATH=. .venv/bin/python bench/verify_corpus.py [NAME ...] [--work DIR]`` (as root
also ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``). Scripts that are already
distributed run as they are. A finding is either a converter defect or a false alarm of
--verify: read the script. Never part of the tests (about 20 s a script on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.corpus import load_corpus  # noqa: E402

MNIFY = str(Path(sys.executable).parent / "mnify")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    root = args.work or Path(tempfile.mkdtemp(prefix="mnify-verify-corpus-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for case in load_corpus():
        if args.names and case.name not in args.names:
            continue
        work = root / case.name
        (work / "inputs").mkdir(parents=True, exist_ok=True)
        case.make_inputs(work / "inputs")
        script = work / f"{case.name}_mn.py"
        if case.already_distributed:
            script.write_text(case.source, encoding="utf-8")
        else:
            made = subprocess.run(
                [MNIFY, "convert", str(case.path), "-o", str(script)],
                capture_output=True,
                text=True,
            )
            if made.returncode != 0:
                print(f"== {case.name}: convert failed\n{made.stderr[-400:]}")
                continue
        summary = work / "summary.json"
        began = time.monotonic()
        subprocess.run(
            [MNIFY, "run", "-n", "2", "--verify", "--summary-json", str(summary), str(script),
             *case.argv(work / "inputs")],
            capture_output=True, text=True, cwd=work, env=env, timeout=300,
        )  # fmt: skip
        data = json.loads(summary.read_text()) if summary.exists() else {}
        verify = data.get("verify", {})
        print(
            f"== {case.name}: {data.get('category')} exit {data.get('exit_status')} "
            f"({time.monotonic() - began:.0f} s), batch {verify.get('per_rank_batch')}",
            flush=True,
        )
        for f in verify.get("findings", []):
            print(f"   {f['check']} ranks {f['ranks']} at {f['where']}: {f['message']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert the whole realistic corpus (corpus scripts and projects, parity trees, converter
fixtures) and check each output: no statement lost or changed beyond a same-target
replacement, byte-identical under PYTHONMALLOC=malloc and another hash seed, and
`mnify lint --select MN301,MN302` finds nothing the input did not have.

    .venv/bin/python scripts/check_corpus.py
"""
import ast, json, os, subprocess, sys, collections
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mnify.converter import convert_sources

ROOT = REPO / "fixtures"
groups = []
for p in sorted((ROOT / "corpus/scripts").glob("*.py")):
    groups.append({str(p): p.read_text()})
for base in (ROOT / "corpus/projects", ROOT / "parity"):
    for d in sorted(x for x in base.iterdir() if x.is_dir()):
        groups.append({str(f): f.read_text() for f in sorted(d.rglob("*.py"))})
for p in sorted((ROOT / "convert").glob("*.in.py")):
    groups.append({str(p): p.read_text()})

def keys(tree):
    out = collections.Counter()
    for n in ast.walk(tree):
        if isinstance(n, ast.stmt) and not isinstance(n, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            if isinstance(n, ast.Assign):
                out["assign " + " ".join(ast.unparse(t) for t in n.targets)] += 1
            elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call):
                out["call " + ast.unparse(n.value.func)] += 1
            else:
                out[type(n).__name__ + " " + ast.unparse(n)[:80]] += 1
        elif isinstance(n, (ast.For, ast.While, ast.FunctionDef, ast.ClassDef, ast.With, ast.Try)):
            out[type(n).__name__ + " " + (getattr(n, "name", "") or "")] += 1
    return out

mode = sys.argv[1] if len(sys.argv) > 1 else "main"
if mode == "dump":
    res = []
    for g in groups:
        r = convert_sources(g)
        res.append({x.path: x.output for x in r})
    print(json.dumps(res))
    sys.exit()

results = []
problems = []
for g in groups:
    rs = convert_sources(g)
    out = {}
    for r in rs:
        if r.error:
            problems.append(f"{r.path}: error {r.error}")
        out[r.path] = r.output
        if r.output is None or r.output == r.source:
            continue
        a, b = keys(ast.parse(r.source)), keys(ast.parse(r.output))
        lost = a - b
        if lost:
            problems.append(f"{r.path}: lost/changed statements {dict(lost)}")
    results.append(out)
# determinism under malloc + hash seed
env = dict(os.environ, PYTHONMALLOC="malloc", PYTHONHASHSEED="4242")
other = json.loads(subprocess.run([sys.executable, __file__, "dump"], env=env, capture_output=True, text=True, check=True).stdout)
for mine, theirs in zip(results, other):
    for k in mine:
        if mine[k] != theirs[k]:
            problems.append(f"{k}: output differs under PYTHONMALLOC=malloc")
# lint MN301/MN302 before vs after, per tree via the CLI
import tempfile, shutil
mnify = str(Path(sys.executable).parent / "mnify")
def lint_tree(files):
    d = tempfile.mkdtemp()
    common = os.path.commonpath(list(files)) if len(files) > 1 else os.path.dirname(next(iter(files)))
    for p, text in files.items():
        t = Path(d) / os.path.relpath(p, common); t.parent.mkdir(parents=True, exist_ok=True); t.write_text(text)
    r = subprocess.run([mnify, "lint", "--select", "MN301,MN302", "--output-format", "json", "--exit-zero", d], capture_output=True, text=True)
    found = collections.Counter()
    for f in json.loads(r.stdout or "[]"):
        path = f.get("filename") or f.get("path")
        line = f.get("location", {}).get("row") or f.get("line")
        text = Path(path).read_text().splitlines()[line - 1].strip()
        found[(os.path.relpath(path, d), f.get("code"), text)] += 1
    shutil.rmtree(d)
    return found
new_total = 0
for g, out in zip(groups, results):
    before = lint_tree(g)
    after = lint_tree({p: (out[p] if out[p] is not None else g[p]) for p in g})
    new = after - before
    if new:
        new_total += sum(new.values())
        problems.append(f"new MN301/MN302: {dict(new)}")
n_files = sum(len(g) for g in groups)
changed = sum(1 for out, g in zip(results, groups) for p in g if out[p] not in (None, g[p]))
print(f"{len(groups)} conversions, {n_files} files, {changed} changed; problems: {len(problems)}")
for p in problems:
    print(" -", p)

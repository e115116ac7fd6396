#!/usr/bin/env bash
# The README's main job: convert the bundled single-GPU MNIST example, show the diff, write the
# converted script, and train it on 2 MPI ranks on CPU with tiny synthetic data.
#   bash scripts/demo.sh            (MNIFY_DEMO_DIR=DIR keeps the outputs in DIR)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bin="$root/.venv/bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work="${MNIFY_DEMO_DIR:-$(mktemp -d -t mnify-demo.XXXXXX)}"
mkdir -p "$work"
example="examples/mnist/train_mnist.py"

echo "== 1. mnify convert $example   (a diff for review; nothing is written)"
"$bin/mnify" convert "$example"

echo "== 2. mnify convert $example -o $work/train_mnist_mn.py --report $work/report.txt"
"$bin/mnify" convert "$example" -o "$work/train_mnist_mn.py" --report "$work/report.txt"

echo "== 3. mnify run -n 2: the converted script on 2 ranks (CPU, 256 random examples)"
cd "$work"
"$bin/mnify" run -n 2 train_mnist_mn.py \
  --device -1 --synthetic 256 --batchsize 32 --epoch 2 --unit 64 --noplot --out result

echo "== rank 0 alone wrote $work/result:"
ls "$work/result"

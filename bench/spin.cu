// A stand-in for backward's compute in bench/overlap_gpu.py: every block spins on the SM clock
// for `cycles` cycles (no cuBLAS needed), then thread 0 of block 0 stores one word so the
// compiler keeps the loop. Launched with one block per SM, it keeps the GPU busy the way a
// layer's kernels do, while the NCCL and pack kernels of the overlapped mean run beside it.
extern "C" __global__ void mnify_bench_spin(const long long cycles, int* sink) {
  const long long start = clock64();
  long long now = start;
  while (now - start < cycles) {
    now = clock64();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    sink[0] = (int)(now - start);
  }
}

// Per-channel statistics for batch normalisation over x shaped (N, C, S) (S = prod(spatial)),
// each element read once: sum(a) and sum(a*a) (forward), or sum(a) and sum(a*b) (backward:
// a = gy, b = x_hat), accumulated in float (float16/float32 input) or double.
//
// Stage 1 writes partial sums to `partial` laid out [2][parts][width]; stage 2 (on the host
// side, one CuPy reduction) adds the parts. Two layouts keep memory access coalesced:
//  - rows: for large S; block (channel, part) walks its slice of the channel's N*S elements
//    row segment by row segment (threads along contiguous S); width = C.
//  - cols: for small S (S == 1 after a linear layer); x viewed as (N, K = C*S), a 32x8 block
//    owns 32 neighbouring columns and a slice of rows; width = K, stage 2 also sums over S.

#include "common.cu"

template <typename Acc>
__device__ __forceinline__ void mn_block_sum2(Acc& x, Acc& y) {
  __shared__ Acc shx[32];
  __shared__ Acc shy[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  x = mn_warp_sum(x);
  y = mn_warp_sum(y);
  if (lane == 0) {
    shx[warp] = x;
    shy[warp] = y;
  }
  __syncthreads();
  const int n_warps = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    x = lane < n_warps ? shx[lane] : (Acc)0;
    y = lane < n_warps ? shy[lane] : (Acc)0;
    x = mn_warp_sum(x);
    y = mn_warp_sum(y);
  }
}

template <typename T, bool Two>
__global__ void mnify_channel_sums_rows(const T* __restrict__ a, const T* __restrict__ b,
                                        const long long n, const long long c,
                                        const long long s, const long long chunk,
                                        typename mn_acc<T>::type* __restrict__ partial) {
  typedef typename mn_acc<T>::type Acc;
  const long long ch = blockIdx.x;
  const long long part = blockIdx.y;
  const long long parts = gridDim.y;
  const long long total = n * s;
  long long m = part * chunk;
  const long long stop = m + chunk < total ? m + chunk : total;
  Acc acc1 = 0, acc2 = 0;
  while (m < stop) {
    const long long row = m / s;
    const long long col0 = m - row * s;
    const long long col1 = col0 + (stop - m) < s ? col0 + (stop - m) : s;
    const long long base = (row * c + ch) * s;
    for (long long j = col0 + threadIdx.x; j < col1; j += blockDim.x) {
      const Acc v = mn_load<Acc>(a[base + j]);
      acc1 += v;
      acc2 += Two ? v * mn_load<Acc>(b[base + j]) : v * v;
    }
    m += col1 - col0;
  }
  mn_block_sum2(acc1, acc2);
  if (threadIdx.x == 0) {
    partial[part * c + ch] = acc1;
    partial[(parts + part) * c + ch] = acc2;
  }
}

template <typename T, bool Two>
__global__ void mnify_channel_sums_cols(const T* __restrict__ a, const T* __restrict__ b,
                                        const long long n, const long long k,
                                        const long long rows_per_part,
                                        typename mn_acc<T>::type* __restrict__ partial) {
  typedef typename mn_acc<T>::type Acc;
  __shared__ Acc sh1[8][33];
  __shared__ Acc sh2[8][33];
  const long long col = (long long)blockIdx.x * 32 + threadIdx.x;
  const long long part = blockIdx.y;
  const long long parts = gridDim.y;
  const long long r0 = part * rows_per_part;
  const long long r1 = r0 + rows_per_part < n ? r0 + rows_per_part : n;
  Acc acc1 = 0, acc2 = 0;
  if (col < k) {
    for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
      const Acc v = mn_load<Acc>(a[r * k + col]);
      acc1 += v;
      acc2 += Two ? v * mn_load<Acc>(b[r * k + col]) : v * v;
    }
  }
  sh1[threadIdx.y][threadIdx.x] = acc1;
  sh2[threadIdx.y][threadIdx.x] = acc2;
  __syncthreads();
  if (threadIdx.y == 0 && col < k) {
    for (int y = 1; y < 8; ++y) {
      acc1 += sh1[y][threadIdx.x];
      acc2 += sh2[y][threadIdx.x];
    }
    partial[part * k + col] = acc1;
    partial[(parts + part) * k + col] = acc2;
  }
}

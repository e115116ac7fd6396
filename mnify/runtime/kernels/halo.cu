// Spatial parallelism: copy a block of rows between two C-contiguous tensors viewed as
// (outer, rows, inner) -- packing a halo (some rows of a slab into a contiguous send buffer) and
// unpacking it (received rows into place in the extended slab) are both this one copy.
//
// Element i of the block (outer o, row r, inner k) goes from src[(o * src_rows + src_start + r)
// * inner + k] to dst[(o * dst_rows + dst_start + r) * inner + k]. Threads stride over the block
// in order, so consecutive threads touch consecutive addresses of both arrays (rows of `inner`
// elements). Elements are moved as raw bits of their size: any dtype of 1, 2, 4 or 8 bytes.
#include "common.cu"

template <typename T, typename Index>
__global__ void mnify_halo_rows(const T* __restrict__ src, T* __restrict__ dst, const Index outer,
                                const Index src_rows, const Index src_start, const Index dst_rows,
                                const Index dst_start, const Index n_rows, const Index inner) {
  const Index per_outer = n_rows * inner;
  const Index total = outer * per_outer;
  for (Index i = (Index)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (Index)gridDim.x * blockDim.x) {
    const Index o = i / per_outer;
    const Index rest = i - o * per_outer;
    const Index r = rest / inner;
    const Index k = rest - r * inner;
    dst[(o * dst_rows + dst_start + r) * inner + k] = src[(o * src_rows + src_start + r) * inner + k];
  }
}

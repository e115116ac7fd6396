// Gradient buckets: every array of a bucket packed (or unpacked) by ONE kernel launch, with
// the dtype cast and the scale (1/size for a mean) fused into the copy.
//
// The host splits each array into tiles of `tile_elems` elements and passes a tile table
// (which array, where in it the tile begins); block b copies tile b, its threads striding over
// the tile so that reads and writes are coalesced. A full tile (MN_ITEMS per thread) is copied
// with all its loads issued first, which keeps enough bytes in flight to run near copy speed. Arrays are reached through a device table of
// raw pointers, so one launch serves any number of arrays of one dtype.
#include "common.cu"

// Elements per thread in a full tile (the host's tile is MN_ITEMS * blockDim.x elements).
#define MN_ITEMS 8

template <typename ArrT, typename BufT, bool ToBuffer>
__global__ void mnify_bucket_copy(const unsigned long long* __restrict__ array_ptrs,
                                  const long long* __restrict__ array_offsets,
                                  const long long* __restrict__ array_sizes,
                                  const int* __restrict__ tile_array,
                                  const long long* __restrict__ tile_begin,
                                  const long long n_tiles, const long long tile_elems,
                                  BufT* __restrict__ buffer, const double scale) {
  typedef typename mn_work<ArrT, BufT>::type W;
  const W s = (W)scale;
  for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const int a = tile_array[t];
    const long long begin = tile_begin[t];
    const long long size = array_sizes[a];
    const long long end = begin + tile_elems < size ? begin + tile_elems : size;
    ArrT* __restrict__ arr = reinterpret_cast<ArrT*>(array_ptrs[a]);
    BufT* __restrict__ buf = buffer + array_offsets[a];
    if (end - begin == (long long)MN_ITEMS * blockDim.x) {
      // full tile: issue every load before the first store, MN_ITEMS in flight per thread
      W vals[MN_ITEMS];
#pragma unroll
      for (int k = 0; k < MN_ITEMS; ++k) {
        const long long i = begin + threadIdx.x + (long long)k * blockDim.x;
        vals[k] = ToBuffer ? mn_load<W>(arr[i]) : mn_load<W>(buf[i]);
      }
#pragma unroll
      for (int k = 0; k < MN_ITEMS; ++k) {
        const long long i = begin + threadIdx.x + (long long)k * blockDim.x;
        if (ToBuffer) {
          buf[i] = mn_store<BufT>(vals[k] * s);
        } else {
          arr[i] = mn_store<ArrT>(vals[k] * s);
        }
      }
    } else {
      for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        if (ToBuffer) {
          buf[i] = mn_store<BufT>(mn_load<W>(arr[i]) * s);
        } else {
          arr[i] = mn_store<ArrT>(mn_load<W>(buf[i]) * s);
        }
      }
    }
  }
}

// Channel-parallel convolution's layout changes, one launch each way.
//
// An allgather leaves a rank-major buffer: rank r's block is its output (N, c_r, S), contiguous.
// Gather writes it into the full (N, sum c_r, S) tensor; split (for backward) does the inverse.
// The host passes, per full-tensor channel ch owned by rank r as its local channel j,
//   chan_base[ch]   = start of rank r's block + j * S
//   chan_stride[ch] = c_r * S   (distance between consecutive n inside that block)
// so the flat index of full element (n, ch, s) is chan_base[ch] + n * chan_stride[ch] + s.
// T is an unsigned integer of the element's size (the copy is dtype-agnostic); I is the index
// type (32-bit when the tensor is small enough, to keep the divisions cheap).

template <typename T, typename I, bool Gather>
__global__ void mnify_channel_blocks(const T* __restrict__ src, T* __restrict__ dst,
                                     const long long* __restrict__ chan_base,
                                     const long long* __restrict__ chan_stride, const I total,
                                     const I s, const I channels) {
  const I step = (I)blockDim.x * (I)gridDim.x;
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < total; i += step) {
    const I t = i / s;
    const I sp = i - t * s;
    const I nn = t / channels;
    const I ch = t - nn * channels;
    const long long f = chan_base[ch] + (long long)nn * chan_stride[ch] + (long long)sp;
    if (Gather) {
      dst[i] = src[f];
    } else {
      dst[f] = src[i];
    }
  }
}

// Device helpers shared by mnify's kernels (included by the other .cu files; no kernels here).
//
// Everything is header-free on purpose: CuPy compiles these sources with NVRTC, which on a
// pip-installed CuPy may have no CUDA toolkit headers (no cuda_fp16.h, no <cstdint>), and
// nvcc compiles them in CI. float16 is therefore carried as raw bits in `mn_half` and
// converted with PTX `cvt`, exactly as the hardware rounds (round-to-nearest-even).
#ifndef MNIFY_COMMON_CU
#define MNIFY_COMMON_CU

struct __align__(2) mn_half {
  unsigned short bits;
};

// The type arithmetic is done in: double when either side is double, float otherwise
// (float16 never computes in float16). The numpy twins use the same rule (host.scale_dtype).
template <typename A, typename B> struct mn_work { typedef float type; };
template <typename B> struct mn_work<double, B> { typedef double type; };
template <typename A> struct mn_work<A, double> { typedef double type; };
template <> struct mn_work<double, double> { typedef double type; };

// The type per-channel statistics accumulate in: float for float16/float32, double for double.
template <typename T> struct mn_acc { typedef float type; };
template <> struct mn_acc<double> { typedef double type; };

#ifndef MNIFY_HOST_EMULATION
__device__ __forceinline__ float mn_half_to_float(mn_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}

__device__ __forceinline__ mn_half mn_float_to_half(float f) {
  mn_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

__device__ __forceinline__ mn_half mn_double_to_half(double d) {
  mn_half h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
  return h;
}
#else
// tests/kernels runs pack.cu and channels.cu on the CPU (g++, one thread at a time); there the
// conversions use the compiler's IEEE binary16, which rounds like cvt.rn.
__device__ __forceinline__ float mn_half_to_float(mn_half h) {
  _Float16 v;
  __builtin_memcpy(&v, &h.bits, 2);
  return (float)v;
}

__device__ __forceinline__ mn_half mn_float_to_half(float f) {
  const _Float16 v = (_Float16)f;
  mn_half h;
  __builtin_memcpy(&h.bits, &v, 2);
  return h;
}

__device__ __forceinline__ mn_half mn_double_to_half(double d) {
  const _Float16 v = (_Float16)d;
  mn_half h;
  __builtin_memcpy(&h.bits, &v, 2);
  return h;
}
#endif

// to work type W from a stored value
template <typename W> __device__ __forceinline__ W mn_load(float v) { return (W)v; }
template <typename W> __device__ __forceinline__ W mn_load(double v) { return (W)v; }
template <typename W> __device__ __forceinline__ W mn_load(mn_half v) {
  return (W)mn_half_to_float(v);
}

// from work type to a stored value (one rounding)
template <typename T> __device__ __forceinline__ T mn_store(float v) { return (T)v; }
template <typename T> __device__ __forceinline__ T mn_store(double v) { return (T)v; }
template <> __device__ __forceinline__ mn_half mn_store<mn_half>(float v) {
  return mn_float_to_half(v);
}
template <> __device__ __forceinline__ mn_half mn_store<mn_half>(double v) {
  return mn_double_to_half(v);
}

// Sum of v over a warp, result valid in lane 0.
template <typename Acc> __device__ __forceinline__ Acc mn_warp_sum(Acc v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

#endif  // MNIFY_COMMON_CU

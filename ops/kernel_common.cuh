// Shared by every kernel file: host+device inlining and the grid-stride loop.
#pragma once

#define FL_HD __host__ __device__ __forceinline__

#define FL_FOR_EACH_INDEX(i, n)                                                          \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (long long)blockDim.x * gridDim.x)

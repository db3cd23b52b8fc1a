// Marks a function as callable from CUDA kernels too, when a CUDA compiler reads the header (an
// annotation, no logic): the arithmetic the CPU and the kernels must share, written once.
#pragma once

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__
#else
#define FS_HOST_DEVICE
#endif

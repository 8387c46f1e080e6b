// NaN-propagating scalar rules (PyTorch's), shared by the pointwise and activation kernels:
// max/min take the first operand on a tie and give NaN if either operand is NaN; relu keeps NaN
// (sim twins: tl_spec::ops::elementwise::{max1, min1, relu1}).
#pragma once

__device__ __forceinline__ float tl_max_f(float a, float b) { return a >= b || a != a ? a : b; }
__device__ __forceinline__ float tl_min_f(float a, float b) { return a <= b || a != a ? a : b; }
__device__ __forceinline__ float tl_relu_f(float v) { return v > 0.0f || v != v ? v : 0.0f; }
